"""The grid rows of a report: one per quantizer, full precision first, every number with its interval."""

from __future__ import annotations

from typing import Any

from llmaudit.analyze.metrics import fpr_key
from llmaudit.common.formatting import finite_or_none, interval_or_none
from llmaudit.common.stats import spearman
from llmaudit.report.model_base import dig
from llmaudit.report.policy import checklist_tpr
from llmaudit.report.utility import divergence_row, task_metric_row

LOW_FPRS = (0.05, 0.01, 0.001)

EVALUATIONS = ("pooled_naive", "pooled_calibrated", "per_sample")


def _tpr_ci(block: dict, key: str) -> list | None:
    # pooled_naive stores ci.tpr_at_fpr[key] = {low, high}; the other evaluations {tpr: {low, high}, ...}
    c = dig(block, "ci", "tpr_at_fpr", key)
    c = dig(c, "tpr", default=c)
    return interval_or_none(dig(c, "low"), dig(c, "high"))


def attack_summary(entry: dict[str, Any], n_models: int | None) -> dict[str, Any]:
    """One attack on one quantizer: AUROC and TPR at low FPR, each with its 95% interval and reliability."""
    low_fpr: dict[str, dict[str, Any]] = {}
    for evaluation in EVALUATIONS:
        block = entry.get(evaluation)
        low_fpr[evaluation] = {}
        for alpha in LOW_FPRS:
            key = fpr_key(alpha)
            t = dig(block, "tpr_at_fpr", key)
            if t is None:
                continue
            low_fpr[evaluation][key] = {
                "tpr": finite_or_none(t.get("tpr")),
                "ci": _tpr_ci(block, key),
                "reliable": bool(t.get("reliable", False)),
                "min_negatives": t.get("min_negatives"),
                "n_negatives": t.get("n_negatives"),
            }
    return {
        "definition": entry.get("definition"),
        "auroc": finite_or_none(dig(entry, "pooled_naive", "auroc")),
        "auroc_ci": interval_or_none(
            dig(entry, "pooled_naive", "ci", "auroc", "low"), dig(entry, "pooled_naive", "ci", "auroc", "high")
        ),
        "auroc_calibrated": finite_or_none(dig(entry, "pooled_calibrated", "roc", "auroc")),
        "average_precision": finite_or_none(dig(entry, "pooled_naive", "average_precision")),
        "n_positives": dig(entry, "pooled_naive", "n_positives"),
        "n_negatives": dig(entry, "pooled_naive", "n_negatives"),
        "n_models": n_models,
        "n_nan_scores": entry.get("n_nan_scores"),
        "not_measured": dict(dig(entry, "not_measured", default=())),
        "low_fpr": low_fpr,
    }


def _ordered_quantizers(result: dict[str, Any]) -> list[str]:
    ref = result.get("reference_quantizer")
    qs = list(result["quantizers"])
    return ([ref] if ref in qs else []) + [q for q in qs if q != ref]


def _primary_indicator(result: dict[str, Any], quantizer: str) -> dict[str, Any] | None:
    """The report's candidate indicator for one quantizer: name, mean over runs, interval, status."""
    name = dig(result, "indicators", "primary")
    entry = dig(result, "indicators", "candidates", name) if name is not None else None
    if not entry:
        return None
    agg = dig(entry, "per_quantizer", quantizer)
    return {
        "name": name,
        "mean": finite_or_none(dig(agg, "mean")),
        "ci": interval_or_none(dig(agg, "ci_low"), dig(agg, "ci_high")),
        "n_finite": dig(agg, "n_finite"),
        "status": dig(entry, "validation", "status", default="not validated"),
    }


def _utility_row(util: dict[str, Any]) -> dict[str, Any]:
    """A quantizer's utility: validation loss, its change vs the reference (with intervals), task metrics."""
    return {
        "confidence": finite_or_none(util.get("confidence")),
        "val_loss": finite_or_none(util.get("val_loss")),
        "val_loss_ci": (util.get("val_loss_ci") and interval_or_none(*util["val_loss_ci"])) or None,
        "relative_change": finite_or_none(util.get("relative_change")),
        "relative_change_ci": (util.get("relative_change_ci") and interval_or_none(*util["relative_change_ci"]))
        or None,
        "n_runs": util.get("n_runs"),
        "relative_change_pooled": finite_or_none(util.get("relative_change_pooled")),
        "relative_change_ci_samples": (
            util.get("relative_change_ci_samples") and interval_or_none(*util["relative_change_ci_samples"])
        )
        or None,
        "n_val_samples": util.get("n_val_samples"),
        "task_metrics": {name: task_metric_row(m) for name, m in dig(util, "task_metrics", default={}).items()},
        "divergence": divergence_row(util.get("divergence")),
    }


def _r_q_row(entry: dict[str, Any]) -> dict[str, Any]:
    """A quantizer's r_Q over runs (entry: its block of the indicator's per_quantizer): mean, interval, rank, counts."""
    return {
        "confidence": finite_or_none(dig(entry, "r_q", "confidence")),
        "mean": finite_or_none(dig(entry, "r_q", "mean")),
        "ci": interval_or_none(dig(entry, "r_q", "ci_low"), dig(entry, "r_q", "ci_high")),
        "std": finite_or_none(dig(entry, "r_q", "std")),
        "median": finite_or_none(dig(entry, "r_q", "median")),
        "rank": finite_or_none(dig(entry, "rank")),
        "n_runs": dig(entry, "r_q", "n_runs"),
        "n_finite": dig(entry, "r_q", "n_finite"),
        "n_undefined": dig(entry, "r_q", "n_undefined"),
        "n_infinite": dig(entry, "r_q", "n_infinite"),
    }


def _r_q_status(result: dict[str, Any]) -> str:
    """The validation status of the published r_Q indicator."""
    return dig(result, "indicators", "candidates", "rq_published", "validation", "status", default="not validated")


def _best_attacks(attacks: dict[str, dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the attack with the highest calibrated TPR at 1% FPR, the one with the highest AUROC); None where none has one."""
    best_by_tpr, best_by_auroc = None, None
    by_tpr = [(n, checklist_tpr(a)) for n, a in attacks.items() if checklist_tpr(a)["tpr"] is not None]
    if by_tpr:
        name, t = max(by_tpr, key=lambda item: item[1]["tpr"])
        best_by_tpr = {
            "name": name,
            "metric": "tpr_at_1pct_fpr_calibrated",
            "value": t["tpr"],
            "ci": t["ci"],
            "reliable": t["reliable"],
        }
    by_auroc = [(n, a) for n, a in attacks.items() if a["auroc"] is not None]
    if by_auroc:
        name, a = max(by_auroc, key=lambda item: item[1]["auroc"])
        best_by_auroc = {"name": name, "metric": "auroc", "value": a["auroc"], "ci": a["auroc_ci"]}
    return best_by_tpr, best_by_auroc


def strongest_vs_loss(attacks: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The strongest attack on one quantizer and how much stronger than LOSS it is: by calibrated TPR at 1%
    FPR (the checklist's number; ties broken by AUROC) and by AUROC, each with LOSS's value and the
    difference (strongest minus LOSS). None without a LOSS result."""
    loss = attacks.get("loss")
    if loss is None:
        return None
    out: dict[str, Any] = {}
    loss_tpr = checklist_tpr(loss)["tpr"]
    ranked = [
        (n, checklist_tpr(a)["tpr"], a["auroc"]) for n, a in attacks.items() if checklist_tpr(a)["tpr"] is not None
    ]
    if ranked and loss_tpr is not None:
        name, tpr, _ = max(ranked, key=lambda x: (x[1], x[2] if x[2] is not None else -1.0))
        reliable = bool(checklist_tpr(attacks[name])["reliable"])
        out["tpr_at_1pct_calibrated"] = {
            "attack": name,
            "value": tpr,
            "loss": loss_tpr,
            "gain": tpr - loss_tpr,
            "reliable": reliable,
        }
    aurocs = [(n, a["auroc"]) for n, a in attacks.items() if a["auroc"] is not None]
    if aurocs and loss["auroc"] is not None:
        name, auroc = max(aurocs, key=lambda x: x[1])
        out["auroc"] = {"attack": name, "value": auroc, "loss": loss["auroc"], "gain": auroc - loss["auroc"]}
    return out or None


def calibration_source(info: dict[str, Any]) -> str | None:
    """Where a calibrated quantizer's calibration text came from (its record; a GPTQ record written before the
    setting existed calibrated on the run's members), or None for a quantizer that does not calibrate."""
    calibration = info.get("calibration")
    if isinstance(calibration, dict) and calibration.get("source"):
        return str(calibration["source"])
    return "members" if info.get("family") == "gptq" else None


def grid_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per quantizer, the full-precision reference first: size, utility, r_Q, every attack."""
    decisions = dig(result, "attacks", "decision", "per_quantizer", default={})
    ref = result.get("reference_quantizer")
    ref_size = finite_or_none(dig(result["quantizer_info"], ref, "model_size_bytes") if ref is not None else None)
    rows = []
    for q in _ordered_quantizers(result):
        info = result["quantizer_info"].get(q, {})
        att_block = dig(result, "attacks", "quantizers", q)
        n_models = dig(att_block, "n_models")
        size = finite_or_none(info.get("model_size_bytes"))
        attacks = {name: attack_summary(a, n_models) for name, a in dig(att_block, "attacks", default={}).items()}
        best_by_tpr, best_by_auroc = _best_attacks(attacks)
        rows.append(
            {
                "quantizer": q,
                "is_reference": q == ref,
                "family": info.get("family"),
                "calibration": calibration_source(info),
                "engine": (info.get("options") or {}).get("engine"),  # what scored a GGUF quantizer's units
                "bits": finite_or_none(info.get("bits")),
                "effective_bits": finite_or_none(info.get("effective_bits")),
                "model_size_bytes": size,
                "size_vs_reference": size / ref_size if size is not None and ref_size else None,
                "utility": _utility_row(result["utility"].get(q, {})),
                "r_q": _r_q_row(dig(result, "indicator", "per_quantizer", q, default={})),
                "r_q_status": _r_q_status(result),
                "indicator": _primary_indicator(result, q),
                "n_models": n_models,
                "attacks": attacks,
                "skipped_attacks": dict(dig(att_block, "skipped", default=())),
                "best_attack": best_by_tpr,
                "best_attack_by_auroc": best_by_auroc,
                "strongest_vs_loss": strongest_vs_loss(attacks),
                "decision": decisions.get(q),
            }
        )
    return rows


def r_q_vs_best_attack(grid: list[dict[str, Any]]) -> dict[str, Any]:
    """Spearman rho across quantizers between mean r_Q and the best attack's metric (expected negative)."""
    out: dict[str, Any] = {}
    for metric, key in (("tpr_at_1pct_calibrated", "best_attack"), ("auroc", "best_attack_by_auroc")):
        pairs = [(r["r_q"]["mean"], dig(r, key, "value")) for r in grid]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        out[metric] = spearman([x for x, _ in pairs], [y for _, y in pairs]).to_dict("n_quantizers")
    return out
