"""The report's view model: sections of paragraphs, tables of cells and figures, shared by the Markdown and HTML
renderers so both show the same numbers. The shipped sections are registered here (`SHIPPED_SECTIONS`, in the
report's order) like any other (`llmaudit.report.section_registry`); they read the typed report
(`llmaudit.report.models.ReportJson`), parsed once by `shown_sections`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci, fmt_size
from llmaudit.report.answer import design_sentence
from llmaudit.report.answer_view import answer_banner, answer_screen, answer_section
from llmaudit.report.cells import Cell, Section, Table, code, lit
from llmaudit.report.cells import value_cell as _v
from llmaudit.report.models import BestAttack, Criterion, GridRow, ReportJson, as_report
from llmaudit.report.plots import FIGURES
from llmaudit.report.policy import DISABLED, FAIL, INCONCLUSIVE, NOT_MEASURED, PASS
from llmaudit.report.release import direction_of, headline_of
from llmaudit.report.section_registry import SectionSpec, register, registered_sections
from llmaudit.report.utility_view import divergence_cells, utility_limit_text, utility_section
from llmaudit.report.verdict_view import comparison_section, rule_bullets, verdict_section
from llmaudit.report.view_attacks import attacks_section, correlation_section, definitions_section
from llmaudit.report.view_context import (
    DAMAGE_CAVEAT,
    indicators_section,
    memorization_section,
    provenance_section,
    reading_section,
    samples_section,
)
from llmaudit.report.view_risks import epsilon_section, extraction_section, release_sets_section

__all__ = ["DAMAGE_CAVEAT", "SHIPPED_SECTIONS", "ordered_sections", "shown_sections"]


def _criterion_cell(c: Criterion) -> Cell:
    if c.id == "utility" and (c.metric or "loss") == "loss":
        val = f"{fmt_pct(c.value)}{fmt_pct_ci(c.ci)}" if c.value is not None else "n/a"
    else:
        val = f"{fmt_num(c.value)}{fmt_ci(c.ci)}"
        if c.id == "attack_tpr" and c.attack:
            val = f"{lit(c.attack)}: {val}"
    return Cell(c.status, val, status=c.status)


def _gguf_paragraph(report: ReportJson) -> str | None:
    source = report.provenance.model_source
    if source is None or not source.gguf_file_type:
        return None
    tensors = ", ".join(f"{n} {k}" for k, n in source.gguf_tensor_types.items())
    return (
        f"The base weights were dequantized from GGUF {lit(source.gguf_file_type)} ({code(Path(source.gguf_file or '').name)}"
        + (f"; tensors: {lit(tensors)}" if source.gguf_tensor_types else "")
        + "): the full-precision reference already sits on that grid, which a quantizer aligned with it reproduces, "
        "rounding the fine-tuning back toward the base (docs/science.md section 3)."
    )


def _indicator_paragraphs(report: ReportJson) -> list[str]:
    paras = []
    agreement = report.indicator_agreement
    if agreement is not None and agreement.sentence:
        paras.append(f"**r_Q against the attacks: {agreement.verdict}.** {lit(agreement.sentence)}")
    summary = report.indicators
    primary = next((i for i in summary.indicators if i.name == summary.primary), None) if summary else None
    if primary is not None and primary.agreement is not None:
        paras.append(
            f"**{lit(primary.name)} (candidate indicator, validation {lit(primary.status)}) against the attacks: "
            f"{lit(primary.agreement.verdict)}.** {lit(primary.agreement.sentence)}"
            + (DAMAGE_CAVEAT if primary.beyond_damage == "no" else "")
        )
    return paras


def _summary_section(report: ReportJson) -> Section:
    prov = report.provenance
    adapter, data = prov.adapter, prov.data
    th = report.checklist.thresholds
    overall = {q: v.overall for q, v in report.checklist.per_quantizer.items()}
    counts = {s: sum(1 for v in overall.values() if v == s) for s in (PASS, INCONCLUSIVE, NOT_MEASURED, FAIL)}
    paras = [
        f"Model {code(Path(str(prov.model)).name if str(prov.model).startswith('/') else prov.model)} with a LoRA adapter "
        f"(r={lit(adapter and adapter.r)}). Membership design: {lit(design_sentence(report))} Data fingerprint "
        f"{code(data and data.fingerprint)}; {len(report.grid)} quantizers against the full-precision reference "
        f"{code(report.reference_quantizer)}.",
        "Release checklist: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + f" (limits: strongest attack's TPR at 1% FPR <= {th.max_tpr_at_1pct_fpr:g}, r_Q >= {th.min_r_q:g}"
        f"{' (disabled)' if th.min_r_q <= 0 else ''}, {utility_limit_text(report)}, "
        f"at least {th.min_runs} runs for a criterion over runs).",
    ]
    if report.blind_baseline is not None and report.blind_baseline.warning:
        paras.append(f"**Warning, blind baseline:** {lit(report.blind_baseline.warning)}.")
    paras += _indicator_paragraphs(report)
    if report.not_scored:
        paras.append(
            f"**Left out, not completely scored yet:** {lit(report.not_scored)} (`llmaudit score` finishes them)."
        )
    gguf = _gguf_paragraph(report)
    if gguf is not None:
        paras.append(gguf)
    return Section("Summary", paras, anchor="summary")


def _checklist_section(report: ReportJson) -> Section:
    rows = []
    for q, v in report.checklist.per_quantizer.items():
        crit = {c.id: c for c in v.criteria}
        row = report.row(q)
        rows.append(
            [
                Cell(q, code=True),
                Cell(v.overall, status=v.overall),
                _criterion_cell(crit["attack_tpr"]),
                Cell(direction_of(row) if not row.is_reference else "reference"),
                _criterion_cell(crit["r_q"]),
                _criterion_cell(crit["indicator"]),
                _criterion_cell(crit["utility"]),
            ]
        )
    reasons = []
    for q, v in report.checklist.per_quantizer.items():
        bad = [f"{c.id}: {lit(c.reason)}" for c in v.criteria if c.status not in (PASS, DISABLED)]
        if bad:
            reasons.append(f"{code(q)}: " + "; ".join(bad))
    header = ["quantizer", "overall", "leakage: TPR at 1% FPR (headline)", "vs full precision", "r_Q"]
    table = Table(
        header + ["indicator", "utility (val loss vs ref)"], rows, highlight_first=report.grid[0].is_reference
    )
    return Section(
        "Release checklist",
        [
            "Per quantizer, each criterion's status with its estimate and interval (the levels: the verdict's "
            "paragraph above); the rules are the next section."
        ],
        [table],
        bullets=["Why not PASS: " + r for r in reasons],
        anchor="checklist",
    )


def _rules_section(report: ReportJson) -> Section:
    """The checklist's rules and the release rule's statements, word for word (folded in the HTML)."""
    bullets = [lit(r) for r in report.checklist.rules] + rule_bullets(report)
    return Section("Rules of the checklist", bullets=bullets, anchor="rules", folded=True)


GRID_NOTE = (
    "Full precision is the reference (first row; first column in the HTML). Utility: validation loss of the final checkpoint, "
    "mean over runs with a 95% bootstrap interval over runs, and its relative change vs the reference. "
    "KL vs ref and same top p: divergence from the unquantized checkpoint, mean over runs (section below). "
)

GRID_LEGEND = (
    "r_Q: attack-free indicator (higher = more secure), mean over runs with a 95% bootstrap interval; rank 1 = most secure. "
    "Leakage: the headline, the strongest attack's TPR at 1% FPR chosen on other folds and measured on each "
    "(cross-fitted), the number the verdict reads. Diagnostics beside it: the highest per-sample-calibrated pooled "
    "TPR at 1% FPR over the attacks and the highest AUROC, each measured on the data it was chosen on "
    "(selection-biased upward). "
    "Calibrated on: where a calibrated quantizer (GPTQ, AWQ, a GGUF importance matrix) took its calibration text "
    "(heldout = validation records no run trained on; members = each run's own training records; file = a text the "
    "user named). "
    "† marks an estimate flagged unreliable (fewer than 10/alpha non-members)."
)


def _grid_cells(r: GridRow, task_names: list[str]) -> list[Cell]:
    """One quantizer's row of the grid table."""
    u = r.utility
    best, best_auc = r.best_attack or BestAttack(name=""), r.best_attack_by_auroc
    size = fmt_size(r.model_size_bytes) + (
        f" ({100 * r.size_vs_reference:.0f}%)" if r.size_vs_reference is not None else ""
    )
    cells = [
        Cell(r.quantizer + (" (ref)" if r.is_reference else ""), code=True),
        Cell(
            (r.family or "")
            + (f" (calibrated on {r.calibration})" if r.calibration else "")
            + (" (scored by llama.cpp)" if r.engine == "llama.cpp" else "")
        ),  # fmt: skip
        Cell(fmt_num(r.bits, 2)),
        Cell(fmt_num(r.effective_bits, 2)),
        Cell(size),
        _v(u.val_loss, u.val_loss_ci),
        Cell(fmt_pct(u.relative_change), fmt_pct_ci(u.relative_change_ci).strip()),
    ]
    cells += divergence_cells(u)
    for n in task_names:
        m = u.task_metrics.get(n)
        cells.append(_v(m and m.value, m and m.ci))
    head = headline_of(r)
    return cells + [
        _v(r.r_q.mean, r.r_q.ci, 4),
        Cell(f"{r.r_q.rank:g}" if r.r_q.rank is not None else "n/a"),
        _v(
            head and head.value,
            head and head.low is not None and head.high is not None and [head.low, head.high] or None,
        ),
        Cell(
            f"{best.name}: {fmt_num(best.value)}" if best.name else "n/a",
            fmt_ci(best.ci).strip(),
            unreliable=best.reliable is False,
        ),
        Cell(
            f"{best_auc.name}: {fmt_num(best_auc.value)}" if best_auc else "n/a",
            fmt_ci(best_auc and best_auc.ci).strip(),
        ),
    ]


def _grid_section(report: ReportJson) -> Section:
    task_names = sorted({n for r in report.grid for n in r.utility.task_metrics})
    header = ["quantizer", "family", "bits", "eff. bits", "size (vs ref)", "val loss", "Δ val loss vs ref"]
    header += ["KL vs ref (nats/token)", "same top p"] + [f"task: {n}" for n in task_names]
    header += ["r_Q", "r_Q rank", "leakage: TPR at 1% FPR (headline)", "diagnostic: highest TPR (cal.)"]
    header += ["diagnostic: highest AUROC"]
    rows = [_grid_cells(r, task_names) for r in report.grid]
    tasks = "Task metrics: as the recipe requests. " if task_names else "Task metrics: none requested by the recipe. "
    return Section(
        "Quantizer grid",
        [GRID_NOTE + tasks + GRID_LEGEND],
        [Table(header, rows, transpose_html=True, highlight_first=True)],
        anchor="grid",
    )


def _figures_section(report: ReportJson) -> Section:
    return Section("Figures", figures=[n for n in FIGURES if n in report.plots], anchor="figures")


SHIPPED_SECTIONS = (
    SectionSpec("answer", 10, answer_section, nav=False, html=answer_banner, terminal=answer_screen),
    SectionSpec("verdict", 20, verdict_section),
    SectionSpec("summary", 30, _summary_section),
    SectionSpec("checklist", 40, _checklist_section),
    SectionSpec("figures", 50, _figures_section),
    SectionSpec("comparison", 60, comparison_section, folded=True),
    SectionSpec("rules", 70, _rules_section, folded=True),
    SectionSpec("grid", 80, _grid_section, folded=True),
    SectionSpec("extraction", 90, extraction_section, folded=True),
    SectionSpec("release-sets", 100, release_sets_section, folded=True),
    SectionSpec("epsilon", 110, epsilon_section, folded=True),
    SectionSpec("utility", 120, utility_section, folded=True),
    SectionSpec("attacks", 130, attacks_section, folded=True),
    SectionSpec("definitions", 140, definitions_section, folded=True),
    SectionSpec("correlation", 150, correlation_section, folded=True),
    SectionSpec("indicators", 160, indicators_section, folded=True),
    SectionSpec("memorization", 170, memorization_section, folded=True),
    SectionSpec("samples", 180, samples_section, folded=True),
    SectionSpec("provenance", 190, provenance_section, folded=True),
    SectionSpec("reading", 200, reading_section, folded=True),
)
"""The shipped sections in the report's order: the answer, the verdict, the context and the checklist, the figures,
then the diagnostics and the context, folded in report.html under their titles (open with a click)."""

for _section in SHIPPED_SECTIONS:
    register(_section)


def ordered_sections() -> list[SectionSpec]:
    """Every registered section in the report's order, the shipped ones included.

    Returns:
        The sections by ascending order (`llmaudit.report.section_registry.registered_sections`).
    """
    return registered_sections()


def shown_sections(report: dict[str, Any] | ReportJson) -> list[tuple[SectionSpec, Section]]:
    """The sections this report shows, each with its view model, in the report's order.

    Args:
        report: the report, typed or as read from report.json.

    Returns:
        (registered section, its view model) for each section whose view has data in this report; each view
        model carries the section's key as its anchor and whether report.html folds it.
    """
    report = as_report(report)
    out = []
    for section in ordered_sections():
        shown = section.view(report)
        if shown is not None:
            shown.anchor, shown.folded = section.key, section.folded
            out.append((section, shown))
    return out
