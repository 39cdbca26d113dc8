"""The report object: everything every rendering shows, built once from the typed analysis result."""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from pydantic import BaseModel

from llmaudit.analyze.result import AnalysisResult, as_result
from llmaudit.analyze.result_blocks import (
    BlindBaselineResult,
    Candidate,
    CandidateAggregate,
    Capacity,
    MemorizationResult,
    QuantizerAttacks,
    RecordedSamples,
    SampleScore,
    SpearmanVsRQ,
    StatBounds,
    SyntheticCheck,
    Validation,
)
from llmaudit.common.formatting import finite_or_none, interval_or_none
from llmaudit.common.io import to_strict_json
from llmaudit.common.stats import spearman
from llmaudit.report.grid import grid_rows, r_q_vs_best_attack
from llmaudit.report.models import REPORT_SCHEMA_VERSION, GridRow
from llmaudit.report.models_context import (
    BlindBaseline,
    BlindHighest,
    IndicatorShown,
    IndicatorsSummary,
    Memorization,
    MemorizationRow,
    Sample,
    VulnerableSamples,
)
from llmaudit.report.policy import checklist_tpr, release_checklist, thresholds_of
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.schema_base import Stat
from llmaudit.report.section_registry import built_section_data
from llmaudit.report.utility import utility_summary

VULNERABLE_TOP_K = 20


def _recorded_samples(
    block: QuantizerAttacks, row: GridRow | None
) -> tuple[str | None, list[SampleScore] | None, str | None]:
    """(attack, samples, score definition) recorded for the reference quantizer (block: its attacks in the result,
    row: its grid row): the samples of its best attack that recorded some, else the quantizer's own list."""
    order = sorted(row.attacks, key=lambda n: -(checklist_tpr(row.attacks[n]).tpr or -1.0)) if row else []
    for name in order:
        entry = block.attacks.get(name)
        if entry is not None and entry.vulnerable_samples:
            return name, entry.vulnerable_samples, None
    vs = block.vulnerable_samples
    if isinstance(vs, RecordedSamples):
        return vs.attack, vs.samples or [], vs.score_definition
    return None, vs or None, None


def _top_samples(
    samples: list[SampleScore], *, include_samples: bool, records: list[dict] | None, top_k: int
) -> list[Sample]:
    """The top_k samples by score (highest first, missing scores last), ranked from 1, with their text from
    `records` when include_samples."""
    by_id = {str(r.get("sample_id")): r for r in (records or [])} if include_samples else {}
    ranked = sorted(
        samples,
        key=lambda s: -(finite_or_none(s.score) if finite_or_none(s.score) is not None else -math.inf),
    )
    items = []
    for rank, s in enumerate(ranked[:top_k], start=1):
        item = Sample(rank=rank, sample_id=str(s.sample_id), score=finite_or_none(s.score))
        if include_samples:
            rec = by_id.get(item.sample_id)
            item.text = None if rec is None else "\n".join(str(rec.get(k, "")) for k in ("input", "output"))
        items.append(item)
    return items


def vulnerable_samples_summary(
    result: AnalysisResult,
    grid: list[GridRow],
    *,
    include_samples: bool = False,
    records: list[dict] | None = None,
    top_k: int = VULNERABLE_TOP_K,
) -> VulnerableSamples:
    """The most vulnerable samples of the reference quantizer, by id and score.

    Read from the result (the analysis must record them): per attack, `vulnerable_samples` of the attack's result on
    the reference quantizer (highest score first), or the quantizer's own `vulnerable_samples` (a list, or recorded
    with the attack and the score's definition). The attack used is the reference's best attack (highest
    calibrated TPR at 1% FPR) among those that recorded samples.

    Args:
        result: the typed analysis result.
        grid: the report's grid rows.
        include_samples: add each sample's text (from `records`, matched by sample_id).
        records: data/pool.jsonl's records.
        top_k: how many samples.

    Returns:
        The report's vulnerable-samples block.
    """
    ref = result.reference_quantizer
    block = (result.attacks.quantizers.get(ref) if ref is not None else None) or QuantizerAttacks()
    row = next((r for r in grid if r.quantizer == ref), None)
    attack, samples, definition = _recorded_samples(block, row)
    out = VulnerableSamples(
        quantizer=ref,
        attack=attack,
        score_definition=definition,
        include_samples=include_samples,
        available=bool(samples),
        samples=[],
    )
    if not samples:
        out.note = (
            "not recorded: the result object holds no per-sample attack scores "
            "(result['attacks']['quantizers'][Q]['attacks'][ATTACK]['vulnerable_samples'])"
        )
        return out
    out.samples = _top_samples(samples, include_samples=include_samples, records=records, top_k=top_k)
    out.note = (
        "sample text included (--include-samples)"
        if include_samples
        else "ids and scores only; the text is included only with --include-samples"
    )
    return out


def _provenance(result: AnalysisResult) -> dict[str, Any]:
    exp = result.experiment
    return {
        "experiment_name": exp.name,
        "run_dir": exp.run_dir,
        "identity_hash": exp.identity_hash,
        "model": exp.model,
        "adapter": exp.lora,
        "parameters": exp.parameters,
        "train": exp.train,
        "data": exp.data,
        "membership": exp.membership,
        "seeds": exp.seeds,
        "library_versions": exp.versions,
        "llmaudit_version": result.llmaudit_version,
        "result_schema_version": result.schema_version,
        "attack_definitions": result.attacks.attack_definitions,
        "attack_settings": _dumped(result.attacks.settings),
        "indicator_protocol": _dumped(result.r_q.protocol) if result.r_q is not None else None,
        "model_source": exp.model_source,
        "origin": exp.origin,
        "left_out_quantizers": dict(exp.left_out_quantizers),
    }


def blind_summary(blind: BlindBaselineResult | None, grid: list[GridRow]) -> BlindBaseline | None:
    """The blind baseline beside the attacks.

    Args:
        blind: the result's blind baseline.
        grid: the report's grid rows.

    Returns:
        Its AUROC and interval (mean over runs, and the highest run) and, per quantizer, the attacks whose AUROC does
        not exceed its upper bound (they may measure the difference between the files, not leakage); None without
        a blind baseline.
    """
    if blind is None:
        return None
    runs = [r for r in blind.per_run or [] if r.auroc is not None]
    top = max(runs, key=lambda r: r.auroc) if runs else None
    bound = finite_or_none(top.ci_high) if top else None
    not_beating = {}
    for row in grid:
        names = [n for n, a in row.attacks.items() if a.auroc is not None and bound is not None and a.auroc <= bound]
        if names:
            not_beating[row.quantizer] = names
    return BlindBaseline(
        mean_auroc=finite_or_none(blind.mean_auroc),
        highest=None
        if top is None
        else BlindHighest(run=top.run, auroc=finite_or_none(top.auroc), ci=interval_or_none(top.ci_low, top.ci_high)),
        runs=len(blind.per_run or []),
        warning=blind.warning,
        reason=blind.reason,
        method=blind.method,
        attacks_not_above_it=not_beating,
    )


def _candidate_summary(name: str, c: Candidate, order: list[str], best: dict[str, Any]) -> IndicatorShown:
    """One candidate indicator beside the attacks: per quantizer its mean and interval, its validation, and its
    agreement with the best attack's AUROC across quantizers."""
    aggregates = {q: c.per_quantizer.get(q) or CandidateAggregate() for q in order}
    values = {q: finite_or_none(a.mean) for q, a in aggregates.items()}
    cis = {q: interval_or_none(a.ci_low, a.ci_high) for q, a in aggregates.items()}
    pairs = [(values[q], best[q]) for q in order if values[q] is not None and best[q] is not None]
    corr = spearman([a for a, _ in pairs], [b for _, b in pairs]).to_dict("n_quantizers")
    validation = c.validation or Validation()
    synthetic = validation.synthetic or SyntheticCheck()
    return IndicatorShown(
        name=name,
        version=c.version,
        family=c.family,
        formula=c.formula,
        computable=bool(c.computable),
        reason=c.reason,
        status=c.status(),
        beyond_damage=(validation.beyond_damage.answer if validation.beyond_damage else None) or "not measured",
        synthetic_spearman=finite_or_none(synthetic.mean_spearman),
        values=values,
        ci=cis,
        agreement=indicator_agreement({"auroc": corr}, None, label=name) if c.computable else None,
    )


def indicators_summary(result: AnalysisResult, grid: list[GridRow]) -> IndicatorsSummary | None:
    """The published r_Q and the candidate indicators side by side.

    Args:
        result: the typed analysis result.
        grid: the report's grid rows.

    Returns:
        Per indicator and quantizer the mean over runs with its interval, each indicator's validation status, and its
        agreement with the attacks on THIS grid (Spearman against the best attack's AUROC across quantizers,
        expected sign negative); None without candidate indicators.
    """
    ind = result.candidate_indicators
    if ind is None:
        return None
    best = {r.quantizer: r.best_attack_by_auroc.value if r.best_attack_by_auroc else None for r in grid}
    order = [r.quantizer for r in grid]
    shown = [_candidate_summary(name, c, order, best) for name, c in ind.candidates.items()]
    return IndicatorsSummary(primary=ind.primary, indicators=shown)


def _agreement_verdict(rho: float, p: float | None, alpha: float) -> tuple[str, str]:
    """(the observed sign of rho, the verdict against the expected negative sign at significance alpha)."""
    observed = "negative" if rho < 0 else ("positive" if rho > 0 else "zero")
    significant = p is not None and p < alpha
    if observed == "negative":
        return observed, "agrees" if significant else "leans the expected way (not significant)"
    if observed == "positive":
        return observed, "contradicts" if significant else "leans the opposite way (not significant)"
    return observed, "no relation"


def indicator_agreement(
    r_q_vs_best: dict[str, Any], per_attack: SpearmanVsRQ | None, *, alpha: float = 0.05, label: str = "r_Q"
) -> dict[str, Any]:
    """Does r_Q rank the quantizers the way the attacks do? r_Q claims "higher = more secure", so the
    expected sign of Spearman(r_Q, attack success) is NEGATIVE.

    Args:
        r_q_vs_best: Spearman(indicator, the best attack's metric) per metric (`r_q_vs_best_attack`).
        per_attack: Spearman(r_Q, each attack's headline metrics) from the result, or None.
        alpha: the significance level.
        label: the indicator's name in the sentence.

    Returns:
        The observed sign next to the expected one and the verdict: agrees / contradicts (p < alpha), leans the
        expected or the opposite way (not significant), or not measurable; with the sentence that says it.
    """
    head = r_q_vs_best.get("auroc") or {}
    rho, p = head.get("rho"), head.get("p_value")
    signs = {"negative": 0, "positive": 0}
    for metrics in (per_attack.attacks if per_attack is not None else {}).values():
        value = metrics["auroc"].rho if "auroc" in metrics else None
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
    observed, verdict = _agreement_verdict(rho, p, alpha)
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


_MEMORIZATION_KEYS = (
    "member_mean_bits",
    "nonmember_mean_bits",
    "mean_difference_bits",
    "excess_member_bits",
    "member_bits_per_adapter_param",
    "member_bits_per_model_param",
)


def _memorization_summary(mem: MemorizationResult | None, order: list[str]) -> Memorization | None:
    if mem is None:
        return None
    per_q = {}
    for q in order:
        entry = mem.per_quantizer.get(q)
        if entry is not None:
            stats = {k: getattr(entry, k) or StatBounds() for k in _MEMORIZATION_KEYS}
            per_q[q] = MemorizationRow(
                n_runs=len(entry.runs or []),
                **{k: Stat(mean=finite_or_none(v.mean), ci=interval_or_none(v.low, v.high)) for k, v in stats.items()},
            )
    cap = mem.capacity or Capacity()
    ratios = sorted(
        r for r in (finite_or_none(r.adapter_capacity_over_information) for r in cap.per_run) if r is not None
    )
    return Memorization(
        definition=mem.definition,
        reference=mem.reference,
        interval=mem.interval,
        per_quantizer=per_q,
        adapter_capacity_bits=finite_or_none(cap.adapter_capacity_bits),
        model_capacity_bits=finite_or_none(cap.model_capacity_bits),
        median_adapter_capacity_over_information=ratios[len(ratios) // 2] if ratios else None,
        capacity_note=cap.note,
        notes=list(mem.notes or []),
        per_run_detail="result.memorization.per_run (report.json only)",
    )


def _dumped(block: BaseModel | None) -> Any:
    return None if block is None else block.model_dump(mode="json", by_alias=True)


def _written(block: BaseModel | None) -> dict[str, Any] | None:
    """A section built typed, as report.json writes it: the keys it was built with (None for a section not built)."""
    return None if block is None else block.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _row_json(row: GridRow) -> dict[str, Any]:
    """A grid row as report.json writes it: the keys it was built with, its decision whole."""
    return row.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude={"decision"}) | {
        "decision": _dumped(row.decision)
    }


def _sections(result: AnalysisResult, grid: list[GridRow], r_q_vs_best: dict[str, Any]) -> dict[str, Any]:
    """The report's sections beside the grid: r_Q against the attacks, memorization, the blind baseline, the
    candidate indicators, utility."""
    spearman_vs_r_q = result.attacks.spearman_vs_r_q
    return {
        "indicator_agreement": indicator_agreement(r_q_vs_best, spearman_vs_r_q),
        "spearman_r_q_vs_attacks": _dumped(spearman_vs_r_q),
        "indicator_stability": _dumped(result.r_q.stability) if result.r_q is not None else None,
        "memorization": _written(_memorization_summary(result.memorization, [r.quantizer for r in grid])),
        "not_scored": dict(result.not_scored),
        "blind_baseline": _written(blind_summary(result.blind_baseline, grid)),
        "indicators": _written(indicators_summary(result, grid)),
        "utility": _written(utility_summary(result)),
    }


def build_report(
    result: AnalysisResult | dict[str, Any], *, include_samples: bool = False, sample_records: list[dict] | None = None
) -> dict[str, Any]:
    """The report object every rendering is made from.

    Args:
        result: the analysis result (`AnalysisResult`, or results/result.json's content, parsed with it).
        include_samples: add the most vulnerable samples' text.
        sample_records: data/pool.jsonl's records (with include_samples).

    Returns:
        report.json's content, strict JSON (non-finite numbers as null).

    Raises:
        pydantic.ValidationError: `result` is not an analysis result.
    """
    result = as_result(result)
    grid = grid_rows(result)
    thresholds = thresholds_of(result)
    checklist = release_checklist(grid, thresholds)
    r_q_vs_best = r_q_vs_best_attack(grid)
    recommendation = recommend(grid, checklist)
    provenance = _provenance(result)
    recommendation.explanation = explain_recommendation(recommendation, checklist, grid, provenance)
    report = {
        "report_schema_version": REPORT_SCHEMA_VERSION,
        "llmaudit_version": result.llmaudit_version,
        "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "include_samples": bool(include_samples),
        "non_finite_policy": "NaN and +-inf are written as null (strict JSON); counts and reasons beside them say why",
        "provenance": provenance,
        "decision_rule": None if result.attacks.decision is None else _dumped(result.attacks.decision.rule),
        "reference_quantizer": result.reference_quantizer,
        "quantizers": [r.quantizer for r in grid],
        "grid": [_row_json(r) for r in grid],
        "checklist": _written(checklist),
        "recommendation": _written(recommendation),
        "r_q_vs_best_attack": r_q_vs_best,
    } | _sections(result, grid, r_q_vs_best)
    report["vulnerable_samples"] = _written(
        vulnerable_samples_summary(result, grid, include_samples=include_samples, records=sample_records)
    )
    report |= {
        "extraction": _dumped(result.extraction),
        "release_sets": [_dumped(s) for s in result.release_sets or []],
        "epsilon": _dumped(result.epsilon),
        "plots": {},
        "result": result.to_json(),
    }
    report |= built_section_data(result, report)  # the registered sections' own data (section_registry)
    return to_strict_json(report)
