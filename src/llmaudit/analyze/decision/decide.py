"""The release decision of every quantizer, and its paired comparison with full precision (docs/science.md
section 12): from the attacks' scores on each quantizer (`QuantizerEvidence`, made by the attack evaluation) to
one typed `ReleaseDecision`.

Two modes, chosen once per store from the number of target models M (fine-tuning runs):
- calibrated (M >= max(2, min_runs)): every attack's per-sample calibrated scores (each sample's OUT scores under
  the other models standardised; on one normal scale, `normal_scores`) pooled over the targets: each attack's own
  TPR is read at the empirical threshold of the pooled non-member rows and a PASS reads the lower of it and the
  analytic threshold (`calibrated_counts`); the strongest attack is chosen and measured over folds of samples with
  the classes crossed (chosen on the other folds' members against a normal fitted to the fold's non-members,
  measured on the fold against the other folds' conformal threshold); samples are resampled with all their models.
- empirical (fewer targets, e.g. one imported fine-tune): each target's raw scores against an empirical threshold
  from its own held-out non-members (the TPR at a fixed FPR that MIMIR and the EZ-MIA paper report); the
  strongest attack is chosen and measured over folds of samples with the classes crossed in the same way, at
  empirical thresholds (`empirical_counts`); with one target, members and non-members are resampled separately,
  and with fewer than 10 / FPR non-members the exact test (`llmaudit.analyze.decision.exact`) can still show a
  FAIL. Run-to-run variation of training is not covered.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from llmaudit.analyze.decision.bounds import percentile_interval
from llmaudit.analyze.decision.compare import compare
from llmaudit.analyze.decision.counts import (
    FP,
    NEG,
    POS,
    TP,
    empirical_counts,
    multiplicities,
    ratio,
    sample_folds,
)
from llmaudit.analyze.decision.exact import ExactResult, exact_test
from llmaudit.analyze.decision.models import DecisionRule, Difference, Estimate, QuantizerDecision, ReleaseDecision
from llmaudit.analyze.decision.pooled import calibrated_counts, weighted_auroc
from llmaudit.analyze.decision.rule import CountArrays, DecisionSettings, decision_of

RULE_STATEMENTS = [
    "Headline: the strongest attack, cross-fitted over folds of samples: for each fold it is chosen by its TPR on "
    "the other folds' members against a threshold that holds 1% FPR on the fold's own non-members, and measured on "
    "the fold against a threshold that holds 1% FPR on the other folds' non-members (their conformal quantile); the "
    "counts are pooled over folds, and its interval is conditional on the choices made.",
    "FAIL: the headline's one-sided lower bound (1 - alpha) is above the limit: leakage above the limit is shown; a "
    "quantizer whose every attack's true TPR is at or below the limit FAILs with probability at most alpha. With one "
    "target and fewer than 10 / FPR non-members the lower bound is exact: an order-statistic threshold that holds "
    "the FPR with probability >= 1 - alpha / 2 and a Clopper-Pearson bound, the two errors adding to alpha.",
    "PASS: every attack judged has a simultaneous one-sided upper bound below the limit (Bonferroni over the k "
    "attacks: each at 1 - alpha / k); it needs 10 / FPR non-member scores: a quantizer with any attack's true TPR "
    "at or above the limit PASSes with probability at most alpha. PASS means no attack of this suite is above the "
    "limit; an attack outside the suite may do better.",
    "INCONCLUSIVE: neither; the report says how many more samples would decide it if the judged attacks' estimates "
    "hold.",
    "NOT MEASURED: fewer than 10 / FPR non-member scores (no PASS can be shown) and no FAIL shown.",
    "Compared with full precision: the paired difference of leakage beyond chance (TPR minus the realised FPR of "
    "the same rows) of the two headlines (same folds, same resampled samples); MORE / LESS when its two-sided "
    "1 - alpha interval excludes 0 (a false MORE or LESS has probability at most alpha), SAME when every judged "
    "attack's paired difference of leakage beyond chance has its 1 - 2 alpha interval within +-margin "
    "(intersection-union of two one-sided tests: a false SAME has probability at most alpha), else CANNOT TELL.",
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
    raw: dict[str, np.ndarray] = field(default_factory=dict)
    """attack -> [M, N] its raw scores (higher = member) in either mode: what the epsilon bound ranks."""

    def restricted(self, sample_ids: list[str]) -> QuantizerEvidence:
        """Restrict the evidence to a subset of its samples, in the given order.

        Args:
            sample_ids (list[str]): the samples kept, each one of `self.sample_ids`.
        Returns:
            QuantizerEvidence: the same evidence on those samples.
        """
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
            {k: v[:, idx] for k, v in self.raw.items()},
        )


def decision_mode(n_targets: int, min_runs: int) -> str:
    """Choose the decision mode from the number of target models.

    Args:
        n_targets (int): the target models M (fine-tuning runs).
        min_runs (int): the fewest targets the calibrated mode needs (at least 2 in any case).
    Returns:
        str: "calibrated" with at least max(2, min_runs) targets, else "empirical".
    """
    return "calibrated" if n_targets >= max(2, min_runs) else "empirical"


def _weights(ev: QuantizerEvidence, s: DecisionSettings) -> np.ndarray:
    strata = ev.keep[0] if ev.keep.shape[0] == 1 else None
    return multiplicities(len(ev.sample_ids), s.resamples, s.seed, strata)


def count_arrays(ev: QuantizerEvidence, weights: np.ndarray, s: DecisionSettings) -> CountArrays:
    """Count the resampled hits of every scored attack of one quantizer, in either mode.

    Calibrated scores are pooled over targets (`calibrated_counts`); raw scores are read against each target's
    own thresholds (`empirical_counts`); folds of samples in both.

    Args:
        ev (QuantizerEvidence): the attacks' scores on the quantizer.
        weights (np.ndarray): [B + 1, N] sample multiplicities.
        s (DecisionSettings): the rule's settings.
    Returns:
        CountArrays: the counts of every attack.
    """
    names = list(ev.scores)
    B1 = weights.shape[0]
    if not names:
        return CountArrays([], np.zeros((B1, 0, 4)), np.zeros((0, 1, 4)), np.zeros((B1, 0, 1, 4)), "samples")
    folds = sample_folds(ev.keep.sum(axis=0), s.folds, s.seed)
    if ev.mode == "calibrated":
        parts = [calibrated_counts(ev.scores[a], ev.keep, weights, s.fpr, folds) for a in names]
        measured, loose, test = (np.stack([p[i] for p in parts], axis=1) for i in (0, 1, 3))
        return CountArrays(names, measured, np.stack([p[2] for p in parts]), test, "samples", loose)
    parts = [empirical_counts(ev.scores[a], ev.keep, weights, s.fpr, folds) for a in names]
    whole, test = (np.stack([p[i] for p in parts], axis=1) for i in (0, 2))
    return CountArrays(names, whole, np.stack([p[1] for p in parts]), test, "samples")


def _auroc(ev: QuantizerEvidence, attack: str, weights: np.ndarray) -> np.ndarray:
    z = ev.scores[attack]
    finite = np.isfinite(z)
    unit = np.broadcast_to(np.arange(z.shape[1]), z.shape)[finite]
    return weighted_auroc(z[finite], ev.keep[finite], unit, weights)


def _excess(counts: np.ndarray) -> np.ndarray:
    """TPR minus realised FPR of counts [..., 4]."""
    return ratio(counts[..., TP], counts[..., POS]) - ratio(counts[..., FP], counts[..., NEG])


def per_attack_differences(
    q: OwnDecision, ref: OwnDecision, s: DecisionSettings, attacks: set[str]
) -> list[Difference]:
    """Compute the paired differences (quantizer - reference) of each attack judged on both.

    The differences are of leakage beyond chance (TPR minus realised FPR, what SAME reads), of the TPR and of the
    AUROC at the measuring threshold, each with its percentile interval at 1 - 2 alpha over the same resamples (both
    decisions made with the same weights).

    Args:
        q (OwnDecision): the quantizer's own decision.
        ref (OwnDecision): the reference's own decision.
        s (DecisionSettings): the rule's settings.
        attacks (set[str]): the attacks judged on both.
    Returns:
        list[Difference]: three differences per attack (excess_tpr, tpr, auroc).
    """
    out = []
    qa, ra = q.arrays, ref.arrays
    for a in [a for a in qa.attacks if a in ra.attacks and a in attacks]:
        i, j = qa.attacks.index(a), ra.attacks.index(a)
        qc, rc = qa.per_attack[:, i], ra.per_attack[:, j]
        diffs = {
            "excess_tpr": _excess(qc) - _excess(rc),
            "tpr": ratio(qc[:, TP], qc[:, POS]) - ratio(rc[:, TP], rc[:, POS]),
            "auroc": q.aurocs[a] - ref.aurocs[a],
        }
        for metric, d in diffs.items():
            lo, hi = percentile_interval(d[1:], s.alpha, 1 - s.alpha)
            est = Estimate(
                value=float(d[0]) if np.isfinite(d[0]) else None,
                low=lo if np.isfinite(lo) else None,
                high=hi if np.isfinite(hi) else None,
                confidence=1 - 2 * s.alpha,
                method="paired percentile bootstrap",
            )
            out.append(Difference(attack=a, metric=metric, estimate=est))  # type: ignore[arg-type]
    return out


def loss_gap(loss: np.ndarray, keep: np.ndarray, weights: np.ndarray) -> Estimate:
    """Estimate the mean loss of non-member rows minus member rows, pooled over the targets.

    Args:
        loss (np.ndarray): [M, N] mean token loss in nats (NaN = not scored).
        keep (np.ndarray): [M, N] membership.
        weights (np.ndarray): [B + 1, N] sample multiplicities, row 0 the observed data.
    Returns:
        Estimate: the observed gap in nats per token with its 95% percentile bootstrap interval.
    """
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
    """One quantizer's decision on its own evidence, with what a paired comparison reuses: the headline's resampled
    TPR (`resampled`) and leakage beyond chance (`excess`), the counts, the resampling weights and each counted
    attack's resampled AUROC."""

    decision: QuantizerDecision
    resampled: np.ndarray
    arrays: CountArrays
    weights: np.ndarray
    aurocs: dict[str, np.ndarray]
    excess: np.ndarray | None = None


def exact_reading(ev: QuantizerEvidence, s: DecisionSettings) -> ExactResult | str | None:
    """Read the exact FAIL test where no scored attack has the non-members the cross-fitted rule needs.

    Args:
        ev (QuantizerEvidence): the attacks' scores on the quantizer.
        s (DecisionSettings): the rule's settings (10 / FPR non-members needed).
    Returns:
        ExactResult | str | None: the reading (`exact_test`) with one target, else why it cannot be made; None where
        it is not needed.
    """
    finite = [np.isfinite(v) & ~ev.keep for v in ev.scores.values()]
    if not finite or max(int(f.sum()) for f in finite) >= s.nonmembers_needed:
        return None
    if ev.keep.shape[0] != 1:
        return (
            f"the exact test needs one target model (independent rows); this store has {ev.keep.shape[0]}, "
            f"whose pooled non-member scores are fewer than {s.nonmembers_needed}"
        )
    return exact_test({a: v[0] for a, v in ev.scores.items()}, ev.keep[0], s)


def decide_one(ev: QuantizerEvidence, s: DecisionSettings) -> OwnDecision:
    """Decide one quantizer on its own evidence, independently of the others (a worker process may do it).

    Args:
        ev (QuantizerEvidence): the attacks' scores on the quantizer.
        s (DecisionSettings): the rule's settings.
    Returns:
        OwnDecision: the decision with what a paired comparison reuses.
    """
    weights = _weights(ev, s)
    arrays = count_arrays(ev, weights, s)
    exact = exact_reading(ev, s)
    decision, resampled, excess = decision_of(ev.quantizer, arrays, s, ev.unjudged, ev.keep.shape[0], ev.mode, exact)
    if ev.loss is not None:
        decision = decision.model_copy(update={"loss_gap": loss_gap(ev.loss, ev.keep, weights)})
    aurocs = {a: _auroc(ev, a, weights) for a in arrays.attacks}
    return OwnDecision(decision, resampled, arrays, weights, aurocs, excess)


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
    comparison = compare(q.quantizer, ref.quantizer, own.excess - ref_own.excess, diffs, s)
    return decision.model_copy(update={"comparison": comparison})


def decide(
    evidence: dict[str, QuantizerEvidence], reference: str | None, s: DecisionSettings, own: dict | None = None
) -> ReleaseDecision:
    """Decide the release of every quantizer, each compared with the reference where it is among them.

    The rules are RULE_STATEMENTS.

    Args:
        evidence (dict[str, QuantizerEvidence]): the attacks' scores, by quantizer.
        reference (str | None): the store's full-precision quantizer.
        s (DecisionSettings): the rule's settings.
        own (dict | None): `decide_one` of some quantizers, made already (by the worker process that attacked them);
            the others are made here.
    Returns:
        ReleaseDecision: the rule and the decision of each quantizer.
    Raises:
        ValueError: when the settings are invalid or the quantizers were evaluated in different modes.
    """
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
