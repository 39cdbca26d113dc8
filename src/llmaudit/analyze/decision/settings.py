"""The release rule's settings (docs/science.md section 12), read from the recipe's report section."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecisionSettings:
    """The release rule's settings (recipe keys in brackets; docs/science.md section 12)."""

    limit: float = 0.05
    """[report.max_tpr_at_1pct_fpr] the largest TPR at `fpr` a releasable quantizer may have."""
    fpr: float = 0.01
    """The false-positive rate the TPR is read at."""
    alpha: float = 0.05
    """[report.alpha] error rate of each decision: a false FAIL, a false PASS, a false MORE or LESS, a false SAME."""
    margin: float = 0.01
    """[report.equivalence_margin] a difference of leakage within +-margin of full precision counts as "the same"."""
    folds: int = 5
    """[report.selection_folds] cross-fitting folds of samples."""
    resamples: int = 1000
    """[report.decision_resamples] bootstrap resamples of samples behind every bound of the decision."""
    seed: int = 0
    """[attack.seed] seed of the resamples, of the sample folds and of the exact route's selection split."""
    min_runs: int = 5
    """[report.min_runs] target models needed for the per-sample calibrated mode (fewer: empirical thresholds)."""

    def check(self) -> None:
        """Raise ValueError on a setting outside its range.

        Raises:
            ValueError: naming the setting and its allowed range.
        """
        for name in ("fpr", "alpha"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"decision setting {name} must lie in (0, 1); got {getattr(self, name)}.")
        if not 0 <= self.limit <= 1:
            raise ValueError(f"decision setting limit must lie in [0, 1]; got {self.limit}.")
        if not 0 <= self.margin < 1 or self.folds < 2 or self.resamples < 50:
            raise ValueError("decision settings: margin in [0, 1), folds >= 2 and resamples >= 50 are required.")

    @property
    def nonmembers_needed(self) -> int:
        """Non-member scores an attack needs to be judged by the cross-fitted rule (and a PASS to be possible).

        10 / FPR, so that the TPR at the FPR rests on about 10 false positives.
        """
        return int(round(10 / self.fpr))
