"""The release rule on resampled counts (docs/science.md section 12): the strongest attack chosen honestly
(cross-fitting), the three-way verdict against the limit, the paired comparison with full precision, and what
would decide an open verdict. Pure functions: count arrays in (`llmaudit.analyze.decision.counts`), typed
results out (`llmaudit.analyze.decision.models`).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from llmaudit.analyze.decision.bounds import percentile_interval, proportion_bounds, samples_factor, z_value
from llmaudit.analyze.decision.counts import FP, NEG, POS, TP, ratio
from llmaudit.analyze.decision.models import (
    AttackJudgement,
    Comparison,
    Difference,
    Estimate,
    QuantizerDecision,
    SizeNeeded,
    StrongestAttack,
)


@dataclass(frozen=True)
class DecisionSettings:
    """The release rule's settings (recipe keys in brackets; docs/science.md section 12)."""

    limit: float = 0.05
    """[report.max_tpr_at_1pct_fpr] the largest TPR at `fpr` a releasable quantizer may have."""
    fpr: float = 0.01
    """The false-positive rate the TPR is read at."""
    alpha: float = 0.05
    """[report.alpha] one-sided error rate of each decision: a false FAIL, a false PASS, a false MORE / LESS / SAME."""
    margin: float = 0.01
    """[report.equivalence_margin] a TPR difference within +-margin of full precision counts as "the same"."""
    folds: int = 5
    """[report.selection_folds] cross-fitting folds (of target models; of samples with a single target)."""
    resamples: int = 1000
    """[report.decision_resamples] bootstrap resamples of samples behind every bound of the decision."""
    seed: int = 0
    """[attack.seed] seed of the resamples and of the sample folds."""
    min_runs: int = 5
    """[report.min_runs] target models needed for the per-sample calibrated mode (fewer: empirical thresholds)."""

    def check(self) -> None:
        for name in ("fpr", "alpha"):
            if not 0 < getattr(self, name) < 1:
                raise ValueError(f"decision setting {name} must lie in (0, 1); got {getattr(self, name)}.")
        if not 0 <= self.limit <= 1:
            raise ValueError(f"decision setting limit must lie in [0, 1]; got {self.limit}.")
        if not 0 <= self.margin < 1 or self.folds < 2 or self.resamples < 50:
            raise ValueError("decision settings: margin in [0, 1), folds >= 2 and resamples >= 50 are required.")


@dataclass
class CountArrays:
    """Resampled counts of one quantizer (row 0 observed): per attack [B + 1, A, 4]; per fold, for choosing the
    attack (train) and for measuring it (test) [B + 1, A, F, 4]; with the attacks' names [A]."""

    attacks: list[str]
    per_attack: np.ndarray
    train: np.ndarray
    test: np.ndarray
    fold_kind: str
    per_attack_loose: np.ndarray | None = None
    """[B + 1, A, 4] at the looser threshold the PASS rule reads (calibrated mode; None: per_attack)."""

    def judged_only(self, names: list[str]) -> CountArrays:
        """The same counts for the attacks in `names` only: the cross-fitting chooses among the attacks that can be
        judged at the decision's FPR (enough non-members), never one whose TPR rests on too few of them."""
        idx = [self.attacks.index(n) for n in names]
        loose = None if self.per_attack_loose is None else self.per_attack_loose[:, idx]
        return CountArrays(names, self.per_attack[:, idx], self.train[:, idx], self.test[:, idx], self.fold_kind, loose)

    def loose(self) -> np.ndarray:
        return self.per_attack if self.per_attack_loose is None else self.per_attack_loose


def cross_fit(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The strongest attack chosen on each fold's complement and measured on the fold, pooled over folds.

    train, test: [B + 1, A, F, 4]. Per resample and fold the attack with the highest TPR on `train` is picked
    (ties: the first in order; a fold where no attack has members is left out); its `test` counts are summed
    over folds. Returns (tpr [B + 1], realised fpr [B + 1], the picked attack index [B + 1, F] (-1 = none),
    pooled counts [B + 1, 4])."""
    tpr_train = ratio(train[..., TP], train[..., POS])
    key = np.where(np.isfinite(tpr_train), tpr_train, -np.inf)
    picked = key.argmax(axis=1)  # [B + 1, F]
    usable = np.isfinite(tpr_train).any(axis=1)
    counts = np.take_along_axis(test, picked[:, None, :, None], axis=1)[:, 0] * usable[..., None]
    pooled = counts.sum(axis=1)
    return (
        ratio(pooled[:, TP], pooled[:, POS]),
        ratio(pooled[:, FP], pooled[:, NEG]),
        np.where(usable, picked, -1),
        pooled,
    )


def _none_if_nan(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def judge_attacks(arrays: CountArrays, s: DecisionSettings, unjudged: dict[str, str]) -> list[AttackJudgement]:
    """Each attack's in-sample TPR at s.fpr (at the looser threshold in calibrated mode) with a simultaneous
    one-sided upper bound: Wilson at the bootstrap's effective sample size and z = Phi^-1(1 - alpha / k), k the
    number of attacks judged (Bonferroni), so that with probability >= 1 - alpha every judged attack's true TPR is
    below its bound."""
    counts = arrays.loose()
    tpr = ratio(counts[..., TP], counts[..., POS])  # [B + 1, A]
    need = 10 / s.fpr
    judged = [i for i, _ in enumerate(arrays.attacks) if counts[0, i, NEG] >= need and math.isfinite(tpr[0, i])]
    z = z_value(s.alpha / max(1, len(judged)))
    out = []
    for i, name in enumerate(arrays.attacks):
        c = counts[0, i]
        lo, hi = proportion_bounds(tpr[0, i], tpr[1:, i], c[POS], z)
        reason = "" if i in judged else _why_not_judged(c, tpr[0, i], need)
        out.append(
            AttackJudgement(
                attack=name,
                tpr=Estimate(
                    value=_none_if_nan(tpr[0, i]),
                    high=_none_if_nan(hi),
                    confidence=1 - s.alpha / max(1, len(judged)),
                    method="Wilson at the bootstrap's effective sample size, one-sided",
                ),
                upper_bound=_none_if_nan(hi) if i in judged else None,
                realised_fpr=_none_if_nan(float(ratio(c[FP], c[NEG]))),
                members=float(c[POS]),
                nonmembers=float(c[NEG]),
                judged=i in judged,
                reason=reason,
            )
        )
    for name, why in unjudged.items():
        out.append(
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
        )
    return out


def _why_not_judged(c: np.ndarray, tpr: float, need: float) -> str:
    if not math.isfinite(tpr):
        return "no member has a score at this FPR level"
    return f"{c[NEG]:.0f} non-member scores < {need:.0f} needed for a TPR at this FPR (10 / FPR)"


def strongest_attack(arrays: CountArrays, s: DecisionSettings) -> tuple[StrongestAttack, np.ndarray]:
    """The cross-fitted strongest attack (`cross_fit`) with a one-sided lower bound at 1 - alpha (Wilson at the
    bootstrap's effective sample size, the selection redone in every resample); and its resampled TPRs [B + 1]."""
    if not arrays.attacks:  # no attack can be judged: nothing to choose from
        empty = StrongestAttack(
            tpr=Estimate(value=None),
            realised_fpr=None,
            selected=[],
            folds=int(arrays.train.shape[2]),
            fold_kind=arrays.fold_kind,  # type: ignore[arg-type]
            selection_stability={},
            members=0.0,
            nonmembers=0.0,
        )
        return empty, np.full(arrays.train.shape[0], np.nan)
    tpr, fpr, picked, pooled = cross_fit(arrays.train, arrays.test)
    lo, hi = proportion_bounds(tpr[0], tpr[1:], pooled[0, POS], z_value(s.alpha))
    names = [arrays.attacks[i] if i >= 0 else None for i in picked[0]]
    freq = Counter(arrays.attacks[i] for row in picked[1:] for i in row if i >= 0)
    total = sum(freq.values()) or 1
    result = StrongestAttack(
        tpr=Estimate(
            value=_none_if_nan(tpr[0]),
            low=_none_if_nan(lo),
            high=_none_if_nan(hi),
            confidence=1 - 2 * s.alpha,
            method="cross-fitted; Wilson at the bootstrap's effective sample size (the lower end is the one-sided "
            "bound at 1 - alpha that FAIL reads)",
        ),
        realised_fpr=_none_if_nan(fpr[0]),
        selected=names,
        folds=int(arrays.train.shape[2]),
        fold_kind=arrays.fold_kind,  # type: ignore[arg-type]
        selection_stability={k: v / total for k, v in freq.most_common()},
        members=float(pooled[0, POS]),
        nonmembers=float(pooled[0, NEG]),
    )
    return result, tpr


def verdict(
    strongest: StrongestAttack, attacks: list[AttackJudgement], s: DecisionSettings
) -> tuple[str, str, SizeNeeded | None]:
    """(status, reason, what would decide it). FAIL: the cross-fitted strongest attack's one-sided lower bound is
    above the limit (leakage shown; a false FAIL has probability <= alpha). PASS: every judged attack's
    simultaneous upper bound is below the limit (a false PASS has probability <= alpha). Otherwise INCONCLUSIVE;
    NOT MEASURED where no attack can be judged (too few non-members for the FPR)."""
    judged = [a for a in attacks if a.judged]
    need = 10 / s.fpr
    if not judged or strongest.tpr.value is None:
        have = max((a.nonmembers for a in attacks), default=0.0)
        factor = need / have if have > 0 else None
        text = f"no attack can be judged at {s.fpr:.1%} FPR: {have:.0f} non-member scores, {need:.0f} needed (10 / FPR)"
        return (
            "NOT MEASURED",
            text,
            SizeNeeded(factor=factor, towards="MEASURED", sentence=_size_sentence(factor, "measure it")),
        )
    est, low = strongest.tpr.value, strongest.tpr.low
    if low is not None and low > s.limit:
        return "FAIL", f"strongest attack (cross-fitted) {est:.3f}, lower bound {low:.3f} > limit {s.limit:g}", None
    worst = max(judged, key=lambda a: a.upper_bound if a.upper_bound is not None else math.inf)
    if all(a.upper_bound is not None and a.upper_bound < s.limit for a in judged):
        return (
            "PASS",
            f"every attack's simultaneous upper bound < limit {s.limit:g} (highest: {worst.attack} {worst.upper_bound:.3f})",
            None,
        )
    return "INCONCLUSIVE", _open_reason(est, low, worst, s), size_to_decide(strongest, judged, s)


def _open_reason(est: float, low: float | None, worst: AttackJudgement, s: DecisionSettings) -> str:
    bound = "none" if worst.upper_bound is None else f"{worst.upper_bound:.3f}"
    return (
        f"strongest attack (cross-fitted) {est:.3f} with lower bound {low if low is None else round(low, 3)} not above "
        f"the limit {s.limit:g}, and {worst.attack}'s simultaneous upper bound {bound} not below it"
    )


def size_to_decide(strongest: StrongestAttack, judged: list[AttackJudgement], s: DecisionSettings) -> SizeNeeded:
    """How many times the audited samples would turn INCONCLUSIVE into FAIL (the lower bound past the limit) or
    PASS (every upper bound below it) if the estimates hold; the smaller of the two."""
    options: list[tuple[float, str]] = []
    est, low = strongest.tpr.value, strongest.tpr.low
    if est is not None and low is not None and est > s.limit:
        f = samples_factor(est - low, est - s.limit)
        if f is not None:
            options.append((f, "FAIL"))
    if all(a.tpr.value is not None and a.tpr.value < s.limit for a in judged):
        factors = [
            samples_factor((a.upper_bound or 0.0) - (a.tpr.value or 0.0), s.limit - (a.tpr.value or 0.0))
            for a in judged
            if a.upper_bound is not None and a.upper_bound >= s.limit
        ]
        if factors and all(f is not None for f in factors):
            options.append((max(factors), "PASS"))  # type: ignore[type-var]
    if not options:
        return SizeNeeded(
            factor=None, towards=None, sentence="no sample size decides it while an attack's estimate sits at the limit"
        )
    factor, towards = min(options)
    return SizeNeeded(factor=factor, towards=towards, sentence=_size_sentence(factor, towards))  # type: ignore[arg-type]


def _size_sentence(factor: float | None, towards: str) -> str:
    if factor is None:
        return "more data cannot be sized from what was observed"
    word = {"FAIL": "show FAIL", "PASS": "clear PASS"}.get(towards, towards)
    return f"about {factor:.1f}x the audited samples would {word} if the estimates hold"


def _equivalent_per_attack(per_attack: list[Difference], margin: float) -> tuple[bool, Difference | None]:
    """(every attack's paired TPR difference has its interval inside (-margin, +margin), the attack whose interval
    reaches furthest); False without any interval."""
    tpr = [d for d in per_attack if d.metric == "tpr" and d.estimate.low is not None and d.estimate.high is not None]
    if not tpr:
        return False, None
    widest = max(tpr, key=lambda d: max(abs(d.estimate.low), abs(d.estimate.high)))  # type: ignore[arg-type]
    return all(-margin < d.estimate.low and d.estimate.high < margin for d in tpr), widest  # type: ignore[operator]


def compare(
    quantizer: str,
    reference: str,
    diff_resampled: np.ndarray,
    per_attack: list[Difference],
    s: DecisionSettings,
) -> Comparison:
    """MORE / SAME / LESS / CANNOT TELL against the reference (full precision).

    D = strongest(quantizer) - strongest(reference), both cross-fitted on the same folds and resampled with the
    same samples (diff_resampled [B + 1], row 0 observed), with its percentile interval [alpha, 1 - alpha]. MORE: its
    lower end > 0 (a false MORE has probability <= alpha); LESS: its upper end < 0. SAME: every attack's paired
    TPR difference (`per_attack`, intervals at the same level) lies inside (-margin, +margin): an intersection-union
    test of two one-sided tests per attack (TOST), so a false SAME has probability <= alpha without a multiplicity
    correction, and equivalence of every attack bounds the difference of the strongest one too. Else CANNOT TELL.
    A significant difference inside the margin keeps MORE/LESS and says it is within the margin."""
    d = diff_resampled[0]
    lo, hi = percentile_interval(diff_resampled[1:], s.alpha, 1 - s.alpha)
    est = Estimate(
        value=_none_if_nan(d),
        low=_none_if_nan(lo),
        high=_none_if_nan(hi),
        confidence=1 - 2 * s.alpha,
        method="paired percentile bootstrap",
    )
    base = {"reference": reference, "difference": est, "margin": s.margin, "per_attack": per_attack}
    if not math.isfinite(d) or not math.isfinite(lo):
        why = f"{quantizer} cannot be compared with {reference}: no strongest-attack estimate on both"
        return Comparison(direction="NOT MEASURED", equivalent=False, sentence=why, **base)
    equivalent, widest = _equivalent_per_attack(per_attack, s.margin)
    direction = "MORE" if lo > 0 else "LESS" if hi < 0 else "SAME" if equivalent else "CANNOT TELL"
    span = f"strongest attack {d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
    if widest is not None:
        w = widest.estimate
        span += f"; widest per attack {widest.attack} {w.value:+.3f} [{w.low:+.3f}, {w.high:+.3f}]"
    sentence = {
        "MORE": f"{quantizer} leaks more than {reference} ({span})",
        "LESS": f"{quantizer} leaks less than {reference} ({span})",
        "SAME": f"{quantizer} leaks the same as {reference}: every attack within +-{s.margin:g} ({span})",
        "CANNOT TELL": f"the data cannot tell whether {quantizer} leaks more or less than {reference} (intervals reach beyond +-{s.margin:g}: {span})",
    }[direction]
    if direction in ("MORE", "LESS") and equivalent:
        sentence += f", by less than the margin +-{s.margin:g} on every attack"
    return Comparison(direction=direction, equivalent=equivalent, sentence=sentence, **base)  # type: ignore[arg-type]


def decision_of(
    quantizer: str, arrays: CountArrays, s: DecisionSettings, unjudged: dict[str, str], n_targets: int, mode: str
) -> tuple[QuantizerDecision, np.ndarray]:
    """The attack criterion of one quantizer (comparison left empty: `with_comparison` adds it), and the
    resampled cross-fitted TPRs [B + 1] the paired comparison reads."""
    attacks = judge_attacks(arrays, s, unjudged)
    strongest, resampled = strongest_attack(arrays.judged_only([a.attack for a in attacks if a.judged]), s)
    status, reason, size = verdict(strongest, attacks, s)
    judged = [a for a in attacks if a.judged and a.tpr.value is not None]
    top = max(judged, key=lambda a: a.tpr.value, default=None)  # type: ignore[arg-type, return-value]
    decision = QuantizerDecision(
        quantizer=quantizer,
        mode=mode,  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
        reason=reason,
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
        size_needed=size,
        run_to_run_covered=n_targets >= 2,
        n_targets=n_targets,
    )
    return decision, resampled
