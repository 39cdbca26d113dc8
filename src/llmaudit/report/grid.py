"""The grid rows of a report: one per quantizer, full precision first, every number with its interval."""

from __future__ import annotations

from typing import Any

from llmaudit.analyze.metrics import fpr_key
from llmaudit.analyze.result import AnalysisResult, QuantizerInfo, UtilityEntry
from llmaudit.analyze.result_blocks import (
    AttackResult,
    CandidateAggregate,
    Evaluation,
    Num,
    QuantizerAttacks,
    RQEntry,
)
from llmaudit.common.formatting import finite_or_none, interval_or_none
from llmaudit.common.stats import spearman
from llmaudit.report.models import (
    RQ,
    AttackEntry,
    BestAttack,
    GridRow,
    PrimaryIndicator,
    StrongestVsLoss,
    TprAt,
    UtilityRow,
    VsLoss,
)
from llmaudit.report.policy import checklist_tpr
from llmaudit.report.utility import divergence_row, task_metric_row

LOW_FPRS = (0.05, 0.01, 0.001)

EVALUATIONS = ("pooled_naive", "pooled_calibrated", "per_sample")


def _interval(bounds: tuple[Num, Num] | None) -> list | None:
    return None if bounds is None else interval_or_none(*bounds)


def _low_fpr(evaluation: Evaluation | None) -> dict[str, TprAt]:
    """One evaluation's TPR at each low FPR with its interval and reliability (those it measured)."""
    out: dict[str, TprAt] = {}
    for alpha in LOW_FPRS:
        key = fpr_key(alpha)
        t = evaluation.tpr_estimate(key) if evaluation is not None else None
        if t is None:
            continue
        out[key] = TprAt(
            tpr=finite_or_none(t.tpr),
            ci=_interval(t.ci),
            reliable=t.reliable,
            min_negatives=t.min_negatives,
            n_negatives=t.n_negatives,
        )
    return out


def attack_summary(entry: AttackResult, n_models: Num) -> AttackEntry:
    """One attack on one quantizer: AUROC and TPR at low FPR, each with its 95% interval and reliability.

    Args:
        entry: the attack's result on the quantizer.
        n_models: the target models behind it.

    Returns:
        The attack's entry of its grid row.
    """
    naive = entry.pooled_naive or Evaluation()
    auroc_ci = naive.ci.auroc if naive.ci is not None and naive.ci.auroc is not None else None
    calibrated = entry.pooled_calibrated
    return AttackEntry(
        definition=entry.definition,
        auroc=finite_or_none(naive.auroc),
        auroc_ci=None if auroc_ci is None else interval_or_none(auroc_ci.low, auroc_ci.high),
        auroc_calibrated=finite_or_none(calibrated.roc.auroc if calibrated and calibrated.roc else None),
        average_precision=finite_or_none(naive.average_precision),
        n_positives=naive.n_positives,
        n_negatives=naive.n_negatives,
        n_models=n_models,
        n_nan_scores=entry.n_nan_scores,
        not_measured=dict(entry.not_measured),
        low_fpr={e: _low_fpr(getattr(entry, e)) for e in EVALUATIONS},
    )


def _ordered_quantizers(result: AnalysisResult) -> list[str]:
    ref = result.reference_quantizer
    qs = list(result.quantizers)
    return ([ref] if ref in qs else []) + [q for q in qs if q != ref]


def _primary_indicator(result: AnalysisResult, quantizer: str) -> PrimaryIndicator | None:
    """The report's candidate indicator for one quantizer: name, mean over runs, interval, status."""
    candidates = result.candidate_indicators
    name = candidates.primary if candidates is not None else None
    entry = candidates.candidates.get(name) if candidates is not None and name is not None else None
    if entry is None:
        return None
    agg = entry.per_quantizer.get(quantizer) or CandidateAggregate()
    return PrimaryIndicator(
        name=name,
        mean=finite_or_none(agg.mean),
        ci=interval_or_none(agg.ci_low, agg.ci_high),
        confidence=finite_or_none(agg.confidence),
        n_finite=agg.n_finite,
        status=entry.status(),
    )


def _listed(ci: list | None) -> list | None:
    return (ci and interval_or_none(*ci)) or None


def _utility_row(util: UtilityEntry) -> UtilityRow:
    """A quantizer's utility: validation loss, its change vs the reference (with intervals), task metrics."""
    return UtilityRow(
        confidence=finite_or_none(util.confidence),
        val_loss=finite_or_none(util.val_loss),
        val_loss_ci=_listed(util.val_loss_ci),
        relative_change=finite_or_none(util.relative_change),
        relative_change_ci=_listed(util.relative_change_ci),
        n_runs=util.n_runs,
        relative_change_pooled=finite_or_none(util.relative_change_pooled),
        relative_change_ci_samples=_listed(util.relative_change_ci_samples),
        n_val_samples=util.n_val_samples,
        task_metrics={name: task_metric_row(m) for name, m in util.task_metrics.items()},
        divergence=divergence_row(util.divergence),
    )


def _r_q_row(entry: RQEntry) -> RQ:
    """A quantizer's r_Q over runs (entry: its block of the indicator's per_quantizer): mean, interval, rank, counts."""
    r = entry.r_q
    return RQ(
        confidence=finite_or_none(r.confidence),
        mean=finite_or_none(r.mean),
        ci=interval_or_none(r.ci_low, r.ci_high),
        std=finite_or_none(r.std),
        median=finite_or_none(r.median),
        rank=finite_or_none(entry.rank),
        n_runs=r.n_runs,
        n_finite=r.n_finite,
        n_undefined=r.n_undefined,
        n_infinite=r.n_infinite,
    )


def _r_q_status(result: AnalysisResult) -> str:
    """The validation status of the published r_Q indicator."""
    candidates = result.candidate_indicators
    entry = candidates.candidates.get("rq_published") if candidates is not None else None
    return "not validated" if entry is None else entry.status()


def _best_attacks(attacks: dict[str, AttackEntry]) -> tuple[BestAttack | None, BestAttack | None]:
    """(the attack with the highest calibrated TPR at 1% FPR, the one with the highest AUROC); None where none has one."""
    best_by_tpr, best_by_auroc = None, None
    by_tpr = [(n, checklist_tpr(a)) for n, a in attacks.items() if checklist_tpr(a).tpr is not None]
    if by_tpr:
        name, t = max(by_tpr, key=lambda item: item[1].tpr)
        best_by_tpr = BestAttack(
            name=name, metric="tpr_at_1pct_fpr_calibrated", value=t.tpr, ci=t.ci, reliable=t.reliable
        )
    by_auroc = [(n, a) for n, a in attacks.items() if a.auroc is not None]
    if by_auroc:
        name, a = max(by_auroc, key=lambda item: item[1].auroc)
        best_by_auroc = BestAttack(name=name, metric="auroc", value=a.auroc, ci=a.auroc_ci)
    return best_by_tpr, best_by_auroc


def strongest_vs_loss(attacks: dict[str, AttackEntry]) -> StrongestVsLoss | None:
    """The strongest attack on one quantizer and how much stronger than LOSS it is.

    Args:
        attacks: the grid row's attacks (`attack_summary`).

    Returns:
        By calibrated TPR at 1% FPR (the checklist's number; ties broken by AUROC) and by AUROC, the strongest
        attack's value with LOSS's value and the difference (strongest minus LOSS); None without a LOSS result.
    """
    loss = attacks.get("loss")
    if loss is None:
        return None
    out: dict[str, VsLoss] = {}
    loss_tpr = checklist_tpr(loss).tpr
    ranked = [(n, checklist_tpr(a).tpr, a.auroc) for n, a in attacks.items() if checklist_tpr(a).tpr is not None]
    if ranked and loss_tpr is not None:
        name, tpr, _ = max(ranked, key=lambda x: (x[1], x[2] if x[2] is not None else -1.0))
        reliable = bool(checklist_tpr(attacks[name]).reliable)
        out["tpr_at_1pct_calibrated"] = VsLoss(
            attack=name, value=tpr, loss=loss_tpr, gain=tpr - loss_tpr, reliable=reliable
        )
    aurocs = [(n, a.auroc) for n, a in attacks.items() if a.auroc is not None]
    if aurocs and loss.auroc is not None:
        name, auroc = max(aurocs, key=lambda x: x[1])
        out["auroc"] = VsLoss(attack=name, value=auroc, loss=loss.auroc, gain=auroc - loss.auroc)
    return StrongestVsLoss(**out) if out else None


def calibration_source(info: QuantizerInfo) -> str | None:
    """Where a calibrated quantizer's calibration text came from.

    Args:
        info: the quantizer's record.

    Returns:
        The recorded source; "members" for a GPTQ record without one (it calibrated on the run's members); None for a
        quantizer that does not calibrate.
    """
    calibration = info.calibration
    if isinstance(calibration, dict) and calibration.get("source"):
        return str(calibration["source"])
    return "members" if info.family == "gptq" else None


def _quantizer_columns(info: QuantizerInfo, ref_size: float | None) -> dict[str, Any]:
    """A quantizer's own columns: family, calibration, scoring engine, bits, size (and vs the reference's)."""
    size = finite_or_none(info.model_size_bytes)
    return {
        "family": info.family,
        "calibration": calibration_source(info),
        "engine": (info.options or {}).get("engine"),  # what scored a GGUF quantizer's units
        "bits": finite_or_none(info.bits),
        "effective_bits": finite_or_none(info.effective_bits),
        "model_size_bytes": size,
        "size_vs_reference": size / ref_size if size is not None and ref_size else None,
    }


def grid_rows(result: AnalysisResult) -> list[GridRow]:
    """One row per quantizer, the full-precision reference first: size, utility, r_Q, every attack.

    Args:
        result: the typed analysis result.

    Returns:
        The grid rows of report.json, each with the analysis' own decision.
    """
    decision = result.attacks.decision
    ref = result.reference_quantizer
    ref_info = result.quantizer_info.get(ref) if ref is not None else None
    ref_size = finite_or_none(ref_info.model_size_bytes if ref_info is not None else None)
    per_q = result.r_q.per_quantizer if result.r_q is not None else {}
    rows = []
    for q in _ordered_quantizers(result):
        att_block = result.attacks.quantizers.get(q) or QuantizerAttacks()
        attacks = {name: attack_summary(a, att_block.n_models) for name, a in att_block.attacks.items()}
        best_by_tpr, best_by_auroc = _best_attacks(attacks)
        q_decision = decision.per_quantizer.get(q) if decision is not None else None
        rows.append(
            GridRow(
                quantizer=q,
                is_reference=q == ref,
                **_quantizer_columns(result.quantizer_info.get(q) or QuantizerInfo(), ref_size),
                utility=_utility_row(result.utility.get(q) or UtilityEntry()),
                r_q=_r_q_row(per_q.get(q) or RQEntry()),
                r_q_status=_r_q_status(result),
                indicator=_primary_indicator(result, q),
                n_models=att_block.n_models,
                attacks=attacks,
                skipped_attacks=dict(att_block.skipped),
                best_attack=best_by_tpr,
                best_attack_by_auroc=best_by_auroc,
                strongest_vs_loss=strongest_vs_loss(attacks),
                decision=q_decision,
            )
        )
    return rows


def r_q_vs_best_attack(grid: list[GridRow]) -> dict[str, Any]:
    """Spearman rho across quantizers between mean r_Q and the best attack's metric (expected negative).

    Args:
        grid: the report's grid rows.

    Returns:
        {metric: the correlation with its p-value and the number of quantizers}.
    """
    out: dict[str, Any] = {}
    for metric, key in (("tpr_at_1pct_calibrated", "best_attack"), ("auroc", "best_attack_by_auroc")):
        pairs = [(r.r_q.mean, getattr(getattr(r, key), "value", None)) for r in grid]
        pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
        out[metric] = spearman([x for x, _ in pairs], [y for _, y in pairs]).to_dict("n_quantizers")
    return out
