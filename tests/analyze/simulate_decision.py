"""Audits with known truth for the release rule's simulations (docs/science.md section 12): correlated attacks whose
true TPR at 1% FPR is chosen, on per-sample calibrated scores pooled over several targets or on one target's raw
scores, and an anti-conservatively calibrated attack (its non-members spread wider than the N(0, 1) its
calibration assumes, so that the analytic threshold lets through more than 1% of them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from llmaudit.analyze.decision import DecisionSettings, QuantizerEvidence, decide

Z99 = float(stats.norm.ppf(0.99))


@dataclass(frozen=True)
class Miscalibrated:
    """An attack whose calibrated non-member scores are N(0, sd^2) with sd > 1 (realised FPR at the analytic 1%
    threshold 1 - Phi(z99 / sd): 3.7% at sd 1.3), and whose members are N(mu, s_m^2), chosen so that its TPR at the
    analytic threshold is `at_analytic` and its true TPR at 1% FPR (at its own 99% quantile sd z99) is `true_tpr`."""

    at_analytic: float
    true_tpr: float
    sd: float = 1.3

    def member_law(self) -> tuple[float, float]:
        a, b = stats.norm.isf(self.at_analytic), stats.norm.isf(self.true_tpr)  # (z99 - mu) / s_m, (sd z99 - mu) / s_m
        s_m = (self.sd * Z99 - Z99) / (b - a)
        return Z99 - a * s_m, s_m

    def scores(self, noise: np.ndarray, keep: np.ndarray) -> np.ndarray:
        mu, s_m = self.member_law()
        return np.where(keep, mu + s_m * noise, self.sd * noise)


def shift_for(tpr: float) -> float:
    """The member shift of a N(0, 1) calibrated score that gives TPR `tpr` at 1% FPR."""
    return Z99 - float(stats.norm.isf(tpr))


def calibrated(rng, tprs, *, miscalibrated: Miscalibrated | None = None, M=6, N=256, frac=0.25, rho=0.5, tau=0.3):
    """Per-sample calibrated scores of len(tprs) correlated attacks (names a0, a1, ...) with the given true TPRs at
    1% FPR, plus "mis" where `miscalibrated` is given: a non-member's score is N(0, 1) (a sample effect tau, an
    effect shared by the attacks rho); a member's is shifted (`shift_for`)."""
    keep = np.zeros((M, N), bool)
    for m in range(M):
        keep[m, rng.choice(N, int(frac * N), replace=False)] = True
    n_attacks = len(tprs) + (miscalibrated is not None)
    shared = np.sqrt(tau) * rng.normal(size=N) + np.sqrt(1 - tau) * rng.normal(size=(M, N))
    noise = [
        np.sqrt(rho) * shared
        + np.sqrt(1 - rho) * (np.sqrt(tau) * rng.normal(size=N) + np.sqrt(1 - tau) * rng.normal(size=(M, N)))
        for _ in range(n_attacks)
    ]
    scores = {f"a{a}": noise[a] + shift_for(t) * keep for a, t in enumerate(tprs)}
    if miscalibrated is not None:
        scores["mis"] = miscalibrated.scores(noise[-1], keep)
    return QuantizerEvidence("q", "calibrated", [str(i) for i in range(N)], keep, scores)


def empirical(rng, tprs, *, n_mem=600, n_non=1000, rho=0.5):
    """One target's raw scores of len(tprs) correlated attacks with the given true TPRs at 1% FPR."""
    N = n_mem + n_non
    keep = np.zeros((1, N), bool)
    keep[0, :n_mem] = True
    shared = rng.normal(size=(1, N))
    scores = {
        f"a{a}": np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.normal(size=(1, N)) + shift_for(t) * keep
        for a, t in enumerate(tprs)
    }
    return QuantizerEvidence("q", "empirical", [str(i) for i in range(N)], keep, scores)


def rates(make, reps: int, settings: DecisionSettings, seed: int = 0) -> dict:
    """Over `reps` simulated audits: the share of each status, the in-sample maximum above the limit ("old_fail":
    the rule before cross-fitting), the mean headline TPR and the mean measured TPR of each attack."""
    rng = np.random.default_rng(seed)
    out = {"PASS": 0.0, "FAIL": 0.0, "INCONCLUSIVE": 0.0, "NOT MEASURED": 0.0, "old_fail": 0.0, "headline": 0.0}
    measured: dict[str, float] = {}
    for _ in range(reps):
        d = decide({"q": make(rng)}, None, settings).per_quantizer["q"]
        out[d.status] += 1 / reps
        out["old_fail"] += (d.in_sample_max is not None and d.in_sample_max.value > settings.limit) / reps
        out["headline"] += (d.strongest.tpr.value or 0.0) / reps
        for a in d.attacks:
            m = getattr(a, "measured", None)  # absent from the rule's results before this field existed
            if m is not None and m.value is not None:
                measured[a.attack] = measured.get(a.attack, 0.0) + m.value / reps
    return out | {"measured": measured}
