"""What an attack's score builder reads (`AttackContext`): one quantizer's final checkpoints as [M runs, N samples]
matrices, the reference rows, the settings, and the scores of the other attacks (a combination reads its
components; each attack is built at most once per quantizer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.attacks.matrices import Target, base_rows, pivot, row_pairs
from llmaudit.analyze.attacks.registry import AttackUnavailable, attack_spec

NO_BASE = "no base-model rows (run == -1) on split 'pool'"
NO_MATCHED = (
    "no quantization-matched base: the base model was not scored under this quantizer "
    "(score.matched_base=true scores it; the reference quantizer's match is the base itself)"
)


@dataclass
class AttackContext:
    """One quantizer's attack inputs. settings: the `AttackRunSettings` (k, ref_models, statistic, lira_variance, ...);
    fpc_value: LiRA's finite population correction; base_q: the quantizer of the rows "base" means."""

    df: pd.DataFrame
    quantizer: str
    target: Target
    settings: Any
    fpc_value: float | None
    base_q: str | None
    info: dict = field(default_factory=dict)
    """What the builders used, recorded in the quantizer's block (e.g. RMIA's tuned coefficients)."""
    _scores: dict = field(default_factory=dict, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.base = base_rows(self.df, self.base_q, self.target.samples)
        self.matched = (
            base_rows(self.df, self.quantizer, self.target.samples) if self.quantizer != self.base_q else None
        )

    @property
    def base_loss(self) -> np.ndarray | None:
        """The base model's loss per sample.

        Returns:
            np.ndarray | None: [N] losses (NaN where the base did not score a sample), None without base rows.
        """
        return None if self.base is None else self.base["loss"].to_numpy(dtype=np.float64)

    def reference_rows(self, source: str) -> pd.DataFrame:
        """Return the base model's rows a reference attack compares with.

        Args:
            source (str): "base" (the reference unit) or "matched" (the base quantized like the target).
        Returns:
            pd.DataFrame: the rows, one per sample.
        Raises:
            AttackUnavailable: when those rows are absent.
        """
        rows = self.base if source == "base" else self.matched
        if rows is None:
            raise AttackUnavailable(NO_BASE if source == "base" else NO_MATCHED)
        return rows

    def cached(self, key: str, make):
        """Return a value shared between builders (e.g. token losses paired with a reference), made once.

        Args:
            key (str): the cache key.
            make (Callable[[], Any]): makes the value when it is not cached yet.
        Returns:
            Any: the cached value.
        """
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def paired_tokens(self, source: str) -> tuple[list, list, np.ndarray]:
        """Pair each target row's token losses with the reference row's of the same sample.

        Args:
            source (str): "base" or "matched" (`reference_rows`).
        Returns:
            tuple[list, list, np.ndarray]: (target token losses, reference token losses, usable) per target row.
        Raises:
            AttackUnavailable: when the reference rows are absent.
        """
        rows = self.reference_rows(source)
        return self.cached(f"pairs:{source}", lambda: row_pairs(self.target.rows, rows))

    def per_row(self, values: np.ndarray) -> np.ndarray:
        """Arrange per-target-row values as the [M, N] matrix of runs x samples.

        Args:
            values (np.ndarray): [rows] one value per row of `target.rows`.
        Returns:
            np.ndarray: [M, N] float64 matrix.
        """
        t = self.target
        return pivot(t.rows.assign(_value=values), "_value", t.runs, t.samples).astype(np.float64)

    def scores(self, name: str) -> np.ndarray:
        """Return the scores of an attack, built once per quantizer.

        Args:
            name (str): the attack's registered name.
        Returns:
            np.ndarray: [M, N] scores, higher = more likely a member.
        Raises:
            AttackUnavailable: with its reason, every time it is asked for an attack that cannot run.
        """
        if name not in self._scores:
            spec = attack_spec(name)
            try:
                why = spec.unavailable_columns(self.target.rows)
                if why is not None:
                    raise AttackUnavailable(why)
                self._scores[name] = np.asarray(spec.build(self), dtype=np.float64)
            except AttackUnavailable as exc:
                self._scores[name] = exc
        value = self._scores[name]
        if isinstance(value, AttackUnavailable):
            raise value
        return value
