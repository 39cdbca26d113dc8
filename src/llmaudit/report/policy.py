"""The release checklist and the recommendation: the policy that turns estimates into PASS / FAIL.

Release checklist (`release_checklist`), per quantizer, thresholds from the recipe's `report` section:
  attack_tpr  the highest per-sample-calibrated TPR at 1% FPR over every attack run must be <= max_tpr_at_1pct_fpr
  r_q         r_Q (mean over runs) must be >= min_r_q (min_r_q = 0 disables the criterion: DISABLED; so does a
              failed validation: no audit size can measure it; docs/science.md section 10)
  utility     the relative increase of validation loss vs full precision must be <= max_utility_loss (or, with
              report.utility_metric, the KL / same-top / task-metric figure against utility_limit)
Each criterion is judged conservatively on its estimate and 95% interval:
  NOT MEASURED  the estimate is unreliable: flagged unreliable by the attack module (fewer than 10/alpha
                non-members), fewer than `min_runs` runs, no finite value, or no interval; never PASS
  FAIL          the point estimate is on the unsafe side of the threshold
  PASS          the whole interval is on the safe side
  INCONCLUSIVE  the point estimate is safe but the interval crosses the threshold
For attack_tpr each attack is judged on its own; the criterion FAILs if any attack fails, else it is NOT
MEASURED if any attack is, else INCONCLUSIVE if any is, else PASS. A quantizer's overall status is the
worst of its criteria (FAIL > NOT MEASURED > INCONCLUSIVE > PASS); it is cleared for release only if PASS.

Non-finite numbers: report.json is strict JSON (RFC 8259): NaN and +-inf become null. The counts beside
them (r_Q's n_undefined and n_infinite, `reliable` flags, checklist reasons) say why a value is missing.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from llmaudit.analyze.metrics import fpr_key
from llmaudit.common.formatting import fmt_ci, fmt_num
from llmaudit.report.utility import metric_estimate

PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED = "PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED", "DISABLED"

STATUSES = (PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED)

_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, NOT_MEASURED: 2, FAIL: 3}

DEFAULT_MIN_RUNS = 5
"""Runs (independent fine-tunings) a criterion needs before its interval is trusted; a recipe may set
`report.min_runs`. A bootstrap interval over fewer runs is too coarse to clear a release."""

CHECKLIST_FPR = 0.01


def checklist_tpr(att: dict[str, Any]) -> dict[str, Any]:
    return att["low_fpr"].get("pooled_calibrated", {}).get(fpr_key(CHECKLIST_FPR)) or {
        "tpr": None,
        "ci": None,
        "reliable": False,
    }


def judge(
    value: float | None, ci: list | None, *, limit: float, kind: str, measured: bool, why_not: str = ""
) -> dict[str, Any]:
    """PASS / FAIL / INCONCLUSIVE / NOT MEASURED for one estimate against one limit (rules: module doc).

    kind: "max" (value must be <= limit) or "min" (value must be >= limit)."""
    if not measured:
        return {"status": NOT_MEASURED, "reason": why_not or "estimate unreliable"}
    if value is None:
        return {"status": NOT_MEASURED, "reason": "no finite estimate"}
    unsafe = value > limit if kind == "max" else value < limit
    if unsafe:
        return {"status": FAIL, "reason": f"estimate {value:.4g} {'>' if kind == 'max' else '<'} limit {limit:g}"}
    if ci is None:
        return {"status": NOT_MEASURED, "reason": "no confidence interval (n_boot = 0?)"}
    bound = ci[1] if kind == "max" else ci[0]
    if (bound <= limit) if kind == "max" else (bound >= limit):
        return {
            "status": PASS,
            "reason": f"95% interval [{ci[0]:.4g}, {ci[1]:.4g}] {'<=' if kind == 'max' else '>='} limit {limit:g}",
        }
    return {
        "status": INCONCLUSIVE,
        "reason": f"estimate {value:.4g} is within the limit {limit:g} but the 95% interval [{ci[0]:.4g}, {ci[1]:.4g}] crosses it",
    }


def worst(statuses: Iterable[str]) -> str:
    counted = [s for s in statuses if s in _SEVERITY]
    return max(counted, key=_SEVERITY.__getitem__) if counted else NOT_MEASURED


def thresholds_of(result: dict[str, Any]) -> dict[str, Any]:
    th = dict(result.get("thresholds") or {})
    th.setdefault("min_runs", DEFAULT_MIN_RUNS)
    th.setdefault("min_indicator", None)
    th.setdefault("utility_metric", "loss")
    th.setdefault("utility_limit", None)
    return th


def failed_indicator_reason(name: str) -> str:
    """Why a criterion on an indicator that FAILED validation is DISABLED rather than NOT MEASURED: no audit size
    can measure it (the validation verdict is the indicator's, not this audit's), and an indicator shown not to
    track the attacks is evidence neither for nor against a release; the attack criterion judges leakage."""
    return (
        f"{name} failed validation (docs/science.md section 8): it is not evidence for or against a release at any "
        "audit size, so this criterion is off; the attack criterion judges leakage"
    )


def too_few_negatives_reason(t: dict[str, Any], n_pooled: int | None) -> str:
    """Why a calibrated TPR at 1% FPR is unreliable, with the counts: the non-member scores it was computed on
    (t["n_negatives"]: those with a finite calibrated score) against the pooled non-members (n_pooled) and the
    10 / alpha it needs. The two differ where calibration drops scores: a sample with fewer than 2 OUT
    references among the other models (online LiRA also needs 2 IN), or whose OUT scores have zero spread
    (counting scores such as WBC's and RMIA's); more pooled non-members alone may then not be enough."""
    need = t.get("min_negatives") or int(10 / CHECKLIST_FPR)
    n_cal = t.get("n_negatives")
    if n_cal is None:  # a report.json from before the calibrated count was recorded
        return f"too few non-members for TPR at {CHECKLIST_FPR:.0%} FPR ({n_pooled} pooled, needs >= {need})"
    why = f"too few non-members for TPR at {CHECKLIST_FPR:.0%} FPR ({n_cal} calibrated"
    if n_pooled is not None and n_pooled > n_cal:
        why += (
            f" of {n_pooled} pooled: calibration drops samples with too few OUT references or zero spread across them"
        )
    return why + f"; needs >= {need})"


def _attack_tpr_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    limit, min_runs = float(th["max_tpr_at_1pct_fpr"]), int(th["min_runs"])
    per_attack = {}
    for name, att in row["attacks"].items():
        t = checklist_tpr(att)
        n_models = att.get("n_models") or 0
        if (att.get("not_measured") or {}).get("pooled_calibrated"):
            measured, why = False, att["not_measured"]["pooled_calibrated"]
        elif n_models < min_runs:
            measured, why = False, f"{n_models} target models < min_runs {min_runs}"
        elif not t["reliable"]:
            why = too_few_negatives_reason(t, att.get("n_negatives"))
            measured = False
        else:
            measured, why = True, ""
        verdict = judge(t["tpr"], t["ci"], limit=limit, kind="max", measured=measured, why_not=why)
        if verdict["status"] == NOT_MEASURED and t["tpr"] is not None and t["tpr"] > limit:
            verdict["reason"] += f"; indicative estimate {t['tpr']:.4g} exceeds the limit"
        per_attack[name] = {"value": t["tpr"], "ci": t["ci"], "reliable": t["reliable"]} | verdict
    best = row.get("best_attack") or {}
    out = {
        "id": "attack_tpr",
        "description": f"highest TPR at {CHECKLIST_FPR:.0%} FPR (per-sample calibrated, pooled) over every attack <= limit",
        "threshold": limit,
        "comparison": "<=",
        "attack": best.get("name"),
        "value": best.get("value"),
        "ci": best.get("ci"),
        "reliable": best.get("reliable"),
        "per_attack": per_attack,
        "skipped_attacks": row["skipped_attacks"],
    }
    if not per_attack:
        return out | {"status": NOT_MEASURED, "reason": "no attack was computed"}
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
    return out


def _r_q_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    limit, min_runs = float(th["min_r_q"]), int(th["min_runs"])
    r = row["r_q"]
    out = {
        "id": "r_q",
        "description": "r_Q (mean over runs) >= limit",
        "threshold": limit,
        "comparison": ">=",
        "value": r["mean"],
        "ci": r["ci"],
        "reliable": (r["n_finite"] or 0) >= min_runs,
    }
    if limit <= 0:
        return out | {"status": DISABLED, "reason": "min_r_q = 0 disables this criterion"}
    if row.get("r_q_status", "not validated") == "failed":
        return out | {"status": DISABLED, "reason": failed_indicator_reason("r_Q")}
    if row.get("r_q_status", "not validated") != "passed":
        return out | {
            "status": NOT_MEASURED,
            "reason": f"r_Q's validation status is '{row.get('r_q_status', 'not validated')}' (docs/science.md section 8): "
            "only an indicator that passed validation may drive a criterion",
        }
    n_finite = r["n_finite"] or 0
    why = f"{n_finite} runs with a finite r_Q < min_runs {min_runs}"
    if r["n_undefined"]:
        why += f" ({r['n_undefined']} undefined)"
    return out | judge(r["mean"], r["ci"], limit=limit, kind="min", measured=n_finite >= min_runs, why_not=why)


def _indicator_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    """The validated attack-free indicator (report.indicator) >= report.min_indicator."""
    ind = row.get("indicator") or {}
    limit, min_runs = th.get("min_indicator"), int(th["min_runs"])
    out = {
        "id": "indicator",
        "description": f"{ind.get('name')} (mean over runs, higher = more secure) >= limit",
        "threshold": limit,
        "comparison": ">=",
        "value": ind.get("mean"),
        "ci": ind.get("ci"),
        "reliable": (ind.get("n_finite") or 0) >= min_runs,
    }
    if limit is None:
        return out | {"status": DISABLED, "reason": "report.min_indicator is not set"}
    if ind.get("status") == "failed":
        return out | {"status": DISABLED, "reason": failed_indicator_reason(str(ind.get("name")))}
    if ind.get("status") != "passed":
        return out | {
            "status": NOT_MEASURED,
            "reason": f"{ind.get('name')} has validation status '{ind.get('status')}': only an indicator that passed "
            "validation may drive a criterion",
        }
    n = ind.get("n_finite") or 0
    return out | judge(
        ind.get("mean"),
        ind.get("ci"),
        limit=float(limit),
        kind="min",
        measured=n >= min_runs,
        why_not=f"{n} runs < min_runs {min_runs}",
    )


def _utility_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    metric = th.get("utility_metric") or "loss"
    if metric != "loss":
        return _utility_metric_criterion(row, th, metric)
    limit, min_runs = float(th["max_utility_loss"]), int(th["min_runs"])
    u = row["utility"]
    n_runs = u["n_runs"] or 0
    out = {
        "id": "utility",
        "description": "relative increase of validation loss vs full precision <= limit",
        "metric": "loss",
        "threshold": limit,
        "comparison": "<=",
        "value": u["relative_change"],
        "ci": u["relative_change_ci"],
        "reliable": n_runs >= min_runs,
    }
    if u["relative_change"] is None:
        return out | {"status": NOT_MEASURED, "reason": "no validation loss relative to the reference (missing runs?)"}
    return out | judge(
        u["relative_change"],
        u["relative_change_ci"],
        limit=limit,
        kind="max",
        measured=n_runs >= min_runs,
        why_not=f"{n_runs} runs < min_runs {min_runs}",
    )


def _utility_metric_criterion(row: dict[str, Any], th: dict[str, Any], metric: str) -> dict[str, Any]:
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
        return out | {"status": NOT_MEASURED, "reason": e["missing"]}
    return out | judge(
        e["value"],
        e["ci"],
        limit=e["limit"],
        kind=e["kind"],
        measured=e["n_runs"] >= min_runs,
        why_not=f"{e['n_runs']} runs < min_runs {min_runs}",
    )


def release_checklist(grid: list[dict[str, Any]], thresholds: dict[str, Any]) -> dict[str, Any]:
    """Per quantizer: every criterion with its status, and the overall status (rules: module doc)."""
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
        per_q[row["quantizer"]] = {"overall": worst(c["status"] for c in criteria), "criteria": criteria}
    return {"thresholds": th, "rules": CHECKLIST_RULES, "per_quantizer": per_q}


CHECKLIST_RULES = [
    "attack_tpr: the highest per-sample-calibrated pooled TPR at 1% FPR over every attack run must be <= max_tpr_at_1pct_fpr; "
    "each attack is judged on its own, the criterion takes the worst verdict.",
    "r_q: r_Q (mean over runs) must be >= min_r_q; min_r_q = 0 disables it (DISABLED). Like every indicator, it "
    "drives the checklist only if it passed validation (docs/science.md section 8): one that failed validation is "
    "DISABLED (no audit size can measure it), one not yet validated is NOT MEASURED.",
    "indicator: the validated attack-free indicator (report.indicator, higher = more secure) must be >= "
    "min_indicator; unset disables it; one that failed validation is DISABLED, one not validated NOT MEASURED.",
    "utility: the relative increase of validation loss over full precision must be <= max_utility_loss; with "
    "report.utility_metric = kl / same_top / a task metric instead: mean KL per token <= utility_limit, the "
    "same-top share >= utility_limit, or the task metric's drop below full precision <= utility_limit.",
    "NOT MEASURED: the estimate is unreliable (fewer than 10/alpha non-members, fewer than min_runs runs, no finite value, "
    "or no interval). An unreliable estimate is never PASS.",
    "FAIL: the point estimate is on the unsafe side of the limit. PASS: the whole 95% interval is on the safe side. "
    "INCONCLUSIVE: the point estimate is safe but the interval crosses the limit.",
    "Overall: the worst criterion (FAIL > NOT MEASURED > INCONCLUSIVE > PASS); only PASS clears a quantizer for release.",
]


def _validated_mean(estimate: dict[str, Any] | None, status: str | None) -> float:
    """An indicator's mean as a tie-break key: -inf unless it passed validation and is finite."""
    mean = (estimate or {}).get("mean")
    if status != "passed" or mean is None or not math.isfinite(mean):
        return -math.inf
    return float(mean)


def _privacy_key(r: dict[str, Any], checklist: dict[str, Any]) -> tuple:
    """recommend()'s ordering of one candidate grid row r (lower = more private): a failed privacy criterion,
    the upper TPR bound, the best-attack AUROC, minus the validated indicator, minus the validated r_Q."""
    q = r["quantizer"]
    failed = any(_crit(checklist, q, c)["status"] == FAIL for c in ("attack_tpr", "r_q"))
    best = r.get("best_attack") or {}
    tpr_bound = (best.get("ci") or [None, best.get("value")])[1]
    auroc = (r.get("best_attack_by_auroc") or {}).get("value")
    return (
        failed,
        tpr_bound if tpr_bound is not None else math.inf,
        auroc if auroc is not None else math.inf,
        -_validated_mean(r.get("indicator"), (r.get("indicator") or {}).get("status")),
        -_validated_mean(r.get("r_q"), r.get("r_q_status")),
    )


def recommend(grid: list[dict[str, Any]], checklist: dict[str, Any]) -> dict[str, Any]:
    """The most private quantizer within the utility budget.

    Candidates: quantizers whose utility criterion is PASS. Most private: no failed privacy criterion
    first, then the lowest upper 95% bound of the best attack's calibrated TPR at 1% FPR (the point
    estimate where no interval exists), then the lowest AUROC of the strongest attack (small experiments tie
    on the TPR, often all at 0), then the highest validated indicator and the highest r_Q, each only if it
    passed validation (docs/science.md section 8): a failed indicator never decides."""
    rule = (
        "candidates: utility criterion PASS; order: no failed privacy criterion, then lowest upper 95% bound of the best "
        "attack's calibrated TPR at 1% FPR, then lowest best-attack AUROC, then highest validated indicator, then "
        "highest r_Q if r_Q passed validation"
    )
    per_q = checklist["per_quantizer"]

    def crit(q: str, cid: str) -> dict[str, Any]:
        return next(c for c in per_q[q]["criteria"] if c["id"] == cid)

    candidates = [r for r in grid if crit(r["quantizer"], "utility")["status"] == PASS]
    if not candidates:
        return {
            "quantizer": None,
            "rule": rule,
            "overall": None,
            "cleared_for_release": False,
            "reason": "no quantizer is within the utility budget with a PASS (see the utility criterion)",
        }

    def key(r: dict[str, Any]) -> tuple:
        return _privacy_key(r, checklist)

    ranked = sorted(candidates, key=key)
    chosen = ranked[0]
    q = chosen["quantizer"]
    overall = per_q[q]["overall"]
    best = chosen.get("best_attack") or {}
    why = [f"{c['id']} {c['status']}" for c in per_q[q]["criteria"] if c["status"] not in (PASS, DISABLED)]
    reason = f"most private of {len(candidates)} quantizer(s) within the utility budget" + (
        f"; best attack {best.get('name')} TPR at 1% FPR {fmt_num(best.get('value'))}{fmt_ci(best.get('ci'))}"
        if best
        else ""
    )
    reason += (
        "; cleared for release (every criterion PASS)"
        if overall == PASS
        else f"; NOT cleared for release ({', '.join(why)})"
    )
    return {
        "quantizer": q,
        "rule": rule,
        "overall": overall,
        "cleared_for_release": overall == PASS,
        "reason": reason,
        "candidates": [r["quantizer"] for r in candidates],
        "ranking": [r["quantizer"] for r in ranked],
        "runner_up": _runner_up(key(ranked[0]), ranked[1:2], key),
    }


_KEY_WORDS = (
    "a failed privacy criterion",
    "the upper 95% bound of its best attack's TPR at 1% FPR",
    "its best-attack AUROC",
    "its validated indicator",
    "its r_Q",
)


def _runner_up(chosen_key: tuple, rest: list[dict[str, Any]], key) -> dict[str, Any] | None:
    """The second-ranked candidate and the first ordering key on which it lost to the chosen one."""
    if not rest:
        return None
    theirs = key(rest[0])
    i = next((i for i, (a, b) in enumerate(zip(chosen_key, theirs)) if a != b), None)
    if i is None:
        return {"quantizer": rest[0]["quantizer"], "lost_on": "a tie on every key (grid order decided)"}
    if i == 0:
        lost = _KEY_WORDS[0]
    else:
        sign = -1 if i >= 3 else 1  # keys 3 and 4 are negated (higher is better)
        lost = f"{_KEY_WORDS[i]}: {fmt_num(sign * theirs[i])} against {fmt_num(sign * chosen_key[i])}"
    return {"quantizer": rest[0]["quantizer"], "lost_on": lost}


def _crit(checklist: dict[str, Any], q: str, cid: str) -> dict[str, Any]:
    return next(c for c in checklist["per_quantizer"][q]["criteria"] if c["id"] == cid)


def criterion_phrase(c: dict[str, Any]) -> str:
    """One criterion in words: its name, estimate with 95% interval, the limit and the status."""
    name = {"attack_tpr": "attack TPR at 1% FPR", "r_q": "r_Q", "indicator": "indicator", "utility": "utility"}[c["id"]]
    if c["id"] == "attack_tpr" and c.get("attack"):
        name += f" ({c['attack']})"
    if c["id"] == "utility":
        name += f" ({c.get('metric', 'loss')})"
    limit = "no limit" if c.get("threshold") is None else f"limit {c['comparison']} {c['threshold']:g}"
    return f"{name} {fmt_num(c.get('value'))}{fmt_ci(c.get('ci'))} against {limit}: {c['status']}"


def _deciding(checklist: dict[str, Any], q: str) -> dict[str, Any] | None:
    """The criterion that keeps quantizer q from PASS: the worst-judged one (first in checklist order)."""
    bad = [c for c in checklist["per_quantizer"][q]["criteria"] if c["status"] in _SEVERITY and c["status"] != PASS]
    return max(bad, key=lambda c: _SEVERITY[c["status"]]) if bad else None


def _excess(c: dict[str, Any]) -> float:
    """How far criterion c's estimate is on the unsafe side of its limit (negative: safe side; inf: no estimate)."""
    if c.get("value") is None or c.get("threshold") is None:
        return math.inf
    return c["value"] - c["threshold"] if c.get("comparison") == "<=" else c["threshold"] - c["value"]


def _what_to_do(c: dict[str, Any]) -> str:
    """What would turn criterion c into PASS, said from its own numbers."""
    if c["status"] == NOT_MEASURED:
        return f"grow the measurement behind {c['id']}: {c.get('reason')}"
    if c["status"] == FAIL:
        return (
            f"{c['id']} fails on its estimate {fmt_num(c.get('value'))}: only a limit beyond it, or a less leaky "
            "fine-tuning, changes that"
        )
    ci = c.get("ci") or [None, None]
    bound = ci[1] if c.get("comparison") == "<=" else ci[0]
    return (
        f"the {c['id']} interval reaches {fmt_num(bound)}, across the limit {c['threshold']:g}: more runs or more "
        f"non-members narrow it (or a limit of {fmt_num(bound)} would clear it)"
    )


def explain_recommendation(recommendation: dict[str, Any], checklist: dict[str, Any]) -> str:
    """The recommendation in one paragraph a release manager can read: the quantizer, cleared or not and which
    criterion decided (its number and interval against the limit), the runner-up and why it lost, and what to
    do when nothing is cleared."""
    per_q = checklist["per_quantizer"]
    q = recommendation.get("quantizer")
    if q is None:
        utility = {name: _crit(checklist, name, "utility") for name in per_q}
        closest = min(utility.items(), key=lambda kv: (_SEVERITY.get(kv[1]["status"], 9), _excess(kv[1])))
        return (
            f"No quantizer can be released: none keeps enough utility with a PASS (utility criterion). Closest: "
            f"{closest[0]}, {criterion_phrase(closest[1])}. To release one, {_what_to_do(closest[1])}."
        )
    cleared = recommendation.get("cleared_for_release")
    text = f"Release {q}" if cleared else f"The best candidate is {q}, but it is NOT cleared for release"
    decided = _deciding(checklist, q)
    if cleared:
        text += ": every criterion passes; " + "; ".join(
            criterion_phrase(c) for c in per_q[q]["criteria"] if c["status"] == PASS
        )
    else:
        text += f": {criterion_phrase(decided)}" if decided else ""
    text += "."
    runner = recommendation.get("runner_up")
    if runner:
        lost = _deciding(checklist, runner["quantizer"])
        text += f" Runner-up: {runner['quantizer']}, which lost on {runner['lost_on']}"
        text += f"; its weakest criterion: {criterion_phrase(lost)}." if lost else "; every criterion PASS."
    else:
        text += " No other quantizer is within the utility budget."
    if not cleared and decided:
        text += f" To clear it, {_what_to_do(decided)}."
    return text
