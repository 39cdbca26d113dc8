"""The release rule on resampled counts (docs/science.md section 12): the strongest attack chosen honestly
(cross-fitting at the threshold it is measured at, the interval conditional on the choices), every attack's
judgement, and the three-way verdict (`llmaudit.analyze.decision.verdict`). Pure functions: count arrays in
(`llmaudit.analyze.decision.counts`), typed results out (`llmaudit.analyze.decision.models`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from llmaudit.analyze.decision.bounds import percentile_interval, proportion_bounds, z_value
from llmaudit.analyze.decision.counts import FP, NEG, POS, TP, ratio
from llmaudit.analyze.decision.exact import ExactResult
from llmaudit.analyze.decision.models import AttackJudgement, Estimate, QuantizerDecision, StrongestAttack
from llmaudit.analyze.decision.settings import DecisionSettings
from llmaudit.analyze.decision.verdict import none_if_nan, verdict

__all__ = ["CountArrays", "CrossFit", "DecisionSettings", "cross_fit", "decision_of", "judge_attacks"]


@dataclass
class CountArrays:
    """Resampled counts of one quantizer (row 0 observed): per attack at the empirical threshold an auditor who fixed
    it would measure it at [B + 1, A, 4]; per fold, what the attack is chosen on (train, observed data only [A, F, 4]) and
    what the chosen one is measured on (test [B + 1, A, F, 4]), read from different rows
    (`llmaudit.analyze.decision.pooled.calibrated_counts`, `llmaudit.analyze.decision.counts.empirical_counts`);
    with the attacks' names [A]."""

    attacks: list[str]
    per_attack: np.ndarray
    train: np.ndarray
    test: np.ndarray
    fold_kind: str
    per_attack_loose: np.ndarray | None = None
    """[B + 1, A, 4] at the looser threshold the PASS rule reads (calibrated mode; None: per_attack)."""

    def judged_only(self, names: list[str]) -> CountArrays:
        """Restrict the counts to some attacks.

        The cross-fitting chooses among the attacks that can be judged at the decision's FPR (enough non-members), never
        one whose TPR rests on too few of them.

        Args:
            names (list[str]): the attacks kept, each one of `self.attacks`.
        Returns:
            CountArrays: the same counts for those attacks only.
        """
        idx = [self.attacks.index(n) for n in names]
        loose = None if self.per_attack_loose is None else self.per_attack_loose[:, idx]
        return CountArrays(names, self.per_attack[:, idx], self.train[idx], self.test[:, idx], self.fold_kind, loose)

    def loose(self) -> np.ndarray:
        """Return the counts a PASS reads: at the looser threshold in calibrated mode, else `per_attack`'s.

        Returns:
            np.ndarray: [B + 1, A, 4] counts.
        """
        return self.per_attack if self.per_attack_loose is None else self.per_attack_loose


@dataclass(frozen=True)
class CrossFit:
    """The cross-fitted strongest attack: per fold the attack with the highest TPR where it is chosen (observed
    data), and that attack's fold counts summed over folds under every resample."""

    tpr: np.ndarray
    """[B + 1] pooled TPR of the chosen attacks."""
    fpr: np.ndarray
    """[B + 1] pooled realised FPR of the same rows."""
    picked: np.ndarray
    """[F] the attack chosen for each fold on the observed data (-1: no attack has members outside the fold)."""
    pooled: np.ndarray
    """[B + 1, 4] pooled counts."""


def cross_fit(train: np.ndarray, test: np.ndarray) -> CrossFit:
    """Choose the strongest attack on each fold's complement, measure it on the fold, and pool over folds.

    The choice made on the observed data (ties: the first attack in order) is applied to every resample, so that the
    resampled TPRs vary with the measurement, never with a choice that flips between resamples.

    Args:
        train (np.ndarray): [A, F, 4] what each attack is chosen on, per fold (observed data).
        test (np.ndarray): [B + 1, A, F, 4] what it is measured on; row 0 the observed data.
    Returns:
        CrossFit: the pooled TPR and realised FPR, the attack picked per fold and the pooled counts.
    """
    tpr_train = ratio(train[..., TP], train[..., POS])  # [A, F]
    key = np.where(np.isfinite(tpr_train), tpr_train, -np.inf)
    usable = np.isfinite(tpr_train).any(axis=0)  # [F]
    picked = np.where(usable, key.argmax(axis=0), -1)
    counts = test[:, np.maximum(picked, 0), np.arange(picked.size)] * usable[None, :, None]  # [B + 1, F, 4]
    pooled = counts.sum(axis=1)
    return CrossFit(ratio(pooled[:, TP], pooled[:, POS]), ratio(pooled[:, FP], pooled[:, NEG]), picked, pooled)


def _proportion(counts: np.ndarray, z: float, *, two_sided: bool, confidence: float, method: str) -> Estimate:
    """The proportion TP / POS of counts [B + 1, 4] with Wilson bounds at the bootstrap's effective sample size."""
    p = ratio(counts[:, TP], counts[:, POS])
    lo, hi = proportion_bounds(p[0], p[1:], counts[0, POS], z)
    return Estimate(
        value=none_if_nan(p[0]),
        low=none_if_nan(lo) if two_sided else None,
        high=none_if_nan(hi),
        confidence=confidence,
        method=method,
    )


def judge_attacks(arrays: CountArrays, s: DecisionSettings, unjudged: dict[str, str]) -> list[AttackJudgement]:
    """Judge each attack: its TPR with a simultaneous upper bound, and its TPR at the measuring threshold.

    The TPR at s.fpr at the threshold a PASS reads (the looser one in calibrated mode) gets a simultaneous
    one-sided upper bound (Wilson at the bootstrap's effective sample size, z = Phi^-1(1 - alpha / k), k the attacks
    judged: Bonferroni); the TPR at the empirical threshold of all its non-members a two-sided 1 - 2 alpha interval.
    An attack is judged where it has 10 / FPR non-member scores.

    Args:
        arrays (CountArrays): the resampled counts.
        s (DecisionSettings): the rule's settings.
        unjudged (dict[str, str]): attack -> why it could not be scored (listed as not judged).
    Returns:
        list[AttackJudgement]: one per attack, the scored ones first.
    """
    loose, measuring = arrays.loose(), arrays.per_attack
    tpr = ratio(loose[..., TP], loose[..., POS])
    judged = [
        i for i in range(len(arrays.attacks)) if loose[0, i, NEG] >= s.nonmembers_needed and np.isfinite(tpr[0, i])
    ]
    k = max(1, len(judged))
    out = []
    for i, name in enumerate(arrays.attacks):
        c = loose[0, i]
        upper = _proportion(
            loose[:, i], z_value(s.alpha / k), two_sided=False, confidence=1 - s.alpha / k,
            method="Wilson at the bootstrap's effective sample size, one-sided, simultaneous (Bonferroni)",
        )  # fmt: skip
        measured = _proportion(
            measuring[:, i], z_value(s.alpha), two_sided=True, confidence=1 - 2 * s.alpha,
            method="Wilson at the bootstrap's effective sample size; each end a one-sided 1 - alpha bound",
        )  # fmt: skip
        out.append(
            AttackJudgement(
                attack=name,
                tpr=upper,
                upper_bound=upper.high if i in judged else None,
                realised_fpr=none_if_nan(float(ratio(c[FP], c[NEG]))),
                members=float(c[POS]),
                nonmembers=float(c[NEG]),
                judged=i in judged,
                reason="" if i in judged else _why_not_judged(c, tpr[0, i], s.nonmembers_needed),
                measured=measured,
                measured_fpr=none_if_nan(float(ratio(measuring[0, i, FP], measuring[0, i, NEG]))),
            )
        )
    return out + [
        AttackJudgement(
            attack=name,
            tpr=Estimate(value=None),
            upper_bound=None,
            realised_fpr=None,
            members=0.0,
            nonmembers=0.0,
            judged=False,
            reason=why,
        )
        for name, why in unjudged.items()
    ]


def _why_not_judged(c: np.ndarray, tpr: float, need: int) -> str:
    if not math.isfinite(tpr):
        return "no member has a score at this FPR level"
    return f"{c[NEG]:.0f} non-member scores < {need} needed for a TPR at this FPR (10 / FPR)"


def _empty_strongest(arrays: CountArrays) -> StrongestAttack:
    return StrongestAttack(
        tpr=Estimate(value=None),
        realised_fpr=None,
        selected=[],
        folds=int(arrays.train.shape[1]),
        fold_kind=arrays.fold_kind,  # type: ignore[arg-type]
        selection_stability={},
        members=0.0,
        nonmembers=0.0,
    )


def strongest_attack(arrays: CountArrays, s: DecisionSettings) -> tuple[StrongestAttack, np.ndarray, np.ndarray]:
    """Measure the cross-fitted strongest attack (`cross_fit`) with its interval conditional on the choices.

    The interval is Wilson at the bootstrap's effective sample size, two-sided 1 - 2 alpha (its lower end the
    one-sided 1 - alpha bound a FAIL reads); leakage beyond chance (TPR minus realised FPR) gets a percentile
    interval.

    Args:
        arrays (CountArrays): the resampled counts of the judged attacks.
        s (DecisionSettings): the rule's settings.
    Returns:
        tuple[StrongestAttack, np.ndarray, np.ndarray]: the headline, and its resampled TPR and leakage beyond chance
        [B + 1] (what the paired comparison reads).
    """
    if not arrays.attacks:  # no attack can be judged: nothing to choose from
        nan = np.full(arrays.test.shape[0], np.nan)
        return _empty_strongest(arrays), nan, nan
    cf = cross_fit(arrays.train, arrays.test)
    lo, hi = proportion_bounds(cf.tpr[0], cf.tpr[1:], cf.pooled[0, POS], z_value(s.alpha))
    excess = cf.tpr - cf.fpr
    ex_lo, ex_hi = percentile_interval(excess[1:], s.alpha, 1 - s.alpha)
    freq = Counter(arrays.attacks[i] for i in cf.picked if i >= 0)
    total = sum(freq.values()) or 1
    result = StrongestAttack(
        tpr=Estimate(
            value=none_if_nan(cf.tpr[0]),
            low=none_if_nan(lo),
            high=none_if_nan(hi),
            confidence=1 - 2 * s.alpha,
            method="cross-fitted, classes crossed over folds of samples; Wilson at the effective sample size of the bootstrap "
            "conditional on the observed choices; each end a one-sided 1 - alpha bound (the lower one is what FAIL "
            "reads)",
        ),
        realised_fpr=none_if_nan(cf.fpr[0]),
        selected=[arrays.attacks[i] if i >= 0 else None for i in cf.picked],
        folds=int(arrays.train.shape[1]),
        fold_kind=arrays.fold_kind,  # type: ignore[arg-type]
        selection_stability={k: v / total for k, v in freq.most_common()},
        members=float(cf.pooled[0, POS]),
        nonmembers=float(cf.pooled[0, NEG]),
        excess=Estimate(
            value=none_if_nan(excess[0]),
            low=none_if_nan(ex_lo),
            high=none_if_nan(ex_hi),
            confidence=1 - 2 * s.alpha,
            method="TPR minus realised FPR of the same rows; percentile bootstrap conditional on the choices",
        ),
    )
    return result, cf.tpr, excess


def exact_strongest(result: ExactResult, s: DecisionSettings) -> StrongestAttack:
    """Write the exact test's reading (`llmaudit.analyze.decision.exact`) as the rule's headline.

    The TPR of the measurement split at the order-statistic threshold gets its one-sided lower bound at 1 - alpha
    (threshold and bound together) and no upper bound (the threshold is chosen to hold the FPR, which makes the TPR
    low, never high).

    Args:
        result (ExactResult): the exact test's reading.
        s (DecisionSettings): the rule's settings.
    Returns:
        StrongestAttack: the headline, route "exact".
    """
    d = result.design
    return StrongestAttack(
        tpr=Estimate(
            value=result.tpr,
            low=result.lower,
            high=None,
            confidence=1 - s.alpha,
            method=f"exact: {result.hits} of {d.members} members above the {d.k}-th largest of {d.nonmembers} "
            f"non-members (P[threshold below the {1 - s.fpr:.0%} quantile] = {d.alpha_threshold:.4f}); "
            f"Clopper-Pearson lower bound at {1 - d.alpha_bound:.4f}",
        ),
        realised_fpr=result.realised_fpr,
        selected=[result.attack],
        folds=1,
        fold_kind="samples",
        selection_stability={result.attack: 1.0},
        members=float(d.members),
        nonmembers=float(d.nonmembers),
        route="exact",
    )


def decision_of(
    quantizer: str,
    arrays: CountArrays,
    s: DecisionSettings,
    unjudged: dict[str, str],
    n_targets: int,
    mode: str,
    exact: ExactResult | str | None = None,
) -> tuple[QuantizerDecision, np.ndarray, np.ndarray]:
    """Decide one quantizer on the attack criterion (the comparison is left empty: `decide` adds it).

    Args:
        quantizer (str): the quantizer's name.
        arrays (CountArrays): its resampled counts.
        s (DecisionSettings): the rule's settings.
        unjudged (dict[str, str]): attack -> why it could not be scored.
        n_targets (int): the target models M.
        mode (str): "calibrated" or "empirical".
        exact (ExactResult | str | None): the exact test's reading where no attack has the non-members the
            cross-fitted rule needs (it then gives the headline), or why it could not be made.
    Returns:
        tuple[QuantizerDecision, np.ndarray, np.ndarray]: the decision, and the headline's resampled TPR and
        leakage beyond chance [B + 1] (the paired comparison reads the second).
    """
    attacks = judge_attacks(arrays, s, unjudged)
    strongest, tpr, excess = strongest_attack(arrays.judged_only([a.attack for a in attacks if a.judged]), s)
    if isinstance(exact, ExactResult) and strongest.tpr.value is None:
        strongest = exact_strongest(exact, s)
    v = verdict(strongest, attacks, s, exact if isinstance(exact, str) else None)
    judged = [a for a in attacks if a.judged and a.tpr.value is not None]
    top = max(judged, key=lambda a: a.tpr.value, default=None)  # type: ignore[arg-type, return-value]
    decision = QuantizerDecision(
        quantizer=quantizer,
        mode=mode,  # type: ignore[arg-type]
        status=v.status,  # type: ignore[arg-type]
        reason=v.reason,
        limit=s.limit,
        fpr=s.fpr,
        strongest=strongest,
        in_sample_max=None
        if top is None
        else Estimate(
            value=top.tpr.value, method="maximum over attacks on the data it was chosen on: selection-biased upward"
        ),
        in_sample_max_attack=None if top is None else top.attack,
        attacks=attacks,
        comparison=None,
        size_needed=v.size,
        run_to_run_covered=n_targets >= 2,
        n_targets=n_targets,
        tests=v.tests,
    )
    return decision, tpr, excess
