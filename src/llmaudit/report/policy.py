"""The release checklist: the policy that turns estimates into PASS / FAIL / INCONCLUSIVE / NOT MEASURED.

Release checklist (`release_checklist`), per quantizer, thresholds from the recipe's `report` section (the rules,
word for word, are CHECKLIST_RULES; docs/science.md section 12 states them with what they guarantee):
  attack_tpr  the release rule's decision (`llmaudit.report.release`): the cross-fitted strongest attack's lower
              bound above max_tpr_at_1pct_fpr FAILs, every attack's simultaneous upper bound below it PASSes
  r_q         r_Q (mean over runs) must be >= min_r_q (min_r_q = 0 disables the criterion: DISABLED; so does a
              failed validation: no audit size can measure it; docs/science.md section 10)
  indicator   the validated attack-free indicator >= min_indicator (unset: DISABLED)
  utility     the relative increase of validation loss vs full precision must be <= max_utility_loss (or, with
              report.utility_metric, the KL / same-top / task-metric figure against utility_limit)
The criteria other than attack_tpr are judged on their estimate and 95% interval (`judge`): FAIL when the whole
interval is on the unsafe side, PASS when it is on the safe side, INCONCLUSIVE when it crosses the limit, NOT
MEASURED without an estimate or interval or with fewer runs than a criterion over runs needs. A quantizer's
overall status is the worst of its criteria (FAIL > NOT MEASURED > INCONCLUSIVE > PASS); it is cleared for
release only if PASS. The recommendation is `llmaudit.report.recommend`.

Non-finite numbers: report.json is strict JSON (RFC 8259): NaN and +-inf become null. The counts beside
them (r_Q's n_undefined and n_infinite, `reliable` flags, checklist reasons) say why a value is missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llmaudit.analyze.metrics import fpr_key
from llmaudit.analyze.result import AnalysisResult
from llmaudit.report.models import (
    AttackEntry,
    Checklist,
    Criterion,
    GridRow,
    PrimaryIndicator,
    QuantizerChecklist,
    Thresholds,
    TprAt,
)
from llmaudit.report.release import attack_criterion, decision_of
from llmaudit.report.utility import metric_estimate

PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED = "PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED", "DISABLED"

STATUSES = (PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED)

_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, NOT_MEASURED: 2, FAIL: 3}

DEFAULT_MIN_RUNS = 5
"""Runs (independent fine-tunings) a criterion needs before its interval is trusted; a recipe may set
`report.min_runs`. A bootstrap interval over fewer runs is too coarse to clear a release."""

CHECKLIST_FPR = 0.01


def checklist_tpr(att: AttackEntry) -> TprAt:
    """The TPR at the checklist's FPR under the calibrated evaluation of one attack's grid entry.

    Args:
        att: the attack's entry of a grid row (`llmaudit.report.grid.attack_summary`).

    Returns:
        The TPR with its interval and reliability; tpr and ci None where the calibrated evaluation did not measure
        it.
    """
    return att.tpr_at("pooled_calibrated", fpr_key(CHECKLIST_FPR)) or TprAt()


def judge(
    value: float | None, ci: list | None, *, limit: float, kind: str, measured: bool, why_not: str = ""
) -> dict[str, Any]:
    """PASS / FAIL / INCONCLUSIVE / NOT MEASURED for one estimate against one limit (rules: module doc).

    Args:
        value: the estimate.
        ci: its 95% interval [low, high].
        limit: the criterion's limit.
        kind: "max" (value must be <= limit) or "min" (value must be >= limit).
        measured: whether the estimate may be judged at all.
        why_not: the reason shown when it may not.

    Returns:
        {"status", "reason"}.
    """
    if not measured:
        return {"status": NOT_MEASURED, "reason": why_not or "estimate unreliable"}
    if value is None:
        return {"status": NOT_MEASURED, "reason": "no finite estimate"}
    if ci is None or ci[0] is None or ci[1] is None:
        return {"status": NOT_MEASURED, "reason": "no confidence interval (n_boot = 0?)"}
    span = f"[{ci[0]:.4g}, {ci[1]:.4g}]"
    safe_bound, unsafe_bound = (ci[1], ci[0]) if kind == "max" else (ci[0], ci[1])
    if (unsafe_bound > limit) if kind == "max" else (unsafe_bound < limit):
        side = ">" if kind == "max" else "<"
        return {"status": FAIL, "reason": f"estimate {value:.4g}, the whole 95% interval {span} {side} limit {limit:g}"}
    if (safe_bound <= limit) if kind == "max" else (safe_bound >= limit):
        return {"status": PASS, "reason": f"95% interval {span} {'<=' if kind == 'max' else '>='} limit {limit:g}"}
    return {
        "status": INCONCLUSIVE,
        "reason": f"estimate {value:.4g}: the 95% interval {span} crosses the limit {limit:g}",
    }


def worst(statuses: Iterable[str]) -> str:
    """The overall status of a quantizer: the worst of its criteria (FAIL > NOT MEASURED > INCONCLUSIVE > PASS).

    Args:
        statuses: the criteria's statuses (DISABLED ones do not count).

    Returns:
        The worst status; NOT MEASURED when none counts.
    """
    counted = [s for s in statuses if s in _SEVERITY]
    return max(counted, key=_SEVERITY.__getitem__) if counted else NOT_MEASURED


def thresholds_of(result: AnalysisResult) -> dict[str, Any]:
    """The checklist's thresholds as the analysis recorded them, with the defaults of those it did not record.

    Args:
        result: the typed analysis result.

    Returns:
        The thresholds (report section of the recipe).
    """
    th = dict(result.thresholds)
    th.setdefault("min_runs", DEFAULT_MIN_RUNS)
    th.setdefault("min_indicator", None)
    th.setdefault("utility_metric", "loss")
    th.setdefault("utility_limit", None)
    return th


def failed_indicator_reason(name: str) -> str:
    """Why a criterion on an indicator that FAILED validation is DISABLED rather than NOT MEASURED: no audit size
    can measure it (the validation verdict is the indicator's, not this audit's), and an indicator shown not to
    track the attacks is evidence neither for nor against a release; the attack criterion judges leakage.

    Args:
        name: the indicator's name.

    Returns:
        The reason, in one sentence.
    """
    return (
        f"{name} failed validation (docs/science.md section 8): it is not evidence for or against a release at any "
        "audit size, so this criterion is off; the attack criterion judges leakage"
    )


def too_few_negatives_reason(t: TprAt, n_pooled: int | None) -> str:
    """Why a calibrated TPR at 1% FPR is unreliable, with the counts.

    The non-member scores it was computed on (those with a finite calibrated score) are set against the pooled
    non-members and the 10 / alpha it needs. The two differ where calibration drops scores: a sample with fewer than
    2 OUT references among the other models (online LiRA also needs 2 IN), or whose OUT scores have zero spread
    (counting scores such as WBC's and RMIA's); more pooled non-members alone may then not be enough.

    Args:
        t: the TPR entry (`checklist_tpr`), with its n_negatives and min_negatives where recorded.
        n_pooled: the pooled non-members.

    Returns:
        The reason, with the counts.
    """
    need = t.min_negatives or int(10 / CHECKLIST_FPR)
    n_cal = t.n_negatives
    if n_cal is None:  # a report.json without the calibrated count
        return f"too few non-members for TPR at {CHECKLIST_FPR:.0%} FPR ({n_pooled} pooled, needs >= {need})"
    why = f"too few non-members for TPR at {CHECKLIST_FPR:.0%} FPR ({n_cal} calibrated"
    if n_pooled is not None and n_pooled > n_cal:
        why += (
            f" of {n_pooled} pooled: calibration drops samples with too few OUT references or zero spread across them"
        )
    return why + f"; needs >= {need})"


def _criterion(fields: dict[str, Any], verdict: dict[str, Any]) -> Criterion:
    """A criterion from its fields and its verdict (a verdict's keys replace the fields' own)."""
    return Criterion(**(fields | verdict))


def _attack_tpr_criterion(row: GridRow, th: dict[str, Any]) -> Criterion:
    """The attack criterion: the release rule's decision (`llmaudit.report.release`); a result without one is judged
    attack by attack (`_per_attack_tpr_criterion`)."""
    decision = decision_of(row)
    return _per_attack_tpr_criterion(row, th) if decision is None else attack_criterion(row, decision)


def _per_attack_tpr_criterion(row: GridRow, th: dict[str, Any]) -> Criterion:
    """A result written without the release rule's decision: every attack judged on its own calibrated TPR and 95%
    interval (`judge`), at least min_runs runs; the worst verdict over the attacks."""
    limit, min_runs = float(th["max_tpr_at_1pct_fpr"]), int(th["min_runs"])
    per_attack = {}
    for name, att in row.attacks.items():
        t = checklist_tpr(att)
        n_models = att.n_models or 0
        if att.not_measured.get("pooled_calibrated"):
            measured, why = False, att.not_measured["pooled_calibrated"]
        elif n_models < min_runs:
            measured, why = False, f"{n_models} target models < min_runs {min_runs}"
        elif not t.reliable:
            why = too_few_negatives_reason(t, att.n_negatives)
            measured = False
        else:
            measured, why = True, ""
        verdict = judge(t.tpr, t.ci, limit=limit, kind="max", measured=measured, why_not=why)
        if verdict["status"] == NOT_MEASURED and t.tpr is not None and t.tpr > limit:
            verdict["reason"] += f"; indicative estimate {t.tpr:.4g} exceeds the limit"
        per_attack[name] = {"value": t.tpr, "ci": t.ci, "reliable": t.reliable} | verdict
    best = row.best_attack
    out = {
        "id": "attack_tpr",
        "description": f"highest TPR at {CHECKLIST_FPR:.0%} FPR (per-sample calibrated, pooled) over every attack <= limit",
        "threshold": limit,
        "comparison": "<=",
        "attack": best.name if best else None,
        "value": best.value if best else None,
        "ci": best.ci if best else None,
        "reliable": best.reliable if best else None,
        "per_attack": per_attack,
        "skipped_attacks": row.skipped_attacks,
    }
    if not per_attack:
        return _criterion(out, {"status": NOT_MEASURED, "reason": "no attack was computed"})
    status = worst(v["status"] for v in per_attack.values())
    # the attack that decides the status: the worst-judged one, ties broken by the highest estimate
    deciding = max(
        per_attack.items(),
        key=lambda kv: (_SEVERITY[kv[1]["status"]], kv[1]["value"] if kv[1]["value"] is not None else -1.0),
    )
    out["status"] = status
    out["reason"] = f"{deciding[0]}: {deciding[1]['reason']}"
    if status == PASS:
        out["reason"] = f"every attack's 95% interval <= {limit:g} (highest: {out['attack']})"
    return Criterion(**out)


def _r_q_criterion(row: GridRow, th: dict[str, Any]) -> Criterion:
    limit, min_runs = float(th["min_r_q"]), int(th["min_runs"])
    r = row.r_q
    out = {
        "id": "r_q",
        "description": "r_Q (mean over runs) >= limit",
        "threshold": limit,
        "comparison": ">=",
        "value": r.mean,
        "ci": r.ci,
        "confidence": r.confidence,
        "reliable": (r.n_finite or 0) >= min_runs,
    }
    if limit <= 0:
        return _criterion(out, {"status": DISABLED, "reason": "min_r_q = 0 disables this criterion"})
    if row.r_q_status == "failed":
        return _criterion(out, {"status": DISABLED, "reason": failed_indicator_reason("r_Q")})
    if row.r_q_status != "passed":
        return _criterion(
            out,
            {
                "status": NOT_MEASURED,
                "reason": f"r_Q's validation status is '{row.r_q_status}' (docs/science.md section 8): "
                "only an indicator that passed validation may drive a criterion",
            },
        )
    n_finite = r.n_finite or 0
    why = f"{n_finite} runs with a finite r_Q < min_runs {min_runs}"
    if r.n_undefined:
        why += f" ({r.n_undefined} undefined)"
    return _criterion(out, judge(r.mean, r.ci, limit=limit, kind="min", measured=n_finite >= min_runs, why_not=why))


def _indicator_criterion(row: GridRow, th: dict[str, Any]) -> Criterion:
    """The validated attack-free indicator (report.indicator) >= report.min_indicator."""
    ind = row.indicator or PrimaryIndicator()
    limit, min_runs = th.get("min_indicator"), int(th["min_runs"])
    out = {
        "id": "indicator",
        "description": f"{ind.name} (mean over runs, higher = more secure) >= limit",
        "threshold": limit,
        "comparison": ">=",
        "value": ind.mean,
        "ci": ind.ci,
        "confidence": ind.confidence,
        "reliable": (ind.n_finite or 0) >= min_runs,
    }
    if limit is None:
        return _criterion(out, {"status": DISABLED, "reason": "report.min_indicator is not set"})
    if ind.status == "failed":
        return _criterion(out, {"status": DISABLED, "reason": failed_indicator_reason(str(ind.name))})
    if ind.status != "passed":
        return _criterion(
            out,
            {
                "status": NOT_MEASURED,
                "reason": f"{ind.name} has validation status '{ind.status}': only an indicator that passed "
                "validation may drive a criterion",
            },
        )
    n = ind.n_finite or 0
    return _criterion(
        out,
        judge(
            ind.mean,
            ind.ci,
            limit=float(limit),
            kind="min",
            measured=n >= min_runs,
            why_not=f"{n} runs < min_runs {min_runs}",
        ),
    )


def _utility_criterion(row: GridRow, th: dict[str, Any]) -> Criterion:
    metric = th.get("utility_metric") or "loss"
    if metric != "loss":
        return _utility_metric_criterion(row, th, metric)
    limit, min_runs = float(th["max_utility_loss"]), int(th["min_runs"])
    u = row.utility
    n_runs = u.n_runs or 0
    out = {
        "id": "utility",
        "description": "relative increase of validation loss vs full precision <= limit",
        "metric": "loss",
        "threshold": limit,
        "comparison": "<=",
        "value": u.relative_change,
        "ci": u.relative_change_ci,
        "confidence": u.confidence,
        "reliable": n_runs >= min_runs,
    }
    if u.relative_change is None:
        return _criterion(
            out, {"status": NOT_MEASURED, "reason": "no validation loss relative to the reference (missing runs?)"}
        )
    if n_runs < min_runs and u.relative_change_ci_samples:  # fewer runs: the interval over samples
        verdict = judge(u.relative_change_pooled, u.relative_change_ci_samples, limit=limit, kind="max", measured=True)
        verdict["reason"] += (
            f" (interval over {u.n_val_samples} validation samples: {n_runs} run(s) < min_runs {min_runs}, so "
            "run-to-run variation of training is not covered)"
        )
        return _criterion(
            out,
            {
                "value": u.relative_change_pooled,
                "ci": u.relative_change_ci_samples,
                "reliable": True,
                "interval_over": "samples",
            }
            | verdict,
        )
    return _criterion(
        out,
        {"interval_over": "runs"}
        | judge(
            u.relative_change,
            u.relative_change_ci,
            limit=limit,
            kind="max",
            measured=n_runs >= min_runs,
            why_not=f"{n_runs} runs < min_runs {min_runs}",
        ),
    )


def _utility_metric_criterion(row: GridRow, th: dict[str, Any], metric: str) -> Criterion:
    """The utility criterion on report.utility_metric other than the loss (KL, same top, a task metric's drop
    below full precision; llmaudit.report.utility.metric_estimate), judged like every criterion."""
    e = metric_estimate(row, metric, th.get("utility_limit"))
    min_runs = int(th["min_runs"])
    out = {
        "id": "utility",
        "description": e["description"],
        "metric": metric,
        "threshold": e["limit"],
        "comparison": "<=" if e["kind"] == "max" else ">=",
        "value": e["value"],
        "ci": e["ci"],
        "reliable": e["n_runs"] >= min_runs,
    }
    if e["missing"]:
        return _criterion(out, {"status": NOT_MEASURED, "reason": e["missing"]})
    return _criterion(
        out,
        judge(
            e["value"],
            e["ci"],
            limit=e["limit"],
            kind=e["kind"],
            measured=e["n_runs"] >= min_runs,
            why_not=f"{e['n_runs']} runs < min_runs {min_runs}",
        ),
    )


def release_checklist(grid: list[GridRow], thresholds: dict[str, Any]) -> Checklist:
    """Per quantizer: every criterion with its status, and the overall status (rules: module doc).

    Args:
        grid: the report's grid rows.
        thresholds: the checklist's thresholds (`thresholds_of`).

    Returns:
        report.json's checklist: the thresholds, the rules in words, per quantizer its criteria and overall status.
    """
    th = dict(thresholds)
    th.setdefault("min_runs", DEFAULT_MIN_RUNS)
    th.setdefault("min_indicator", None)
    per_q = {}
    for row in grid:
        criteria = [
            _attack_tpr_criterion(row, th),
            _r_q_criterion(row, th),
            _indicator_criterion(row, th),
            _utility_criterion(row, th),
        ]
        per_q[row.quantizer] = QuantizerChecklist(overall=worst(c.status for c in criteria), criteria=criteria)
    return Checklist(thresholds=Thresholds(**th), rules=CHECKLIST_RULES, per_quantizer=per_q)


CHECKLIST_RULES = [
    "attack_tpr (docs/science.md section 12): the strongest attack is chosen on some rows at a threshold that holds "
    "1% FPR and its TPR at 1% FPR measured on other rows (cross-fitting over folds of samples). FAIL when that "
    "honest estimate's one-sided lower bound (1 - alpha) is above max_tpr_at_1pct_fpr: leakage above the limit is "
    "shown, and a quantizer at or below the limit FAILs with probability at most alpha (with one run and fewer "
    "than 1,000 held-out non-members, by an exact test). PASS when every attack's simultaneous upper bound "
    "(Bonferroni over the attacks judged) is below the limit: a quantizer with any attack at or above the limit "
    "PASSes with probability at most alpha. Otherwise INCONCLUSIVE, with the audit size that would decide it; NOT "
    "MEASURED with too few non-members for a PASS and no FAIL shown. The in-sample maximum over attacks is shown "
    "too, labelled selection-biased.",
    "attack_tpr with at least max(2, min_runs) runs reads per-sample calibrated scores pooled over the runs as "
    "targets; with fewer (one imported fine-tune) each run's own held-out non-members set an empirical threshold, "
    "and the run-to-run variation of training is not covered.",
    "Compared with full precision: the paired difference of leakage beyond chance (TPR minus realised FPR) of the "
    "two headlines (same folds and resampled samples): MORE / LESS when its 1 - alpha interval excludes 0; SAME when "
    "every judged attack's paired difference has its 1 - 2 alpha interval within +-equivalence_margin "
    "(intersection-union of two one-sided tests); else CANNOT TELL; each wrong answer has probability at most alpha.",
    "r_q: r_Q (mean over runs) must be >= min_r_q; min_r_q = 0 disables it (DISABLED). Like every indicator, it "
    "drives the checklist only if it passed validation (docs/science.md section 8): one that failed validation is "
    "DISABLED (no audit size can measure it), one not yet validated is NOT MEASURED.",
    "indicator: the validated attack-free indicator (report.indicator, higher = more secure) must be >= "
    "min_indicator; unset disables it; one that failed validation is DISABLED, one not validated NOT MEASURED.",
    "utility: the relative increase of validation loss over full precision must be <= max_utility_loss; with "
    "report.utility_metric = kl / same_top / a task metric instead: mean KL per token <= utility_limit, the "
    "same-top share >= utility_limit, or the task metric's drop below full precision <= utility_limit. Its interval "
    "is over runs with at least min_runs runs, else over validation samples (run-to-run variation not covered).",
    "r_q, indicator, utility: FAIL when the whole 95% interval is on the unsafe side of the limit, PASS when it is "
    "on the safe side, INCONCLUSIVE when it crosses the limit; NOT MEASURED without a finite estimate or interval.",
    "Overall: the worst criterion (FAIL > NOT MEASURED > INCONCLUSIVE > PASS); only PASS clears a quantizer for release.",
]
