"""The report object: everything every rendering shows, built once from the result object."""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from llmaudit.common.formatting import finite_or_none, interval_or_none
from llmaudit.common.io import to_strict_json
from llmaudit.common.stats import spearman
from llmaudit.report.grid import grid_rows, r_q_vs_best_attack
from llmaudit.report.model_base import dig
from llmaudit.report.policy import checklist_tpr, release_checklist, thresholds_of
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.section_registry import built_section_data
from llmaudit.report.utility import utility_summary

REPORT_SCHEMA_VERSION = 4

VULNERABLE_TOP_K = 20


def _recorded_samples(
    block: dict[str, Any], row: dict[str, Any] | None
) -> tuple[str | None, list[dict] | None, str | None]:
    """(attack, samples, score definition) recorded for the reference quantizer (block: its attacks block of the
    result, row: its grid row): the samples of its best attack that recorded some, else the quantizer's own list."""
    order = (
        sorted(row.get("attacks", {}), key=lambda n: -(checklist_tpr(row["attacks"][n])["tpr"] or -1.0)) if row else []
    )
    attack, samples, definition = None, None, None
    for name in order:
        vs = dig(block, "attacks", name, "vulnerable_samples")
        if vs:
            attack, samples = name, vs
            break
    if samples is None and block.get("vulnerable_samples"):
        vs = block["vulnerable_samples"]
        if isinstance(vs, dict):
            attack, samples, definition = vs.get("attack"), vs.get("samples") or [], vs.get("score_definition")
        else:
            samples = vs
    return attack, samples, definition


def _top_samples(
    samples: list[dict], *, include_samples: bool, records: list[dict] | None, top_k: int
) -> list[dict[str, Any]]:
    """The top_k samples by score (highest first, missing scores last), ranked from 1, with their text from
    `records` when include_samples."""
    by_id = {str(r.get("sample_id")): r for r in (records or [])} if include_samples else {}
    ranked = sorted(
        samples,
        key=lambda s: -(finite_or_none(s.get("score")) if finite_or_none(s.get("score")) is not None else -math.inf),
    )
    items = []
    for rank, s in enumerate(ranked[:top_k], start=1):
        item = {"rank": rank, "sample_id": str(s["sample_id"]), "score": finite_or_none(s.get("score"))}
        if include_samples:
            rec = by_id.get(item["sample_id"])
            item["text"] = None if rec is None else "\n".join(str(rec.get(k, "")) for k in ("input", "output"))
        items.append(item)
    return items


def vulnerable_samples_summary(
    result: dict[str, Any],
    grid: list[dict[str, Any]],
    *,
    include_samples: bool = False,
    records: list[dict] | None = None,
    top_k: int = VULNERABLE_TOP_K,
) -> dict[str, Any]:
    """The most vulnerable samples of the reference quantizer, by id and score.

    Read from the result object (analysis must record them): per attack,
    result["attacks"]["quantizers"][Q]["attacks"][ATTACK]["vulnerable_samples"] = [{"sample_id", "score"}, ...]
    (highest score first), or per quantizer result["attacks"]["quantizers"][Q]["vulnerable_samples"] as such
    a list or as {"attack", "score_definition", "samples": [...]}. The attack used is the reference's best
    attack (highest calibrated TPR at 1% FPR) among those that recorded samples. Text is added only when
    include_samples is True, from `records` (data/pool.jsonl) matched by sample_id."""
    ref = result.get("reference_quantizer")
    block = dig(result, "attacks", "quantizers", ref, default={}) if ref is not None else {}
    row = next((r for r in grid if r["quantizer"] == ref), None)
    attack, samples, definition = _recorded_samples(block, row)
    out: dict[str, Any] = {
        "quantizer": ref,
        "attack": attack,
        "score_definition": definition,
        "include_samples": include_samples,
        "available": bool(samples),
        "samples": [],
    }
    if not samples:
        out["note"] = (
            "not recorded: the result object holds no per-sample attack scores "
            "(result['attacks']['quantizers'][Q]['attacks'][ATTACK]['vulnerable_samples'])"
        )
        return out
    out["samples"].extend(_top_samples(samples, include_samples=include_samples, records=records, top_k=top_k))
    out["note"] = (
        "sample text included (--include-samples)"
        if include_samples
        else "ids and scores only; the text is included only with --include-samples"
    )
    return out


def _provenance(result: dict[str, Any]) -> dict[str, Any]:
    exp = result["experiment"]
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
        "attack_definitions": dig(result, "attacks", "attack_definitions"),
        "attack_settings": dig(result, "attacks", "settings"),
        "indicator_protocol": dig(result, "indicator", "protocol"),
        "model_source": exp.get("model_source"),
        "origin": exp.get("origin"),
        "left_out_quantizers": dict(exp.get("left_out_quantizers") or {}),
    }


def blind_summary(blind: dict[str, Any] | None, grid: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The blind baseline beside the attacks: its AUROC and interval (mean over runs, and the highest run)
    and, per quantizer, the attacks whose AUROC does not exceed its upper bound (they may measure the
    difference between the files, not leakage)."""
    if not blind:
        return None
    runs = [r for r in blind.get("per_run") or [] if r.get("auroc") is not None]
    top = max(runs, key=lambda r: r["auroc"]) if runs else None
    bound = finite_or_none(top["ci_high"]) if top else None
    not_beating = {}
    for row in grid:
        names = [
            n
            for n, a in row["attacks"].items()
            if a.get("auroc") is not None and bound is not None and a["auroc"] <= bound
        ]
        if names:
            not_beating[row["quantizer"]] = names
    return {
        "mean_auroc": finite_or_none(blind.get("mean_auroc")),
        "highest": None
        if top is None
        else {
            "run": top["run"],
            "auroc": finite_or_none(top["auroc"]),
            "ci": interval_or_none(top["ci_low"], top["ci_high"]),
        },
        "runs": len(blind.get("per_run") or []),
        "warning": blind.get("warning"),
        "reason": blind.get("reason"),
        "method": blind.get("method"),
        "attacks_not_above_it": not_beating,
    }


def indicators_summary(result: dict[str, Any], grid: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The published r_Q and the candidate indicators side by side: per quantizer the mean over runs with
    its interval, each indicator's validation status, and its agreement with the attacks on THIS grid
    (Spearman against the best attack's AUROC across quantizers, expected sign negative)."""
    ind = result.get("indicators")
    if not ind:
        return None
    best = {r["quantizer"]: dig(r, "best_attack_by_auroc", "value") for r in grid}
    order = [r["quantizer"] for r in grid]
    shown = []
    for name, c in ind["candidates"].items():
        values = {q: finite_or_none(dig(c, "per_quantizer", q, "mean")) for q in order}
        cis = {
            q: interval_or_none(dig(c, "per_quantizer", q, "ci_low"), dig(c, "per_quantizer", q, "ci_high"))
            for q in order
        }
        pairs = [(values[q], best[q]) for q in order if values[q] is not None and best[q] is not None]
        corr = spearman([a for a, _ in pairs], [b for _, b in pairs]).to_dict("n_quantizers")
        shown.append(
            {
                "name": name,
                "version": c.get("version"),
                "family": c.get("family"),
                "formula": c.get("formula"),
                "computable": bool(c.get("computable")),
                "reason": c.get("reason"),
                "status": dig(c, "validation", "status", default="not validated"),
                "beyond_damage": dig(c, "validation", "beyond_damage", "answer", default="not measured"),
                "synthetic_spearman": finite_or_none(dig(c, "validation", "synthetic", "mean_spearman")),
                "values": values,
                "ci": cis,
                "agreement": indicator_agreement({"auroc": corr}, None, label=name) if c.get("computable") else None,
            }
        )
    return {"primary": ind.get("primary"), "indicators": shown}


def indicator_agreement(
    r_q_vs_best: dict[str, Any], per_attack: dict[str, Any] | None, *, alpha: float = 0.05, label: str = "r_Q"
) -> dict[str, Any]:
    """Does r_Q rank the quantizers the way the attacks do? r_Q claims "higher = more secure", so the
    expected sign of Spearman(r_Q, attack success) is NEGATIVE. The verdict states the observed sign
    next to the expected one: agrees / contradicts (p < alpha), leans the expected or the opposite way
    (not significant), or not measurable."""
    head = dig(r_q_vs_best, "auroc", default={})
    rho, p = head.get("rho"), head.get("p_value")
    signs = {"negative": 0, "positive": 0}
    for metrics in dig(per_attack, "attacks", default={}).values():
        value = dig(metrics, "auroc", "rho")
        if value is not None and value != 0:
            signs["negative" if value < 0 else "positive"] += 1
    out = {
        "expected_sign": "negative",
        "rho": rho,
        "p_value": p,
        "n_quantizers": head.get("n_quantizers"),
        "attacks_by_sign": signs,
        "alpha": alpha,
    }
    if rho is None:
        return out | {
            "observed_sign": None,
            "verdict": "not measurable",
            "sentence": f"r_Q cannot be compared with the attacks here ({head.get('reason') or 'too few quantizers'}).",
        }
    observed = "negative" if rho < 0 else ("positive" if rho > 0 else "zero")
    significant = p is not None and p < alpha
    if observed == "negative":
        verdict = "agrees" if significant else "leans the expected way (not significant)"
    elif observed == "positive":
        verdict = "contradicts" if significant else "leans the opposite way (not significant)"
    else:
        verdict = "no relation"
    consequence = {
        "agrees": " with the attacks",
        "contradicts": " the attacks: it ranks quantizers as MORE secure where the attacks are STRONGER",
        "leans the opposite way (not significant)": ": it tends to rank quantizers as more secure where the attacks are stronger",
    }.get(verdict, "")
    sentence = (
        f"Across {head.get('n_quantizers')} quantizers, Spearman({label}, best-attack AUROC) = {rho:+.2f} (p = {p:.2g}): "
        f"observed sign {observed}, expected negative (higher {label} = more secure), so {label} {verdict}{consequence}"
        + (f"; by attack: {signs['negative']} negative, {signs['positive']} positive." if any(signs.values()) else ".")
    )
    return out | {"observed_sign": observed, "verdict": verdict, "sentence": sentence}


def _memorization_summary(mem: dict[str, Any] | None, order: list[str]) -> dict[str, Any] | None:
    if not mem:
        return None
    keys = (
        "member_mean_bits",
        "nonmember_mean_bits",
        "mean_difference_bits",
        "excess_member_bits",
        "member_bits_per_adapter_param",
        "member_bits_per_model_param",
    )
    per_q = {}
    for q in order:
        entry = dig(mem, "per_quantizer", q)
        if entry:
            per_q[q] = {"n_runs": len(entry.get("runs") or [])} | {
                k: {
                    "mean": finite_or_none(dig(entry, k, "mean")),
                    "ci": interval_or_none(dig(entry, k, "low"), dig(entry, k, "high")),
                }
                for k in keys
            }
    cap = dig(mem, "capacity", default={})
    ratios = [finite_or_none(r.get("adapter_capacity_over_information")) for r in cap.get("per_run") or []]
    ratios = sorted(r for r in ratios if r is not None)
    return {
        "definition": mem.get("definition"),
        "reference": mem.get("reference"),
        "interval": mem.get("interval"),
        "per_quantizer": per_q,
        "adapter_capacity_bits": finite_or_none(cap.get("adapter_capacity_bits")),
        "model_capacity_bits": finite_or_none(cap.get("model_capacity_bits")),
        "median_adapter_capacity_over_information": ratios[len(ratios) // 2] if ratios else None,
        "capacity_note": cap.get("note"),
        "notes": list(mem.get("notes") or []),
        "per_run_detail": "result.memorization.per_run (report.json only)",
    }


def build_report(
    result: dict[str, Any], *, include_samples: bool = False, sample_records: list[dict] | None = None
) -> dict[str, Any]:
    """The report object every rendering is made from. Strict JSON (non-finite numbers as null)."""
    grid = grid_rows(result)
    thresholds = thresholds_of(result)
    checklist = release_checklist(grid, thresholds)
    r_q_vs_best = r_q_vs_best_attack(grid)
    recommendation = recommend(grid, checklist)
    provenance = _provenance(result)
    recommendation["explanation"] = explain_recommendation(recommendation, checklist, grid, provenance)
    report = {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "llmaudit_version": result.get("llmaudit_version"),
        "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "include_samples": bool(include_samples),
        "non_finite_policy": "NaN and +-inf are written as null (strict JSON); counts and reasons beside them say why",
        "provenance": provenance,
        "decision_rule": dig(result, "attacks", "decision", "rule"),
        "reference_quantizer": result.get("reference_quantizer"),
        "quantizers": [r["quantizer"] for r in grid],
        "grid": grid,
        "checklist": checklist,
        "recommendation": recommendation,
        "r_q_vs_best_attack": r_q_vs_best,
        "indicator_agreement": indicator_agreement(r_q_vs_best, dig(result, "attacks", "spearman_vs_r_q")),
        "spearman_r_q_vs_attacks": dig(result, "attacks", "spearman_vs_r_q"),
        "indicator_stability": dig(result, "indicator", "stability"),
        "memorization": _memorization_summary(result.get("memorization"), [r["quantizer"] for r in grid]),
        "not_scored": dig(result, "not_scored", default={}),
        "blind_baseline": blind_summary(result.get("blind_baseline"), grid),
        "indicators": indicators_summary(result, grid),
        "utility": utility_summary(result),
        "vulnerable_samples": vulnerable_samples_summary(
            result, grid, include_samples=include_samples, records=sample_records
        ),
        "extraction": result.get("extraction"),
        "release_sets": list(result.get("release_sets") or []),
        "epsilon": result.get("epsilon"),
        "plots": {},
        "result": result,
    }
    report |= built_section_data(result, report)  # the registered sections' own data (section_registry)
    return to_strict_json(report)
