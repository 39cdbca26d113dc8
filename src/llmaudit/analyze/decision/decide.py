"""The release decision of every quantizer, and its paired comparison with full precision (docs/science.md
section 12): from the attacks' scores on each quantizer (`QuantizerEvidence`, made by the attack evaluation) to
one typed `ReleaseDecision`.

Two modes, chosen once per store from the number of target models M (fine-tuning runs):
- calibrated (M >= max(2, min_runs)): every attack's per-sample calibrated scores (each sample's OUT scores under
  the other models standardised; on one normal scale, `normal_scores`) pooled over the targets, against the
  analytic threshold and the empirical one of the pooled non-member rows: a FAIL reads the higher, a PASS the
  lower (`calibrated_counts`); the strongest attack is chosen at the analytic threshold on folds of target models
  and measured on each; samples are resampled with all their models.
- empirical (fewer targets, e.g. one imported fine-tune): each target's raw scores against an empirical threshold
  from its own held-out non-members (the TPR at a fixed FPR that MIMIR and the EZ-MIA paper report); the
  strongest attack is chosen on folds of samples and measured on each against that fold's own non-members
  (`empirical_counts`); with one target, members and non-members are resampled separately. Run-to-run variation
  of training is not covered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llmaudit.analyze.decision.bounds import percentile_interval
from llmaudit.analyze.decision.counts import (
    POS,
    TP,
    empirical_counts,
    multiplicities,
    ratio,
    sample_folds,
    target_folds,
)
from llmaudit.analyze.decision.models import DecisionRule, Difference, Estimate, QuantizerDecision, ReleaseDecision
from llmaudit.analyze.decision.pooled import calibrated_counts, weighted_auroc
from llmaudit.analyze.decision.rule import CountArrays, DecisionSettings, compare, decision_of

RULE_STATEMENTS = [
    "FAIL: the strongest attack, chosen on some folds and measured on the others (cross-fitting), has a one-sided "
    "lower bound above the limit: leakage above the limit is shown; a quantizer whose strongest attack's true TPR "
    "is at or below the limit FAILs with probability at most alpha.",
    "PASS: every attack judged has a simultaneous one-sided upper bound below the limit (Bonferroni over the k "
    "attacks: each at 1 - alpha / k): a quantizer with any attack's true TPR at or above the limit PASSes with "
    "probability at most alpha. PASS means no attack of this suite is above the limit; an attack outside the "
    "suite may do better.",
    "INCONCLUSIVE: neither; the report says how many more samples would decide it if the estimates hold.",
    "NOT MEASURED: too few non-member scores for a TPR at this FPR (fewer than 10 / FPR).",
    "Compared with full precision: the paired difference of the two cross-fitted strongest-attack TPRs (same "
    "folds, same resampled samples); MORE / LESS when its 1 - 2 alpha interval excludes 0 (a false MORE or LESS "
    "has probability at most alpha), SAME when every judged attack's paired TPR difference has its 1 - 2 alpha "
    "interval within +-margin (intersection-union of two one-sided tests: a false SAME has probability at most "
    "alpha), else CANNOT TELL.",
    "Each quantizer is decided on its own at these rates: picking one quantizer among several that PASS keeps "
    "alpha only when the quantizer to release (--release) is named before the audit.",
]


@dataclass
class QuantizerEvidence:
    """The attacks' scores on one quantizer, as the decision reads them.

    scores: attack -> [M, N] (calibrated z in calibrated mode, raw scores in empirical mode; NaN = not scored);
    keep: [M, N] membership; unjudged: attack -> why it cannot be judged."""

    quantizer: str
    mode: str
    sample_ids: list[str]
    keep: np.ndarray
    scores: dict[str, np.ndarray]
    unjudged: dict[str, str] = field(default_factory=dict)
    loss: np.ndarray | None = None
    """[M, N] mean token loss of each target on each sample (the loss gap beside the TPR)."""

    def restricted(self, sample_ids: list[str]) -> QuantizerEvidence:
        """The same evidence on a subset of its samples, in the given order."""
        pos = {s: i for i, s in enumerate(self.sample_ids)}
        idx = np.array([pos[s] for s in sample_ids], dtype=np.int64)

        return QuantizerEvidence(
            self.quantizer,
            self.mode,
            list(sample_ids),
            self.keep[:, idx],
            {k: v[:, idx] for k, v in self.scores.items()},
            dict(self.unjudged),
            None if self.loss is None else self.loss[:, idx],
        )


def decision_mode(n_targets: int, min_runs: int) -> str:
    """calibrated with at least max(2, min_runs) target models, else empirical."""
    return "calibrated" if n_targets >= max(2, min_runs) else "empirical"


def _weights(ev: QuantizerEvidence, s: DecisionSettings) -> np.ndarray:
    strata = ev.keep[0] if ev.keep.shape[0] == 1 else None
    return multiplicities(len(ev.sample_ids), s.resamples, s.seed, strata)


def count_arrays(ev: QuantizerEvidence, weights: np.ndarray, s: DecisionSettings) -> CountArrays:
    """The resampled counts of every scored attack of one quantizer (`CountArrays`), in either mode: calibrated
    scores pooled over targets (`calibrated_counts`, folds of targets) or raw scores against each target's own
    thresholds (`empirical_counts`, folds of samples)."""
    names = list(ev.scores)
    B1 = weights.shape[0]
    if not names:
        empty = np.zeros((B1, 0, 1, 4))
        return CountArrays(
            [], np.zeros((B1, 0, 4)), empty, empty, "target models" if ev.mode == "calibrated" else "samples"
        )
    if ev.mode == "calibrated":
        folds = target_folds(ev.keep.shape[0], s.folds)
        parts = [calibrated_counts(ev.scores[a], ev.keep, weights, s.fpr, folds) for a in names]
        strict, loose, train, test = (np.stack([p[i] for p in parts], axis=1) for i in range(4))
        return CountArrays(names, strict, train, test, "target models", loose)
    folds = sample_folds(ev.keep.sum(axis=0), s.folds, s.seed)
    parts = [empirical_counts(ev.scores[a], ev.keep, weights, s.fpr, folds) for a in names]
    whole, train, test = (np.stack([p[i] for p in parts], axis=1) for i in range(3))
    return CountArrays(names, whole, train, test, "samples")


def _auroc(ev: QuantizerEvidence, attack: str, weights: np.ndarray) -> np.ndarray:
    z = ev.scores[attack]
    finite = np.isfinite(z)
    unit = np.broadcast_to(np.arange(z.shape[1]), z.shape)[finite]
    return weighted_auroc(z[finite], ev.keep[finite], unit, weights)


def per_attack_differences(
    q: OwnDecision, ref: OwnDecision, s: DecisionSettings, attacks: set[str]
) -> list[Difference]:
    """Per attack judged on both (`attacks`): the paired differences (quantizer - reference) of the TPR at the decision
    FPR and of the AUROC, each with its percentile interval at the decision's level (1 - 2 alpha) over the same
    resamples (both decisions made with the same weights)."""
    out = []
    qa, ra = q.arrays, ref.arrays
    for a in [a for a in qa.attacks if a in ra.attacks and a in attacks]:
        i, j = qa.attacks.index(a), ra.attacks.index(a)
        d_tpr = ratio(qa.per_attack[:, i, TP], qa.per_attack[:, i, POS]) - ratio(
            ra.per_attack[:, j, TP], ra.per_attack[:, j, POS]
        )
        d_auc = q.aurocs[a] - ref.aurocs[a]
        for metric, d in (("tpr", d_tpr), ("auroc", d_auc)):
            lo, hi = percentile_interval(d[1:], s.alpha, 1 - s.alpha)
            value = float(d[0]) if np.isfinite(d[0]) else None
            est = Estimate(
                value=value,
                low=lo if np.isfinite(lo) else None,
                high=hi if np.isfinite(hi) else None,
                confidence=1 - 2 * s.alpha,
                method="paired percentile bootstrap",
            )
            out.append(Difference(attack=a, metric=metric, estimate=est))  # type: ignore[arg-type]
    return out


def loss_gap(loss: np.ndarray, keep: np.ndarray, weights: np.ndarray) -> Estimate:
    """Mean loss of non-member rows minus member rows (nats per token), pooled over the targets, under each row of
    sample multiplicities [B + 1, N]: the observed value with its 95% percentile interval."""
    ok = np.isfinite(loss)
    sums = np.stack(
        [
            np.where(ok & ~keep, loss, 0).sum(0),
            (ok & ~keep).sum(0),
            np.where(ok & keep, loss, 0).sum(0),
            (ok & keep).sum(0),
        ]
    )
    c = weights @ sums.T  # [B + 1, 4]
    gap = ratio(c[:, 0], c[:, 1]) - ratio(c[:, 2], c[:, 3])
    lo, hi = percentile_interval(gap[1:], 0.025, 0.975)
    value, low, high = (float(x) if np.isfinite(x) else None for x in (gap[0], lo, hi))
    return Estimate(value=value, low=low, high=high, confidence=0.95, method="percentile bootstrap over samples")


@dataclass(frozen=True)
class OwnDecision:
    """One quantizer's decision on its own evidence, with what a paired comparison reuses: the resampled strongest
    attack, the counts, the resampling weights and each counted attack's resampled AUROC."""

    decision: QuantizerDecision
    resampled: np.ndarray
    arrays: CountArrays
    weights: np.ndarray
    aurocs: dict[str, np.ndarray]


def decide_one(ev: QuantizerEvidence, s: DecisionSettings) -> OwnDecision:
    """`OwnDecision` of one quantizer: independent of the other quantizers (a worker process may make it)."""
    weights = _weights(ev, s)
    arrays = count_arrays(ev, weights, s)
    decision, resampled = decision_of(ev.quantizer, arrays, s, ev.unjudged, ev.keep.shape[0], ev.mode)
    if ev.loss is not None:
        decision = decision.model_copy(update={"loss_gap": loss_gap(ev.loss, ev.keep, weights)})
    aurocs = {a: _auroc(ev, a, weights) for a in arrays.attacks}
    return OwnDecision(decision, resampled, arrays, weights, aurocs)


def _with_comparison(
    q: QuantizerEvidence, ref: QuantizerEvidence, own: OwnDecision, ref_own: OwnDecision, s: DecisionSettings
) -> QuantizerDecision:
    """The quantizer's decision with its paired comparison with the reference (on the samples both scored)."""
    decision, ref_decision = own.decision, ref_own.decision
    if q.sample_ids != ref.sample_ids:  # pair on the common samples, recounted with common resamples
        common = [x for x in ref.sample_ids if x in set(q.sample_ids)]
        own, ref_own = decide_one(q.restricted(common), s), decide_one(ref.restricted(common), s)
    judged = {a.attack for a in decision.attacks if a.judged} & {a.attack for a in ref_decision.attacks if a.judged}
    diffs = per_attack_differences(own, ref_own, s, judged)
    comparison = compare(q.quantizer, ref.quantizer, own.resampled - ref_own.resampled, diffs, s)
    return decision.model_copy(update={"comparison": comparison})


def decide(
    evidence: dict[str, QuantizerEvidence], reference: str | None, s: DecisionSettings, own: dict | None = None
) -> ReleaseDecision:
    """The release decision of every quantizer in `evidence` (rules: RULE_STATEMENTS), each compared with
    `reference` (the store's full precision) where it is among them. own: `decide_one` of some quantizers, made
    already (by the worker process that attacked them); the others are made here."""
    s.check()
    modes = {ev.mode for ev in evidence.values()}
    if len(modes) > 1:
        raise ValueError(f"every quantizer must be judged in one mode; got {sorted(modes)}.")
    own = {q: (own or {}).get(q) or decide_one(ev, s) for q, ev in evidence.items()}
    per_q = {}
    for q, ev in evidence.items():
        if reference in evidence:
            per_q[q] = _with_comparison(ev, evidence[reference], own[q], own[reference], s)
        else:
            per_q[q] = own[q].decision
    rule = DecisionRule(
        limit=s.limit,
        fpr=s.fpr,
        alpha=s.alpha,
        margin=s.margin,
        folds=s.folds,
        resamples=s.resamples,
        seed=s.seed,
        mode=(modes.pop() if modes else "calibrated"),  # type: ignore[arg-type]
        min_runs=s.min_runs,
        statements=RULE_STATEMENTS,
    )
    return ReleaseDecision(rule=rule, reference=reference if reference in evidence else None, per_quantizer=per_q)
