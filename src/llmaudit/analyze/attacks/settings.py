"""How the attacks are run and evaluated: one typed, checked settings object (`AttackRunSettings`), built once by
the caller (`llmaudit attack`, the report's analysis) and passed down unchanged (docs/science.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from llmaudit.analyze.attacks.lira import lira_statistic, parse_fpc
from llmaudit.analyze.attacks.registry import (
    DefinitionSettings,
    attack_definitions,
    registered_attacks,
    resolve_attacks,
)
from llmaudit.analyze.metrics import DEFAULT_FPRS, T_CUTOFF

__all__ = ["REF_MODELS", "AttackRunSettings"]

REF_MODELS = ("runs", "base", "both")
"""What the reference attack compares with: the other runs' out-models, the base model, or both."""


@dataclass(frozen=True)
class AttackRunSettings:
    """How `run_attacks` attacks and evaluates, checked when built (recorded in every result as "settings").

    Args:
        attacks: the attacks to run, in this order; ("all",) is every registered attack (the default).
        fpc: LiRA's finite population correction: "auto" (1 - n_train / n_pool), "off" or None (none), or a
            number in (0, 1].
        n_boot: bootstrap resamples of every interval.
        seed: the seed of every resample.
        n_pool: the pool size N_+ the runs' training sets were drawn from (None: the pool samples in the table).
        n_train: the training set size per run (None: the mean number of members per run in the table).
        fprs: the FPR levels of the TPRs.
        k: min-k%'s fraction of tokens.
        ref_models: what the reference attack compares with (`REF_MODELS`).
        statistic: LiRA's statistic ("logit", ...; `lira.lira_statistic`).
        lira_variance: LiRA's variance, "per_sample" or "global".
        t_cutoff: below this many references the calibrated threshold is Student-t's.
        confidence: the level of every interval.

    Raises:
        ValueError: an unknown attack (naming the closest), a repeated attack, an unknown ref_models or statistic,
            or an fpc outside (0, 1].
    """

    attacks: tuple[str, ...] = field(default_factory=registered_attacks)
    fpc: str | float | None = "auto"
    n_boot: int = 1000
    seed: int = 0
    n_pool: int | None = None
    n_train: float | None = None
    fprs: tuple[float, ...] = DEFAULT_FPRS
    k: float = 0.2
    ref_models: str = "runs"
    statistic: str = "logit"
    lira_variance: str = "per_sample"
    t_cutoff: float = T_CUTOFF
    confidence: float = 0.95

    def __post_init__(self) -> None:
        object.__setattr__(self, "attacks", resolve_attacks(self.attacks))
        object.__setattr__(self, "fprs", tuple(self.fprs))
        if self.ref_models not in REF_MODELS:
            raise ValueError(f"ref_models must be one of {REF_MODELS}; got {self.ref_models!r}.")
        lira_statistic(np.ones(1), self.statistic)  # an unknown name: ValueError
        parse_fpc(self.fpc)

    def definitions(self, fpc_value: float | None = None) -> dict[str, str]:
        """The versioned definition of every registered attack under these settings.

        Args:
            fpc_value: the finite population correction a quantizer's LiRA used (None: none).

        Returns:
            {attack: definition}, with the per-sample calibration's under "calibration" (`attack_definitions`).
        """
        return attack_definitions(
            DefinitionSettings(self.k, self.ref_models, self.statistic, self.lira_variance, fpc_value, self.t_cutoff)
        )

    def as_dict(self) -> dict[str, Any]:
        """The settings as a result records them.

        Returns:
            Every field but the attacks (fprs as a list), with the checkpoint and split the attacks read.
        """
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "attacks"}
        out["fprs"] = list(self.fprs)
        return out | {"checkpoint": "final (max per run)", "split": "pool"}
