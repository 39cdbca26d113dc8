"""`llmaudit report`: the quantizer grid, privacy and utility side by side, full precision as reference.

One result object (`analysis.analyze`) rendered three ways from one built report (`build_report`):
report.json (complete, strict JSON, validated against `REPORT_SCHEMA`), report.md and a self-contained
report.html (inline CSS, figures embedded as base64 PNG, no scripts, no external resources). The figures
are also written as PNG files under report/plots/.

Privacy of the report itself: no training text appears in any output. Samples are named by id and score
only; their text is added only with `include_samples=True` (`llmaudit report --include-samples`).

Release checklist (`release_checklist`), per quantizer, thresholds from the recipe's `report` section:
  attack_tpr  the highest per-sample-calibrated TPR at 1% FPR over every attack run must be <= max_tpr_at_1pct_fpr
  r_q         r_Q (mean over runs) must be >= min_r_q (min_r_q = 0 disables the criterion: DISABLED)
  utility     the relative increase of validation loss vs full precision must be <= max_utility_loss
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

import base64
import datetime as _dt
import html
import json
import math
import re
from typing import Any, Iterable, Optional

from llmaudit.io import atomic_write_bytes, atomic_write_text
from llmaudit.metrics import fpr_key
from llmaudit.store import RunStore

REPORT_SCHEMA_VERSION = 2
PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED = "PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED", "DISABLED"
STATUSES = (PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, DISABLED)
_SEVERITY = {PASS: 0, INCONCLUSIVE: 1, NOT_MEASURED: 2, FAIL: 3}
DEFAULT_MIN_RUNS = 5
"""Runs (independent fine-tunings) a criterion needs before its interval is trusted; a recipe may set
`report.min_runs`. A bootstrap interval over fewer runs is too coarse to clear a release."""
CHECKLIST_FPR = 0.01
LOW_FPRS = (0.05, 0.01, 0.001)
EVALUATIONS = ("pooled_naive", "pooled_calibrated", "per_sample")
VULNERABLE_TOP_K = 20


class ReportSchemaError(ValueError):
    """The built report does not match REPORT_SCHEMA: a bug in the report (or the result object)."""


# ------------------------------------------------------------------------------------------ numbers


def _num(x: Any) -> Optional[float]:
    """A finite float, or None (for None, NaN, +-inf and anything not a number)."""
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _interval(low: Any, high: Any) -> Optional[list]:
    lo, hi = _num(low), _num(high)
    return None if lo is None or hi is None else [lo, hi]


def strict_json(obj: Any) -> Any:
    """A copy of `obj` that strict JSON parsers read: non-finite floats become None, numpy scalars and
    arrays become Python numbers and lists, tuples become lists."""
    if isinstance(obj, dict):
        return {str(k): strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return strict_json(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj


# ------------------------------------------------------------------------------------------ the grid


def _tpr_ci(block: dict, key: str) -> Optional[list]:
    # pooled_naive stores ci.tpr_at_fpr[key] = {low, high}; the other evaluations {tpr: {low, high}, ...}
    c = ((block.get("ci") or {}).get("tpr_at_fpr") or {}).get(key) or {}
    c = c.get("tpr", c)
    return _interval(c.get("low"), c.get("high"))


def attack_summary(entry: dict[str, Any], n_models: Optional[int]) -> dict[str, Any]:
    """One attack on one quantizer: AUROC and TPR at low FPR, each with its 95% interval and reliability."""
    naive = entry.get("pooled_naive") or {}
    calib = entry.get("pooled_calibrated") or {}
    roc_ci = (naive.get("ci") or {}).get("auroc") or {}
    low_fpr: dict[str, dict[str, Any]] = {}
    for evaluation in EVALUATIONS:
        block = entry.get(evaluation) or {}
        low_fpr[evaluation] = {}
        for alpha in LOW_FPRS:
            key = fpr_key(alpha)
            t = (block.get("tpr_at_fpr") or {}).get(key)
            if t is None:
                continue
            low_fpr[evaluation][key] = {
                "tpr": _num(t.get("tpr")),
                "ci": _tpr_ci(block, key),
                "reliable": bool(t.get("reliable", False)),
                "min_negatives": t.get("min_negatives"),
            }
    return {
        "definition": entry.get("definition"),
        "auroc": _num(naive.get("auroc")),
        "auroc_ci": _interval(roc_ci.get("low"), roc_ci.get("high")),
        "auroc_calibrated": _num((calib.get("roc") or {}).get("auroc")),
        "average_precision": _num(naive.get("average_precision")),
        "n_positives": naive.get("n_positives"),
        "n_negatives": naive.get("n_negatives"),
        "n_models": n_models,
        "n_nan_scores": entry.get("n_nan_scores"),
        "low_fpr": low_fpr,
    }


def _checklist_tpr(att: dict[str, Any]) -> dict[str, Any]:
    return att["low_fpr"].get("pooled_calibrated", {}).get(fpr_key(CHECKLIST_FPR)) or {"tpr": None, "ci": None, "reliable": False}


def _ordered_quantizers(result: dict[str, Any]) -> list[str]:
    ref = result.get("reference_quantizer")
    qs = list(result["quantizers"])
    return ([ref] if ref in qs else []) + [q for q in qs if q != ref]


def grid_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per quantizer, the full-precision reference first: size, utility, r_Q, every attack."""
    rq = (result.get("indicator") or {}).get("per_quantizer") or {}
    per_q_attacks = (result.get("attacks") or {}).get("quantizers") or {}
    ref = result.get("reference_quantizer")
    ref_size = _num((result["quantizer_info"].get(ref) or {}).get("model_size_bytes"))
    rows = []
    for q in _ordered_quantizers(result):
        info = result["quantizer_info"].get(q, {})
        util = result["utility"].get(q, {})
        agg = (rq.get(q) or {}).get("r_q") or {}
        att_block = per_q_attacks.get(q) or {}
        n_models = att_block.get("n_models")
        size = _num(info.get("model_size_bytes"))
        attacks = {name: attack_summary(a, n_models) for name, a in (att_block.get("attacks") or {}).items()}
        row = {
            "quantizer": q,
            "is_reference": q == ref,
            "family": info.get("family"),
            "bits": _num(info.get("bits")),
            "effective_bits": _num(info.get("effective_bits")),
            "model_size_bytes": size,
            "size_vs_reference": size / ref_size if size is not None and ref_size else None,
            "utility": {
                "val_loss": _num(util.get("val_loss")),
                "val_loss_ci": (util.get("val_loss_ci") and _interval(*util["val_loss_ci"])) or None,
                "relative_change": _num(util.get("relative_change")),
                "relative_change_ci": (util.get("relative_change_ci") and _interval(*util["relative_change_ci"])) or None,
                "n_runs": util.get("n_runs"),
                "task_metrics": {
                    name: {"value": _num(m.get("value")), "ci": _interval(*(m.get("ci") or [None, None])),
                           "higher_is_better": m.get("higher_is_better")}
                    for name, m in (util.get("task_metrics") or {}).items()
                },
            },
            "r_q": {
                "mean": _num(agg.get("mean")),
                "ci": _interval(agg.get("ci_low"), agg.get("ci_high")),
                "std": _num(agg.get("std")),
                "median": _num(agg.get("median")),
                "rank": _num((rq.get(q) or {}).get("rank")),
                "n_runs": agg.get("n_runs"),
                "n_finite": agg.get("n_finite"),
                "n_undefined": agg.get("n_undefined"),
                "n_infinite": agg.get("n_infinite"),
            },
            "n_models": n_models,
            "attacks": attacks,
            "skipped_attacks": dict(att_block.get("skipped") or {}),
            "best_attack": None,
            "best_attack_by_auroc": None,
        }
        by_tpr = [(n, _checklist_tpr(a)) for n, a in attacks.items() if _checklist_tpr(a)["tpr"] is not None]
        if by_tpr:
            name, t = max(by_tpr, key=lambda item: item[1]["tpr"])
            row["best_attack"] = {"name": name, "metric": "tpr_at_1pct_fpr_calibrated",
                                  "value": t["tpr"], "ci": t["ci"], "reliable": t["reliable"]}
        by_auroc = [(n, a) for n, a in attacks.items() if a["auroc"] is not None]
        if by_auroc:
            name, a = max(by_auroc, key=lambda item: item[1]["auroc"])
            row["best_attack_by_auroc"] = {"name": name, "metric": "auroc", "value": a["auroc"], "ci": a["auroc_ci"]}
        rows.append(row)
    return rows


def r_q_vs_best_attack(grid: list[dict[str, Any]]) -> dict[str, Any]:
    """Spearman rho across quantizers between mean r_Q and the best attack's metric (expected negative)."""
    from scipy import stats

    out: dict[str, Any] = {}
    for metric, key in (("tpr_at_1pct_calibrated", "best_attack"), ("auroc", "best_attack_by_auroc")):
        pairs = [(r["r_q"]["mean"], (r.get(key) or {}).get("value")) for r in grid]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
        if len(pairs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
            out[metric] = {"rho": None, "p_value": None, "n_quantizers": len(pairs), "reason": "needs >= 3 quantizers with distinct values"}
            continue
        res = stats.spearmanr(xs, ys)
        out[metric] = {"rho": _num(res.statistic), "p_value": _num(res.pvalue), "n_quantizers": len(pairs)}
    return out


# ------------------------------------------------------------------------------------------ checklist


def judge(value: Optional[float], ci: Optional[list], *, limit: float, kind: str, measured: bool, why_not: str = "") -> dict[str, Any]:
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
        return {"status": PASS, "reason": f"95% interval [{ci[0]:.4g}, {ci[1]:.4g}] {'<=' if kind == 'max' else '>='} limit {limit:g}"}
    return {"status": INCONCLUSIVE, "reason": f"estimate {value:.4g} is within the limit {limit:g} but the 95% interval [{ci[0]:.4g}, {ci[1]:.4g}] crosses it"}


def worst(statuses: Iterable[str]) -> str:
    counted = [s for s in statuses if s in _SEVERITY]
    return max(counted, key=_SEVERITY.__getitem__) if counted else NOT_MEASURED


def thresholds_of(result: dict[str, Any]) -> dict[str, Any]:
    th = dict(result.get("thresholds") or {})
    th.setdefault("min_runs", DEFAULT_MIN_RUNS)
    return th


def _attack_tpr_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    limit, min_runs = float(th["max_tpr_at_1pct_fpr"]), int(th["min_runs"])
    per_attack = {}
    for name, att in row["attacks"].items():
        t = _checklist_tpr(att)
        n_models = att.get("n_models") or 0
        if n_models < min_runs:
            measured, why = False, f"{n_models} target models < min_runs {min_runs}"
        elif not t["reliable"]:
            why = f"too few non-members for TPR at {CHECKLIST_FPR:.0%} FPR (needs >= {t.get('min_negatives') or int(10 / CHECKLIST_FPR)})"
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
    deciding = max(per_attack.items(), key=lambda kv: (_SEVERITY[kv[1]["status"]], kv[1]["value"] if kv[1]["value"] is not None else -1.0))
    out["status"] = status
    out["reason"] = f"{deciding[0]}: {deciding[1]['reason']}"
    if status == PASS:
        out["reason"] = f"every attack's 95% interval <= {limit:g} (highest: {out['attack']})"
    return out


def _r_q_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    limit, min_runs = float(th["min_r_q"]), int(th["min_runs"])
    r = row["r_q"]
    out = {"id": "r_q", "description": "r_Q (mean over runs) >= limit", "threshold": limit, "comparison": ">=",
           "value": r["mean"], "ci": r["ci"], "reliable": (r["n_finite"] or 0) >= min_runs}
    if limit <= 0:
        return out | {"status": DISABLED, "reason": "min_r_q = 0 disables this criterion"}
    n_finite = r["n_finite"] or 0
    why = f"{n_finite} runs with a finite r_Q < min_runs {min_runs}"
    if r["n_undefined"]:
        why += f" ({r['n_undefined']} undefined)"
    return out | judge(r["mean"], r["ci"], limit=limit, kind="min", measured=n_finite >= min_runs, why_not=why)


def _utility_criterion(row: dict[str, Any], th: dict[str, Any]) -> dict[str, Any]:
    limit, min_runs = float(th["max_utility_loss"]), int(th["min_runs"])
    u = row["utility"]
    n_runs = u["n_runs"] or 0
    out = {"id": "utility", "description": "relative increase of validation loss vs full precision <= limit",
           "threshold": limit, "comparison": "<=", "value": u["relative_change"], "ci": u["relative_change_ci"],
           "reliable": n_runs >= min_runs}
    if u["relative_change"] is None:
        return out | {"status": NOT_MEASURED, "reason": "no validation loss relative to the reference (missing runs?)"}
    return out | judge(u["relative_change"], u["relative_change_ci"], limit=limit, kind="max",
                       measured=n_runs >= min_runs, why_not=f"{n_runs} runs < min_runs {min_runs}")


def release_checklist(grid: list[dict[str, Any]], thresholds: dict[str, Any]) -> dict[str, Any]:
    """Per quantizer: every criterion with its status, and the overall status (rules: module doc)."""
    th = dict(thresholds)
    th.setdefault("min_runs", DEFAULT_MIN_RUNS)
    per_q = {}
    for row in grid:
        criteria = [_attack_tpr_criterion(row, th), _r_q_criterion(row, th), _utility_criterion(row, th)]
        per_q[row["quantizer"]] = {"overall": worst(c["status"] for c in criteria), "criteria": criteria}
    return {"thresholds": th, "rules": CHECKLIST_RULES, "per_quantizer": per_q}


CHECKLIST_RULES = [
    "attack_tpr: the highest per-sample-calibrated pooled TPR at 1% FPR over every attack run must be <= max_tpr_at_1pct_fpr; "
    "each attack is judged on its own, the criterion takes the worst verdict.",
    "r_q: r_Q (mean over runs) must be >= min_r_q; min_r_q = 0 disables it (DISABLED).",
    "utility: the relative increase of validation loss over full precision must be <= max_utility_loss.",
    "NOT MEASURED: the estimate is unreliable (fewer than 10/alpha non-members, fewer than min_runs runs, no finite value, "
    "or no interval). An unreliable estimate is never PASS.",
    "FAIL: the point estimate is on the unsafe side of the limit. PASS: the whole 95% interval is on the safe side. "
    "INCONCLUSIVE: the point estimate is safe but the interval crosses the limit.",
    "Overall: the worst criterion (FAIL > NOT MEASURED > INCONCLUSIVE > PASS); only PASS clears a quantizer for release.",
]


def recommend(grid: list[dict[str, Any]], checklist: dict[str, Any]) -> dict[str, Any]:
    """The most private quantizer within the utility budget.

    Candidates: quantizers whose utility criterion is PASS. Most private: no failed privacy criterion
    first, then the lowest upper 95% bound of the best attack's calibrated TPR at 1% FPR (the point
    estimate where no interval exists), then the highest mean r_Q."""
    rule = ("candidates: utility criterion PASS; order: no failed privacy criterion, then lowest upper 95% bound of the best "
            "attack's calibrated TPR at 1% FPR, then highest r_Q")
    per_q = checklist["per_quantizer"]

    def crit(q: str, cid: str) -> dict[str, Any]:
        return next(c for c in per_q[q]["criteria"] if c["id"] == cid)

    candidates = [r for r in grid if crit(r["quantizer"], "utility")["status"] == PASS]
    if not candidates:
        return {"quantizer": None, "rule": rule, "overall": None, "cleared_for_release": False,
                "reason": "no quantizer is within the utility budget with a PASS (see the utility criterion)"}

    def key(r: dict[str, Any]) -> tuple:
        q = r["quantizer"]
        failed = any(crit(q, c)["status"] == FAIL for c in ("attack_tpr", "r_q"))
        best = r.get("best_attack") or {}
        tpr_bound = (best.get("ci") or [None, best.get("value")])[1]
        r_q = r["r_q"]["mean"]
        return (failed, tpr_bound if tpr_bound is not None else math.inf, -(r_q if r_q is not None else -math.inf))

    chosen = min(candidates, key=key)
    q = chosen["quantizer"]
    overall = per_q[q]["overall"]
    best = chosen.get("best_attack") or {}
    why = [f"{c['id']} {c['status']}" for c in per_q[q]["criteria"] if c["status"] not in (PASS, DISABLED)]
    reason = (f"most private of {len(candidates)} quantizer(s) within the utility budget"
              + (f"; best attack {best.get('name')} TPR at 1% FPR {_f(best.get('value'))}{_ci(best.get('ci'))}" if best else ""))
    reason += "; cleared for release (every criterion PASS)" if overall == PASS else f"; NOT cleared for release ({', '.join(why)})"
    return {"quantizer": q, "rule": rule, "overall": overall, "cleared_for_release": overall == PASS, "reason": reason,
            "candidates": [r["quantizer"] for r in candidates]}


# ------------------------------------------------------------------------------------------ samples


def vulnerable_samples(result: dict[str, Any], grid: list[dict[str, Any]], *, include_samples: bool = False,
                       records: Optional[list[dict]] = None, top_k: int = VULNERABLE_TOP_K) -> dict[str, Any]:
    """The most vulnerable samples of the reference quantizer, by id and score.

    Read from the result object (analysis must record them): per attack,
    result["attacks"]["quantizers"][Q]["attacks"][ATTACK]["vulnerable_samples"] = [{"sample_id", "score"}, ...]
    (highest score first), or per quantizer result["attacks"]["quantizers"][Q]["vulnerable_samples"] as such
    a list or as {"attack", "score_definition", "samples": [...]}. The attack used is the reference's best
    attack (highest calibrated TPR at 1% FPR) among those that recorded samples. Text is added only when
    include_samples is True, from `records` (data/pool.jsonl) matched by sample_id."""
    ref = result.get("reference_quantizer")
    block = ((result.get("attacks") or {}).get("quantizers") or {}).get(ref) or {}
    row = next((r for r in grid if r["quantizer"] == ref), None)
    order = sorted((row or {}).get("attacks", {}), key=lambda n: -(_checklist_tpr(row["attacks"][n])["tpr"] or -1.0)) if row else []
    attack, samples, definition = None, None, None
    for name in order:
        vs = ((block.get("attacks") or {}).get(name) or {}).get("vulnerable_samples")
        if vs:
            attack, samples = name, vs
            break
    if samples is None and block.get("vulnerable_samples"):
        vs = block["vulnerable_samples"]
        if isinstance(vs, dict):
            attack, samples, definition = vs.get("attack"), vs.get("samples") or [], vs.get("score_definition")
        else:
            samples = vs
    out: dict[str, Any] = {"quantizer": ref, "attack": attack, "score_definition": definition,
                           "include_samples": include_samples, "available": bool(samples), "samples": []}
    if not samples:
        out["note"] = ("not recorded: the result object holds no per-sample attack scores "
                       "(result['attacks']['quantizers'][Q]['attacks'][ATTACK]['vulnerable_samples'])")
        return out
    by_id = {str(r.get("sample_id")): r for r in (records or [])} if include_samples else {}
    ranked = sorted(samples, key=lambda s: -(_num(s.get("score")) if _num(s.get("score")) is not None else -math.inf))
    for rank, s in enumerate(ranked[:top_k], start=1):
        item = {"rank": rank, "sample_id": str(s["sample_id"]), "score": _num(s.get("score"))}
        if include_samples:
            rec = by_id.get(item["sample_id"])
            item["text"] = None if rec is None else "\n".join(str(rec.get(k, "")) for k in ("input", "output"))
        out["samples"].append(item)
    out["note"] = ("sample text included (--include-samples)" if include_samples
                   else "ids and scores only; the text is included only with --include-samples")
    return out


# ------------------------------------------------------------------------------------------ build


def _provenance(result: dict[str, Any]) -> dict[str, Any]:
    exp = result["experiment"]
    attacks = result.get("attacks") or {}
    indicator = result.get("indicator") or {}
    return {
        "experiment_name": exp.get("name"),
        "run_dir": exp.get("run_dir"),
        "identity_hash": exp.get("identity_hash"),
        "model": exp.get("model"),
        "adapter": exp.get("lora"),
        "parameters": exp.get("parameters"),
        "train": exp.get("train"),
        "data": exp.get("data"),
        "membership": exp.get("membership"),
        "seeds": exp.get("seeds"),
        "library_versions": exp.get("versions"),
        "llmaudit_version": result.get("llmaudit_version"),
        "result_schema_version": result.get("schema_version"),
        "attack_definitions": attacks.get("attack_definitions"),
        "attack_settings": attacks.get("settings"),
        "indicator_protocol": indicator.get("protocol"),
    }


def _memorization_summary(mem: Optional[dict[str, Any]], order: list[str]) -> Optional[dict[str, Any]]:
    if not mem:
        return None
    keys = ("member_mean_bits", "nonmember_mean_bits", "mean_difference_bits", "excess_member_bits",
            "member_bits_per_adapter_param", "member_bits_per_model_param")
    per_q = {}
    for q in order:
        entry = (mem.get("per_quantizer") or {}).get(q)
        if entry:
            per_q[q] = {"n_runs": len(entry.get("runs") or [])} | {
                k: {"mean": _num((entry.get(k) or {}).get("mean")),
                    "ci": _interval((entry.get(k) or {}).get("low"), (entry.get(k) or {}).get("high"))} for k in keys}
    cap = mem.get("capacity") or {}
    ratios = [_num(r.get("adapter_capacity_over_information")) for r in cap.get("per_run") or []]
    ratios = sorted(r for r in ratios if r is not None)
    return {
        "definition": mem.get("definition"),
        "reference": mem.get("reference"),
        "interval": mem.get("interval"),
        "per_quantizer": per_q,
        "adapter_capacity_bits": _num(cap.get("adapter_capacity_bits")),
        "model_capacity_bits": _num(cap.get("model_capacity_bits")),
        "median_adapter_capacity_over_information": ratios[len(ratios) // 2] if ratios else None,
        "capacity_note": cap.get("note"),
        "notes": list(mem.get("notes") or []),
        "per_run_detail": "result.memorization.per_run (report.json only)",
    }


def build_report(result: dict[str, Any], *, include_samples: bool = False, sample_records: Optional[list[dict]] = None) -> dict[str, Any]:
    """The report object every rendering is made from. Strict JSON (non-finite numbers as null)."""
    grid = grid_rows(result)
    thresholds = thresholds_of(result)
    checklist = release_checklist(grid, thresholds)
    attacks = result.get("attacks") or {}
    report = {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "llmaudit_version": result.get("llmaudit_version"),
        "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "include_samples": bool(include_samples),
        "non_finite_policy": "NaN and +-inf are written as null (strict JSON); counts and reasons beside them say why",
        "provenance": _provenance(result),
        "reference_quantizer": result.get("reference_quantizer"),
        "quantizers": [r["quantizer"] for r in grid],
        "grid": grid,
        "checklist": checklist,
        "recommendation": recommend(grid, checklist),
        "r_q_vs_best_attack": r_q_vs_best_attack(grid),
        "spearman_r_q_vs_attacks": attacks.get("spearman_vs_r_q"),
        "indicator_stability": (result.get("indicator") or {}).get("stability"),
        "memorization": _memorization_summary(result.get("memorization"), [r["quantizer"] for r in grid]),
        "vulnerable_samples": vulnerable_samples(result, grid, include_samples=include_samples, records=sample_records),
        "plots": {},
        "result": result,
    }
    return strict_json(report)


# ------------------------------------------------------------------------------------------ schema

_NUM = {"type": ["number", "null"]}
_INT = {"type": ["integer", "null"]}
_STR = {"type": ["string", "null"]}
_CI = {"oneOf": [{"type": "null"}, {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}]}
_STATUS = {"enum": list(STATUSES)}
_OBJ = {"type": "object"}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "llmaudit/report_schema/v2",
    "title": "llmaudit report",
    "type": "object",
    "required": ["report_schema_version", "llmaudit_version", "include_samples", "provenance", "reference_quantizer",
                 "quantizers", "grid", "checklist", "recommendation", "vulnerable_samples", "plots", "result"],
    "properties": {
        "report_schema_version": {"const": REPORT_SCHEMA_VERSION},
        "llmaudit_version": {"type": "string"},
        "generated_utc": {"type": "string"},
        "include_samples": {"type": "boolean"},
        "non_finite_policy": {"type": "string"},
        "provenance": {
            "type": "object",
            "required": ["model", "adapter", "data", "membership", "seeds", "library_versions", "llmaudit_version",
                         "attack_definitions", "identity_hash"],
            "properties": {
                "model": {"type": "string"},
                "adapter": _OBJ,
                "data": {"type": "object", "required": ["fingerprint"], "properties": {"fingerprint": {"type": "string"}}},
                "membership": {"type": "object", "required": ["runs", "pool_size", "n_train"]},
                "seeds": _OBJ,
                "library_versions": {"type": "object", "additionalProperties": _STR},
                "llmaudit_version": {"type": "string"},
                "attack_definitions": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
                "identity_hash": {"type": "string"},
            },
        },
        "reference_quantizer": {"type": "string"},
        "quantizers": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "grid": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/grid_row"}},
        "checklist": {
            "type": "object",
            "required": ["thresholds", "rules", "per_quantizer"],
            "properties": {
                "thresholds": {
                    "type": "object",
                    "required": ["max_tpr_at_1pct_fpr", "min_r_q", "max_utility_loss", "min_runs"],
                    "properties": {"max_tpr_at_1pct_fpr": {"type": "number"}, "min_r_q": {"type": "number"},
                                   "max_utility_loss": {"type": "number"}, "min_runs": {"type": "integer"}},
                },
                "rules": {"type": "array", "items": {"type": "string"}},
                "per_quantizer": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["overall", "criteria"],
                    "properties": {
                        "overall": {"enum": [PASS, FAIL, INCONCLUSIVE, NOT_MEASURED]},
                        "criteria": {"type": "array", "minItems": 3, "items": {"$ref": "#/$defs/criterion"}},
                    },
                }},
            },
        },
        "recommendation": {
            "type": "object",
            "required": ["quantizer", "rule", "overall", "cleared_for_release", "reason"],
            "properties": {"quantizer": _STR, "rule": {"type": "string"}, "overall": {"enum": [PASS, FAIL, INCONCLUSIVE, NOT_MEASURED, None]},
                           "cleared_for_release": {"type": "boolean"}, "reason": {"type": "string"}},
        },
        "r_q_vs_best_attack": _OBJ,
        "spearman_r_q_vs_attacks": {"type": ["object", "null"]},
        "indicator_stability": {"type": ["object", "null"]},
        "memorization": {"type": ["object", "null"]},
        "vulnerable_samples": {
            "type": "object",
            "required": ["quantizer", "attack", "available", "include_samples", "samples"],
            "properties": {
                "available": {"type": "boolean"},
                "include_samples": {"type": "boolean"},
                "samples": {"type": "array", "items": {
                    "type": "object", "required": ["rank", "sample_id", "score"],
                    "properties": {"rank": {"type": "integer"}, "sample_id": {"type": "string"}, "score": _NUM, "text": _STR},
                    "additionalProperties": False,
                }},
            },
        },
        "plots": {"type": "object", "additionalProperties": {"type": "string"}},
        "result": {"type": "object", "required": ["experiment", "quantizers", "utility", "indicator", "attacks"]},
    },
    # privacy of the report itself: without include_samples, no sample may carry text
    "if": {"properties": {"include_samples": {"const": False}}},
    "then": {"properties": {"vulnerable_samples": {"properties": {"samples": {"items": {"not": {"required": ["text"]}}}}}}},
    "$defs": {
        "interval_value": {"type": "object", "required": ["mean", "ci"], "properties": {"mean": _NUM, "ci": _CI}},
        "tpr": {"type": "object", "required": ["tpr", "ci", "reliable"],
                "properties": {"tpr": _NUM, "ci": _CI, "reliable": {"type": "boolean"}, "min_negatives": _INT}},
        "attack": {
            "type": "object",
            "required": ["auroc", "auroc_ci", "low_fpr", "n_models"],
            "properties": {
                "definition": _STR, "auroc": _NUM, "auroc_ci": _CI, "auroc_calibrated": _NUM, "average_precision": _NUM,
                "n_positives": _INT, "n_negatives": _INT, "n_models": _INT, "n_nan_scores": _INT,
                "low_fpr": {"type": "object", "additionalProperties": {"type": "object", "additionalProperties": {"$ref": "#/$defs/tpr"}}},
            },
        },
        "best": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["name", "metric", "value", "ci"],
                                              "properties": {"name": {"type": "string"}, "value": {"type": "number"}, "ci": _CI}}]},
        "grid_row": {
            "type": "object",
            "required": ["quantizer", "is_reference", "bits", "effective_bits", "model_size_bytes", "utility", "r_q",
                         "attacks", "best_attack", "best_attack_by_auroc", "skipped_attacks"],
            "properties": {
                "quantizer": {"type": "string"}, "is_reference": {"type": "boolean"}, "family": _STR,
                "bits": _NUM, "effective_bits": _NUM, "model_size_bytes": _NUM, "size_vs_reference": _NUM,
                "utility": {"type": "object", "required": ["val_loss", "val_loss_ci", "relative_change", "relative_change_ci", "n_runs", "task_metrics"],
                            "properties": {"val_loss": _NUM, "val_loss_ci": _CI, "relative_change": _NUM, "relative_change_ci": _CI,
                                           "n_runs": _INT, "task_metrics": {"type": "object", "additionalProperties": {
                                               "type": "object", "required": ["value", "ci"], "properties": {"value": _NUM, "ci": _CI}}}}},
                "r_q": {"type": "object", "required": ["mean", "ci", "rank", "n_runs", "n_finite", "n_undefined"],
                        "properties": {"mean": _NUM, "ci": _CI, "std": _NUM, "median": _NUM, "rank": _NUM, "n_runs": _INT,
                                       "n_finite": _INT, "n_undefined": _INT, "n_infinite": _INT}},
                "n_models": _INT,
                "attacks": {"type": "object", "additionalProperties": {"$ref": "#/$defs/attack"}},
                "skipped_attacks": {"type": "object", "additionalProperties": {"type": "string"}},
                "best_attack": {"$ref": "#/$defs/best"},
                "best_attack_by_auroc": {"$ref": "#/$defs/best"},
            },
        },
        "criterion": {
            "type": "object",
            "required": ["id", "description", "threshold", "comparison", "status", "reason", "value", "ci"],
            "properties": {"id": {"enum": ["attack_tpr", "r_q", "utility"]}, "description": {"type": "string"},
                           "threshold": {"type": "number"}, "comparison": {"enum": ["<=", ">="]}, "status": _STATUS,
                           "reason": {"type": "string"}, "value": _NUM, "ci": _CI,
                           "per_attack": {"type": "object", "additionalProperties": {
                               "type": "object", "required": ["status", "value", "ci", "reliable"],
                               "properties": {"status": _STATUS, "value": _NUM, "ci": _CI, "reliable": {"type": "boolean"}}}}},
        },
    },
}


def validate_report(report: dict[str, Any]) -> None:
    """Raise ReportSchemaError listing every place where `report` does not match REPORT_SCHEMA, or where it
    is not strict JSON (a NaN or inf anywhere)."""
    import jsonschema

    try:
        json.dumps(report, allow_nan=False)
    except ValueError as exc:
        raise ReportSchemaError(f"report is not strict JSON: {exc}") from exc
    validator = jsonschema.Draft202012Validator(REPORT_SCHEMA)
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"  at {'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message[:300]}" for e in errors[:10]]
        raise ReportSchemaError(f"report does not match report schema v{REPORT_SCHEMA_VERSION} ({len(errors)} error(s)):\n" + "\n".join(lines))


# ------------------------------------------------------------------------------------------ formatting


def _f(x: Any, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) < 10 ** -digits or abs(x) >= 10**5):
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}f}"


def _ci(ci: Any, digits: int = 3) -> str:
    if not ci or ci[0] is None:
        return ""
    return f" [{_f(ci[0], digits)}, {_f(ci[1], digits)}]"


def _pct(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "n/a"
    return f"{'+' if x >= 0 else ''}{100 * x:.{digits}f}%"


def _pct_ci(ci: Optional[list]) -> str:
    return "" if not ci else f" [{_pct(ci[0])}, {_pct(ci[1])}]"


def _size(n: Optional[float]) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


class Cell:
    """A table cell shared by the Markdown and HTML renderers: main text, an optional interval shown in
    brackets (Markdown) or on a second line (HTML), a status badge, code style, an unreliable mark."""

    def __init__(self, text: str = "", sub: str = "", *, status: Optional[str] = None, code: bool = False, unreliable: bool = False):
        self.text, self.sub, self.status, self.code, self.unreliable = text, sub, status, code, unreliable

    def md(self) -> str:
        text = f"`{self.text}`" if self.code else (f"**{self.text}**" if self.status else self.text)
        mark = " †" if self.unreliable else ""
        sub = f" {self.sub}" if self.sub else ""
        return (text + mark + sub).replace("|", "\\|")

    def html(self) -> str:
        text = html.escape(self.text)
        if self.code:
            text = f"<code>{text}</code>"
        if self.status:
            text = f'<span class="badge {_status_class(self.status)}">{text}</span>'
        if self.unreliable:
            text += ' <span class="unrel" title="estimate flagged unreliable">†</span>'
        if self.sub:
            text += f'<br><span class="ci">{html.escape(self.sub)}</span>'
        return text


def _status_class(status: str) -> str:
    return {PASS: "pass", FAIL: "fail", INCONCLUSIVE: "inconclusive", NOT_MEASURED: "notmeasured", DISABLED: "disabled"}.get(status, "")


def _v(value: Any, ci: Any = None, digits: int = 3, *, unreliable: bool = False) -> Cell:
    return Cell(_f(value, digits), _ci(ci, digits).strip(), unreliable=unreliable)


class Table:
    def __init__(self, header: list[str], rows: list[list[Cell]], *, transpose_html: bool = False, highlight_first: bool = False):
        self.header, self.rows, self.transpose_html, self.highlight_first = header, rows, transpose_html, highlight_first


class Section:
    """A titled block: paragraphs (Markdown-lite: `code` and **bold**), tables, figures, a bullet list."""

    def __init__(self, title: str, paras: Optional[list[str]] = None, tables: Optional[list[Table]] = None,
                 bullets: Optional[list[str]] = None, figures: Optional[list[str]] = None, anchor: str = ""):
        self.title, self.paras, self.tables, self.bullets, self.figures = title, paras or [], tables or [], bullets or [], figures or []
        self.anchor = anchor or re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


# ------------------------------------------------------------------------------------------ sections


def _criterion_cell(c: dict[str, Any]) -> Cell:
    if c["id"] == "utility":
        val = f"{_pct(c['value'])}{_pct_ci(c['ci'])}" if c["value"] is not None else "n/a"
    else:
        val = f"{_f(c['value'])}{_ci(c['ci'])}"
        if c["id"] == "attack_tpr" and c.get("attack"):
            val = f"{c['attack']}: {val}"
    return Cell(c["status"], val, status=c["status"])


def _summary_section(report: dict[str, Any]) -> Section:
    prov = report["provenance"]
    rec = report["recommendation"]
    mem = prov.get("membership") or {}
    th = report["checklist"]["thresholds"]
    overall = {q: v["overall"] for q, v in report["checklist"]["per_quantizer"].items()}
    counts = {s: sum(1 for v in overall.values() if v == s) for s in (PASS, INCONCLUSIVE, NOT_MEASURED, FAIL)}
    paras = [
        f"Model `{prov['model']}` with a LoRA adapter (r={(prov.get('adapter') or {}).get('r')}), {mem.get('runs')} fine-tuning runs on "
        f"random halves of {mem.get('pool_size')} pool samples; data fingerprint `{(prov.get('data') or {}).get('fingerprint')}`; "
        f"{len(report['grid'])} quantizers against the full-precision reference `{report['reference_quantizer']}`.",
        (f"**Recommendation: `{rec['quantizer']}`**: {rec['reason']}." if rec["quantizer"] else f"**Recommendation: none**: {rec['reason']}."),
        "Release checklist: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n) +
        f" (limits: best attack TPR at 1% FPR <= {th['max_tpr_at_1pct_fpr']:g}, r_Q >= {th['min_r_q']:g}"
        f"{' (disabled)' if th['min_r_q'] <= 0 else ''}, validation loss increase <= {100 * th['max_utility_loss']:g}%, "
        f"at least {th['min_runs']} runs).",
    ]
    return Section("Summary", paras, anchor="summary")


def _checklist_section(report: dict[str, Any]) -> Section:
    rows = []
    for q, v in report["checklist"]["per_quantizer"].items():
        crit = {c["id"]: c for c in v["criteria"]}
        rows.append([Cell(q, code=True), Cell(v["overall"], status=v["overall"]), _criterion_cell(crit["attack_tpr"]),
                     _criterion_cell(crit["r_q"]), _criterion_cell(crit["utility"])])
    reasons = []
    for q, v in report["checklist"]["per_quantizer"].items():
        bad = [f"{c['id']}: {c['reason']}" for c in v["criteria"] if c["status"] not in (PASS, DISABLED)]
        if bad:
            reasons.append(f"`{q}`: " + "; ".join(bad))
    table = Table(["quantizer", "overall", "attack TPR at 1% FPR", "r_Q", "utility (val loss vs ref)"], rows,
                  highlight_first=report["grid"][0]["is_reference"])
    return Section("Release checklist", ["Per quantizer, each criterion's status with its estimate and 95% interval; the rules:"], [table],
                   bullets=list(report["checklist"]["rules"]) + ["Why not PASS: " + r for r in reasons], anchor="checklist")


def _grid_section(report: dict[str, Any]) -> Section:
    task_names = sorted({n for r in report["grid"] for n in r["utility"]["task_metrics"]})
    header = ["quantizer", "family", "bits", "eff. bits", "size (vs ref)", "val loss", "Δ val loss vs ref"]
    header += [f"task: {n}" for n in task_names]
    header += ["r_Q", "r_Q rank", "best attack", "TPR at 1% FPR (cal.)", "best AUROC"]
    rows = []
    for r in report["grid"]:
        u = r["utility"]
        best, best_auc = r.get("best_attack") or {}, r.get("best_attack_by_auroc") or {}
        size = _size(r["model_size_bytes"]) + (f" ({100 * r['size_vs_reference']:.0f}%)" if r["size_vs_reference"] is not None else "")
        cells = [Cell(r["quantizer"] + (" (ref)" if r["is_reference"] else ""), code=True), Cell(r["family"] or ""),
                 Cell(_f(r["bits"], 2)), Cell(_f(r["effective_bits"], 2)), Cell(size), _v(u["val_loss"], u["val_loss_ci"]),
                 Cell(_pct(u["relative_change"]), _pct_ci(u["relative_change_ci"]).strip())]
        for n in task_names:
            m = u["task_metrics"].get(n) or {}
            cells.append(_v(m.get("value"), m.get("ci")))
        cells += [_v(r["r_q"]["mean"], r["r_q"]["ci"], 4), Cell(f"{r['r_q']['rank']:g}" if r["r_q"]["rank"] is not None else "n/a"), Cell(best.get("name") or "n/a"),
                  _v(best.get("value"), best.get("ci"), unreliable=best.get("reliable") is False),
                  Cell(f"{best_auc.get('name')}: {_f(best_auc.get('value'))}" if best_auc else "n/a", _ci(best_auc.get("ci")).strip())]
        rows.append(cells)
    paras = [
        "Full precision is the reference (first row; first column in the HTML). Utility: validation loss of the final checkpoint, "
        "mean over runs with a 95% bootstrap interval over runs, and its relative change vs the reference. "
        + ("Task metrics: as the recipe requests. " if task_names else "Task metrics: none requested by the recipe. ")
        + "r_Q: attack-free indicator (higher = more secure), mean over runs with a 95% bootstrap interval; rank 1 = most secure. "
        "Best attack: the attack with the highest per-sample-calibrated pooled TPR at 1% FPR; best AUROC: over all attacks. "
        "† marks an estimate flagged unreliable (fewer than 10/alpha non-members).",
    ]
    return Section("Quantizer grid", paras, [Table(header, rows, transpose_html=True, highlight_first=True)], anchor="grid")


def _attacks_section(report: dict[str, Any]) -> Section:
    grid = report["grid"]
    names = [n for n in dict.fromkeys(n for r in grid for n in r["attacks"])]
    key = fpr_key(CHECKLIST_FPR)

    def tpr_cell(att: Optional[dict], evaluation: str, alpha_key: str) -> Cell:
        t = ((att or {}).get("low_fpr") or {}).get(evaluation, {}).get(alpha_key)
        if not t:
            return Cell("n/a")
        return _v(t["tpr"], t["ci"], unreliable=not t["reliable"])

    auroc_rows = [[Cell(r["quantizer"], code=True)] + [_v((r["attacks"].get(n) or {}).get("auroc"), (r["attacks"].get(n) or {}).get("auroc_ci")) if n in r["attacks"] else Cell("skipped") for n in names] for r in grid]
    tpr_rows = [[Cell(r["quantizer"], code=True)] + [tpr_cell(r["attacks"].get(n), "pooled_calibrated", key) if n in r["attacks"] else Cell("skipped") for n in names] for r in grid]
    first_is_ref = bool(grid) and grid[0]["is_reference"]
    tables = [Table(["AUROC (pooled)"] + names, auroc_rows, highlight_first=first_is_ref),
              Table(["TPR at 1% FPR (calibrated)"] + names, tpr_rows, highlight_first=first_is_ref)]
    lira = [n for n in ("lira_offline", "lira_online") if n in names]
    lira_rows = []
    for r in grid:
        for n in lira:
            att = r["attacks"].get(n)
            lira_rows.append([Cell(r["quantizer"], code=True), Cell(n), _v(att["auroc"], att["auroc_ci"]),
                              tpr_cell(att, "pooled_naive", key), tpr_cell(att, "pooled_calibrated", key),
                              tpr_cell(att, "per_sample", key), tpr_cell(att, "pooled_calibrated", fpr_key(0.001))])
    if lira_rows:
        tables.append(Table(["quantizer", "LiRA", "AUROC", "TPR@1% naive", "TPR@1% calibrated", "TPR@1% per-sample avg", "TPR@0.1% calibrated"], lira_rows))
    skipped = sorted({f"`{n}` on `{r['quantizer']}`: {why}" for r in grid for n, why in r["skipped_attacks"].items()})
    bullets = [f"skipped {s}" for s in skipped]
    paras = [
        "Every attack on every quantizer's final checkpoints, each run in turn as the target (leave-one-out references). "
        "AUROC pooled over targets; TPR at 1% FPR with per-sample calibration (the pooled-naive TPR overstates risk, SCIENCE.md section 4), "
        "95% bootstrap intervals in brackets; † = unreliable (fewer than 10/alpha non-members). Loss-based attacks on models that did not "
        "overfit are often near chance: an interval containing 0.5 AUROC means no measurable leakage by that attack, not proof of privacy.",
    ]
    return Section("Membership inference attacks", paras, tables, bullets=bullets, anchor="attacks")


def _definitions_section(report: dict[str, Any]) -> Section:
    defs = report["provenance"].get("attack_definitions") or {}
    return Section("Attack definitions", ["Recorded with every result so that scores under different definitions are never compared silently:"],
                   bullets=[f"`{n}`: `{d}`" for n, d in defs.items()], anchor="definitions")


def _correlation_section(report: dict[str, Any]) -> Section:
    sp = report.get("spearman_r_q_vs_attacks") or {}
    best = report.get("r_q_vs_best_attack") or {}
    paras = ["Spearman rho between the quantizers' mean r_Q and attack success; negative = higher r_Q went with weaker attacks, as the indicator claims."]
    best_bits = [f"{m}: rho {_f(v.get('rho'))} (p {_f(v.get('p_value'))}, {v.get('n_quantizers')} quantizers)" for m, v in best.items()]
    if best_bits:
        paras.append("Against the best attack per quantizer: " + "; ".join(best_bits) + ".")
    rows = []
    for attack, metrics in (sp.get("attacks") or {}).items():
        if isinstance(metrics, dict):
            rows.append([Cell(attack, code=True)] + [Cell(_f((metrics.get(m) or {}).get("rho")), f"p {_f((metrics.get(m) or {}).get('p_value'))}")
                                                     for m in ("auroc", "tpr_at_1pct_naive", "tpr_at_1pct_calibrated")])
    tables = [Table(["attack", "rho vs AUROC", "rho vs TPR@1% naive", "rho vs TPR@1% calibrated"], rows)] if rows else []
    stab = report.get("indicator_stability") or {}
    if stab.get("by_size"):
        tables.append(Table(["runs used", "mean rho with the all-runs ranking", "std"],
                            [[Cell(str(v["k_runs"])), Cell(_f(v.get("mean_rho"))), Cell(_f(v.get("std_rho")))] for v in stab["by_size"]]))
        paras.append("Stability of the r_Q ranking: Spearman rho between the ranking from a random subset of runs and from all runs (second table).")
    return Section("r_Q against attack success", paras, tables, anchor="correlation")


def _memorization_section(report: dict[str, Any]) -> Optional[Section]:
    mem = report.get("memorization")
    if not mem:
        return None
    rows = []
    for q, v in mem["per_quantizer"].items():
        rows.append([Cell(q, code=True), Cell(str(v["n_runs"]))] + [
            _v(v[k]["mean"], v[k]["ci"], 3) for k in ("member_mean_bits", "nonmember_mean_bits", "mean_difference_bits",
                                                      "excess_member_bits", "member_bits_per_adapter_param")])
    ref = mem.get("reference") or {}
    paras = [
        f"Unintended memorization in bits: {mem.get('definition')} Reference: "
        f"{'the base model before fine-tuning' if ref.get('kind') == 'base' else 'a named reference model'}; targets: each run's final checkpoint; "
        f"means over runs, brackets: {mem.get('interval')}. Per-run detail is in report.json only (`result.memorization.per_run`).",
    ]
    if mem.get("adapter_capacity_bits") is not None:
        paras.append(f"Capacity view: adapter capacity about {mem['adapter_capacity_bits']:,.0f} bits; median over runs of adapter "
                     f"capacity / training-set information = {_f(mem.get('median_adapter_capacity_over_information'), 2)}. "
                     f"{mem.get('capacity_note') or ''}")
    header = ["quantizer", "runs", "members: mean bits", "non-members: mean bits", "difference (bits/sample)", "excess member bits (total)", "member bits / adapter param"]
    return Section("Memorization in bits", paras, [Table(header, rows, highlight_first=report["grid"][0]["is_reference"])], bullets=[str(n) for n in mem.get("notes") or []], anchor="memorization")


def _samples_section(report: dict[str, Any]) -> Section:
    vs = report["vulnerable_samples"]
    if not vs["available"]:
        return Section("Most vulnerable samples", [f"Quantizer `{vs['quantizer']}`: {vs.get('note')}."], anchor="samples")
    header = ["rank", "sample id", "score"] + (["text"] if vs["include_samples"] else [])
    rows = [[Cell(str(s["rank"])), Cell(s["sample_id"], code=True), Cell(_f(s["score"]))]
            + ([Cell(s.get("text") if s.get("text") is not None else "(not found in data/pool.jsonl)")] if vs["include_samples"] else [])
            for s in vs["samples"]]
    paras = [f"Top {len(rows)} samples of the reference quantizer `{vs['quantizer']}` by the per-sample score of attack `{vs['attack']}`"
             + (f" ({vs['score_definition']})" if vs.get("score_definition") else "") + f"; {vs['note']}."]
    return Section("Most vulnerable samples", paras, [Table(header, rows)], anchor="samples")


def _provenance_section(report: dict[str, Any]) -> Section:
    p = report["provenance"]
    data = p.get("data") or {}
    mem = p.get("membership") or {}
    adapter = p.get("adapter") or {}
    train = p.get("train") or {}
    params = p.get("parameters") or {}
    versions = ", ".join(f"{k} {v}" for k, v in (p.get("library_versions") or {}).items() if v)
    bullets = [
        f"Experiment `{p.get('experiment_name')}`, identity hash `{p.get('identity_hash')}`, run directory `{p.get('run_dir')}`.",
        f"Model `{p.get('model')}` ({params.get('model_total')} parameters); adapter: LoRA r={adapter.get('r')}, alpha={adapter.get('alpha')}, "
        f"dropout={adapter.get('dropout')}, target modules {', '.join(adapter.get('target_modules') or [])} ({params.get('adapter_trainable')} trainable parameters).",
        f"Training: {train.get('runs')} runs, {train.get('epochs')} epochs, batch {train.get('batch_size')}, lr {train.get('lr')}, "
        f"weight decay {train.get('weight_decay')}, {train.get('checkpoints_per_epoch')} checkpoint(s) per epoch.",
        f"Data: route {data.get('route')}, source {data.get('source')}, tasks {', '.join(data.get('tasks') or [])}, "
        f"{data.get('n_usable')} usable records; fingerprint `{data.get('fingerprint')}`.",
        f"Membership: {mem.get('runs')} runs, pool of {mem.get('pool_size')}, members per run {sorted(set(mem.get('n_train') or []))}, "
        f"finite population correction factor {_f(mem.get('fpc'))}.",
        f"Seeds: {', '.join(f'{k}={v}' for k, v in (p.get('seeds') or {}).items())}; attack bootstrap seed "
        f"{(p.get('attack_settings') or {}).get('seed')}, {(p.get('attack_settings') or {}).get('n_boot')} resamples.",
        f"llmaudit {p.get('llmaudit_version')} (result schema v{p.get('result_schema_version')}, report schema v{report['report_schema_version']}); {versions}.",
        f"r_Q estimator: {(p.get('indicator_protocol') or {}).get('estimator')}; {(p.get('indicator_protocol') or {}).get('formula')}.",
    ]
    return Section("Provenance", [], bullets=bullets, anchor="provenance")


def _reading_section() -> Section:
    return Section("Reading this report", bullets=[
        "report.json holds everything, including per-run detail; NaN and infinite values are null there (strict JSON).",
        "Intervals are 95% percentile bootstraps; an interval that crosses a checklist limit is INCONCLUSIVE, never PASS.",
        "A TPR at an FPR below 10 / (number of non-members) is unreliable and marked †; a criterion resting on it is NOT MEASURED.",
        "r_Q is the estimator of Algorithm 2 (SCIENCE.md section 2); `llmaudit validate synthetic` measures how well its ranking tracks the baseline MIS.",
        "No training text appears in this report unless it was written with --include-samples.",
    ], anchor="reading")


def sections(report: dict[str, Any]) -> list[Section]:
    from llmaudit.plots import FIGURES

    figs = Section("Figures", figures=[n for n in FIGURES if n in report.get("plots", {})], anchor="figures")
    out = [_summary_section(report), _checklist_section(report), _grid_section(report), figs, _attacks_section(report),
           _definitions_section(report), _correlation_section(report), _memorization_section(report), _samples_section(report), _provenance_section(report),
           _reading_section()]
    return [s for s in out if s is not None]


# ------------------------------------------------------------------------------------------ Markdown


def _md_table(t: Table) -> list[str]:
    lines = ["| " + " | ".join(t.header) + " |", "|" + "---|" * len(t.header)]
    lines += ["| " + " | ".join(c.md() for c in row) + " |" for row in t.rows]
    return lines


def render_markdown(report: dict[str, Any], *, only: Optional[Iterable[str]] = None) -> str:
    """The report as Markdown; `only`: section anchors to keep (e.g. ("summary", "checklist") for a console summary)."""
    from llmaudit.plots import FIGURES

    keep = set(only) if only is not None else None
    lines = [f"# llmaudit report: {report['provenance']['experiment_name']}", ""]
    for s in sections(report):
        if keep is not None and s.anchor not in keep:
            continue
        lines += [f"## {s.title}", ""]
        for p in s.paras:
            lines += [p, ""]
        for t in s.tables:
            lines += _md_table(t) + [""]
        for b in s.bullets:
            lines.append(f"- {b}")
        if s.bullets:
            lines.append("")
        for name in s.figures:
            lines += [f"![{FIGURES[name][1]}]({report['plots'][name]})", ""]
    return "\n".join(lines).rstrip() + "\n"


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0;color:#1d1d1f;background:#fafafa;font-size:14px;line-height:1.45}
main{max-width:1200px;margin:0 auto;padding:18px 28px 60px}
h1{font-size:22px;margin:6px 0 2px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
nav{font-size:12px;color:#555;margin-bottom:6px} nav a{color:#2358a6;margin-right:10px;text-decoration:none}
.summary{background:#fff;border:1px solid #d8d8d8;border-left:5px solid #2358a6;border-radius:4px;padding:8px 16px;margin:10px 0}
table{border-collapse:collapse;margin:8px 0 14px;background:#fff;font-size:12.5px}
th,td{border:1px solid #dcdcdc;padding:4px 7px;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600} tr:nth-child(even) td{background:#fbfbfd}
tr.ref td{background:#eef3fb !important}
td.ref,th.ref{background:#eef3fb !important;border-left:2px solid #2358a6;border-right:2px solid #2358a6}
.scroll{overflow-x:auto}
.ci{color:#666;font-size:11px;white-space:nowrap}
code{font-family:SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;background:#f1f1f4;padding:0 3px;border-radius:3px}
.badge{display:inline-block;padding:1px 7px;border-radius:10px;font-weight:700;font-size:11.5px;white-space:nowrap}
.pass{background:#d9f2dd;color:#11602a}.fail{background:#fbd9d7;color:#9b1c14}
.inconclusive{background:#fdf0c8;color:#7a5300}.notmeasured{background:#e4e4e8;color:#3d3d45}.disabled{background:#f3f3f3;color:#888}
.unrel{color:#b25b00;font-weight:700}
.figs{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:14px}
figure{margin:0;background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px}
figure.wide{grid-column:1/-1}
figure img{max-width:100%;height:auto;display:block;margin:0 auto} figcaption{font-size:12px;color:#555;text-align:center}
ul{margin:4px 0 10px;padding-left:22px} li{margin:2px 0}
footer{color:#777;font-size:11.5px;margin-top:30px}
"""


def _inline(text: str) -> str:
    """Markdown-lite to HTML: escape first, then `code` and **bold**."""
    out = html.escape(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)


def _html_table(t: Table) -> str:
    if t.transpose_html:
        # quantizers as columns, the reference (first row) as the first, highlighted column
        cols = t.rows
        head = "<tr><th>" + html.escape(t.header[0]) + "</th>" + "".join(
            f'<th class="{"ref" if (i == 0 and t.highlight_first) else ""}">{c[0].html()}</th>' for i, c in enumerate(cols)) + "</tr>"
        body = "".join(
            "<tr><th>" + html.escape(t.header[j]) + "</th>" + "".join(
                f'<td class="{"ref" if (i == 0 and t.highlight_first) else ""}">{c[j].html()}</td>' for i, c in enumerate(cols)) + "</tr>"
            for j in range(1, len(t.header)))
    else:
        head = "<tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in t.header) + "</tr>"
        body = "".join(('<tr class="ref">' if (i == 0 and t.highlight_first) else "<tr>") + "".join(f"<td>{c.html()}</td>" for c in row) + "</tr>"
                       for i, row in enumerate(t.rows))
    return f'<div class="scroll"><table><thead>{head}</thead><tbody>{body}</tbody></table></div>'


def render_html(report: dict[str, Any], figures: dict[str, bytes]) -> str:
    """One self-contained HTML file: inline CSS, figures as data: URIs, no scripts, no external resources."""
    from llmaudit.plots import FIGURES, WIDE_FIGURES

    secs = sections(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>llmaudit report: {html.escape(str(report['provenance']['experiment_name']))}</title>",
        f"<style>{_CSS}</style></head><body><main>",
        f"<h1>llmaudit report: {html.escape(str(report['provenance']['experiment_name']))}</h1>",
        "<nav>" + "".join(f'<a href="#{s.anchor}">{html.escape(s.title)}</a>' for s in secs) + "</nav>",
    ]
    for s in secs:
        cls = ' class="summary"' if s.anchor == "summary" else ""
        parts.append(f'<section id="{s.anchor}"{cls}>' + ("" if s.anchor == "summary" else f"<h2>{html.escape(s.title)}</h2>"))
        parts += [f"<p>{_inline(p)}</p>" for p in s.paras]
        parts += [_html_table(t) for t in s.tables]
        if s.bullets:
            parts.append("<ul>" + "".join(f"<li>{_inline(b)}</li>" for b in s.bullets) + "</ul>")
        if s.figures:
            parts.append('<div class="figs">')
            for name in s.figures:
                b64 = base64.b64encode(figures[name]).decode("ascii")
                wide = ' class="wide"' if name in WIDE_FIGURES else ""
                parts.append(f'<figure{wide}><img alt="{html.escape(FIGURES[name][1])}" src="data:image/png;base64,{b64}">'
                             f"<figcaption>{html.escape(FIGURES[name][1])}</figcaption></figure>")
            parts.append("</div>")
        parts.append("</section>")
    parts.append(f"<footer>Generated {html.escape(str(report.get('generated_utc')))} by llmaudit {html.escape(str(report['llmaudit_version']))}; "
                 f"report schema v{report['report_schema_version']}. Self-contained: no scripts, no external resources.</footer>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------ write


def write_report(store: RunStore, result: dict[str, Any], include_samples: bool = False) -> dict[str, str]:
    """Write report/report.json (validated against REPORT_SCHEMA; raises ReportSchemaError on mismatch),
    report.md, report.html and report/plots/*.png. Returns {kind: path}."""
    from llmaudit.plots import render_all

    records = store.read_records("pool") if include_samples else None
    report = build_report(result, include_samples=include_samples, sample_records=records)
    figures = render_all(report)
    report["plots"] = {name: f"plots/{name}.png" for name in figures}
    validate_report(report)
    out = store.report_dir
    paths: dict[str, str] = {}
    for name, png in figures.items():
        atomic_write_bytes(out / "plots" / f"{name}.png", png)
    paths["json"] = str(atomic_write_text(out / "report.json", json.dumps(report, indent=2, allow_nan=False) + "\n"))
    paths["markdown"] = str(atomic_write_text(out / "report.md", render_markdown(report)))
    paths["html"] = str(atomic_write_text(out / "report.html", render_html(report, figures)))
    paths["plots"] = str(out / "plots")
    return paths
