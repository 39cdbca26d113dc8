"""The attack registry: one spec per attack (docs/architecture.md, "Adding an attack").

An `AttackSpec` says what an attack is called, the version of its definition, the loss-table columns and the
reference models it reads, how its [M runs, N samples] membership scores are built from an `AttackContext`, and
the text that defines it in the report. `register` adds one; the evaluation (`evaluate.run_attacks`) loops over
the names asked for, the config's `attack.attacks` is checked against `registered_attacks()` when a recipe
loads, and every result records `attack_definitions` so that scores computed under different definitions are
never compared silently.

The attacks shipped with llmaudit register themselves in `llmaudit.analyze.attacks.catalog`, which the package
imports first; registration order is the default order of the attacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llmaudit.analyze.metrics import T_CUTOFF
from llmaudit.common.errors import did_you_mean

if TYPE_CHECKING:
    import numpy as np

ALL = "all"
"""In `attack.attacks`: every registered attack."""

REFERENCE_KINDS = ("runs", "base", "matched", "population")
"""What an attack may compare the target with: the other fine-tuning runs, the base model (the reference unit,
run -1), the base quantized like the target, or texts never trained on (split "val")."""


class AttackUnavailable(Exception):
    """An attack cannot run on this table; the message says why (recorded under "skipped")."""


@dataclass(frozen=True)
class DefinitionSettings:
    """The settings an attack's recorded definition depends on."""

    k: float = 0.2
    ref_models: str = "runs"
    statistic: str = "logit"
    lira_variance: str = "per_sample"
    fpc_value: float | None = None
    t_cutoff: float = T_CUTOFF

    @property
    def fpc_text(self) -> str:
        """The finite population correction as written in a definition.

        Returns:
            str: "none", or the value to 6 significant digits.
        """
        return "none" if self.fpc_value is None else f"{self.fpc_value:.6g}"


@dataclass(frozen=True)
class AttackSpec:
    """One attack. `build(ctx)` returns its [M, N] scores (higher = more likely a member; NaN where a sample cannot
    be scored) or raises `AttackUnavailable`; `parameters` is the definition's text after the version, a string
    or a function of the `DefinitionSettings`; `summary` defines the attack in words for the report."""

    name: str
    version: int
    build: Callable[[Any], np.ndarray]
    """The score builder: an `AttackContext` (analyze/attacks/context.py) -> [M, N] scores."""
    parameters: str | Callable[[DefinitionSettings], str]
    summary: str
    columns: tuple[str, ...] = ()
    """Loss-table columns it reads beyond sample_id, run, member, loss and token_losses."""
    references: tuple[str, ...] = ()
    """What it compares the target with (REFERENCE_KINDS)."""
    missing_columns: str | None = None
    """Why it cannot run when a column is absent (default: the columns named)."""

    def __post_init__(self) -> None:
        if not self.name or any(c.isspace() or c in "/\\,[]" for c in self.name):
            raise ValueError(f"attack name {self.name!r}: a non-empty name without spaces, slashes, commas or brackets")
        bad = sorted(set(self.references) - set(REFERENCE_KINDS))
        if bad:
            raise ValueError(f"attack {self.name!r}: unknown reference kind(s) {bad}; allowed: {REFERENCE_KINDS}")

    def definition(self, settings: DefinitionSettings) -> str:
        """Write the attack's versioned definition, "<version>:<parameters>".

        Args:
            settings (DefinitionSettings): the settings the parameters text depends on.
        Returns:
            str: the definition recorded with every result.
        """
        text = self.parameters if isinstance(self.parameters, str) else self.parameters(settings)
        return f"{self.version}:{text}"

    def unavailable_columns(self, rows: Any) -> str | None:
        """Say why the target rows do not allow this attack.

        Args:
            rows (pd.DataFrame): the target rows.
        Returns:
            str | None: the reason (a column it reads is absent or has a missing value in some row), None when they
            allow it.
        """
        if all(c in rows.columns and rows[c].notna().all() for c in self.columns):
            return None
        if self.missing_columns:
            return self.missing_columns
        return f"loss table has no {' / '.join(self.columns)} column{'s' if len(self.columns) > 1 else ''}"


_REGISTRY: dict[str, AttackSpec] = {}


def register(spec: AttackSpec, *, replace: bool = False) -> AttackSpec:
    """Add an attack after the ones registered before it.

    Args:
        spec (AttackSpec): the attack.
        replace (bool): allow replacing an attack of the same name.
    Returns:
        AttackSpec: `spec`.
    Raises:
        ValueError: when the name is registered already (and not `replace`) or is "all".
    """
    if spec.name in _REGISTRY and not replace:
        raise ValueError(f"attack {spec.name!r} is already registered")
    if spec.name == ALL:
        raise ValueError(f"{ALL!r} means every attack; name the attack otherwise")
    _REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    """Remove an attack (a test's own attack, when the test ends).

    Args:
        name (str): the attack's name; an unknown name is ignored.
    """
    _REGISTRY.pop(name, None)


def registered_attacks() -> tuple[str, ...]:
    """List every registered attack in registration order (the default order of results).

    Returns:
        tuple[str, ...]: the attack names.
    """
    return tuple(_REGISTRY)


def attack_spec(name: str) -> AttackSpec:
    """Look up a registered attack.

    Args:
        name (str): the attack's name.
    Returns:
        AttackSpec: its spec.
    Raises:
        ValueError: for an unknown name, naming the closest one (`unknown_attack`).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(unknown_attack(name)) from None


def unknown_attack(name: str) -> str:
    """Write the error message for an unknown attack name.

    Args:
        name (str): the name asked for.
    Returns:
        str: the message, with the closest registered name and the allowed ones.
    """
    names = registered_attacks()
    return f"unknown attack {name!r}{did_you_mean(name, names)}; allowed: {', '.join(names)}, {ALL}"


def resolve_attacks(names: Sequence[str]) -> tuple[str, ...]:
    """Resolve the attacks a list asks for ("all": every registered one).

    Args:
        names (Sequence[str]): attack names, or ("all",).
    Returns:
        tuple[str, ...]: the attack names, in the order asked for.
    Raises:
        ValueError: for an unknown name (naming the closest one) or a repeated one.
    """
    names = tuple(names)
    if names == (ALL,):
        return registered_attacks()
    for name in names:
        if name not in _REGISTRY:
            raise ValueError(unknown_attack(name))
    if len(set(names)) != len(names):
        raise ValueError(f"attacks repeat: {list(names)}")
    return names


def attack_definitions(settings: DefinitionSettings | None = None, **kw) -> dict[str, str]:
    """Write the versioned definition of every registered attack and of the per-sample calibration.

    The definitions are stored in each result, so that scores computed under different definitions are never
    compared silently.

    Args:
        settings (DefinitionSettings | None): the settings; when None they are built from `kw`.
        **kw: the fields of `DefinitionSettings` when `settings` is not given.
    Returns:
        dict[str, str]: {attack name or "calibration": definition}.
    """
    d = settings if settings is not None else DefinitionSettings(**kw)
    out = {name: spec.definition(d) for name, spec in _REGISTRY.items()}
    out["calibration"] = (
        f"3:per-sample-out-zscore,balanced_refs,zero_spread=pooled_sd,rounding_ties,fpc={d.fpc_text},"
        f"student_t_below={d.t_cutoff:g}"
    )
    return out
