"""The report section on utility beyond the loss: divergence from full precision (llama.cpp's statistics) and
the task metrics of greedy answers, per quantizer, each with its interval; what was not measured, and why."""

from __future__ import annotations

from llmaudit.common.formatting import fmt_num, fmt_sig
from llmaudit.report.cells import Cell, Section, Table, code, lit, value_cell
from llmaudit.report.models import GridRow, ReportJson, Stat, UtilityRow
from llmaudit.report.utility import indistinguishable_by_kl

FIX = "`llmaudit score RUN_DIR --refresh-utility` adds them (it rescores each run's final units)"


def _stat_cell(stat: Stat | None, digits: int = 3, *, token: bool = True) -> Cell:
    """mean [interval over runs], with the token-level error as '± se' (the errors, never a bare number)."""
    if stat is None or stat.mean is None:
        return Cell("n/a")
    se = f" ± {fmt_sig(stat.token_se, 2)}" if token and stat.token_se is not None else ""
    ci = stat.ci
    return Cell(fmt_sig(stat.mean, digits) + se, f"[{fmt_sig(ci[0], digits)}, {fmt_sig(ci[1], digits)}]" if ci else "")


def _divergence_table(grid: list[GridRow]) -> Table:
    header = [
        "quantizer",
        "KL mean (nats/token)",
        "KL median",
        "KL 99%",
        "same top p",
        "RMS Δp",
        "mean Δp",
        "PPL_q / PPL_ref",
        "ln(PPL_q / PPL_ref)",
    ]
    rows = []
    for r in grid:
        d = r.utility.divergence
        if not d.measured:
            rows.append([Cell(r.quantizer, code=True), Cell("NOT MEASURED", lit(d.reason or ""))] + [Cell("")] * 7)
            continue
        rows.append(
            [
                Cell(r.quantizer + (" (ref)" if r.is_reference else ""), code=True),
                _stat_cell(d.kl_mean),
                _stat_cell(d.kl_median, token=False),
                _stat_cell(d.kl_99, token=False),
                _stat_cell(d.same_top),
                _stat_cell(d.delta_p_rms),
                _stat_cell(d.delta_p_mean),
                _stat_cell(d.ppl_ratio, 4),
                _stat_cell(d.ln_ppl_ratio, 3),
            ]
        )
    return Table(header, rows, highlight_first=bool(grid) and grid[0].is_reference)


def _task_table(grid: list[GridRow], names: list[str]) -> Table:
    rows = []
    for r in grid:
        cells = [Cell(r.quantizer + (" (ref)" if r.is_reference else ""), code=True)]
        for n in names:
            m = r.utility.task_metrics.get(n)
            drop = m.drop.value if m is not None else None
            cell = value_cell(m and m.value, m and m.ci)
            if drop is not None and not r.is_reference:
                cell.text += f" (Δ {'+' if drop <= 0 else '-'}{fmt_num(abs(drop))})"
            cells.append(cell)
        rows.append(cells)
    return Table(["quantizer"] + names, rows, highlight_first=bool(grid) and grid[0].is_reference)


def _divergence_paragraphs(report: ReportJson) -> list[str]:
    u = report.utility
    paras = [
        "Divergence from full precision, as llama.cpp's `--kl-divergence` reports it: per validation token of each "
        f"run's final checkpoint, KL(p_ref || p_q) against the unquantized model of the same checkpoint ({code(u and u.divergence_reference)} "
        "for Δp and the perplexity ratio), exact over the whole vocabulary. Each cell: mean over runs ± the token-level "
        "standard error of that mean, and in brackets the 95% bootstrap interval over runs (docs/science.md section 11). "
        "Δp is the change of the probability of the true next token; same top p the share of tokens whose most likely "
        "next token is the same."
    ]
    not_measured = [r.quantizer for r in report.grid if not r.utility.divergence.measured]
    if not_measured:
        paras.append(f"KL not measured for {lit(', '.join(not_measured))}: {FIX}.")
    return paras


def _task_paragraphs(report: ReportJson) -> list[str]:
    u = report.utility
    if u is None or not u.tasks_measured:
        return [f"Task metrics NOT MEASURED: {lit((u and u.tasks_reason) or 'no answers were generated')}."]
    paras = [
        f"Task metrics of the answers ({lit(u.generation_decoding)}) to {lit(u.generation_samples)} "
        f"validation records at each run's final checkpoint, at most {lit(u.generation_max_new_tokens)} new tokens: "
        "mean over runs [95% interval over runs], and in parentheses the change from full precision (docs/science.md "
        "section 11)."
    ]
    bullets = [f"{code(n)}: {lit(d)}" for n, d in u.task_metrics.items()]
    bullets += [f"{code(n)}: NOT MEASURED, {lit(why)}" for n, why in u.tasks_not_measured.items()]
    return paras + (["; ".join(bullets) + "."] if bullets else [])


def divergence_cells(utility: UtilityRow) -> list[Cell]:
    """A grid row's KL and same-top cells (mean over runs, interval), or NOT MEASURED.

    Args:
        utility: the grid row's utility block.

    Returns:
        The two cells: KL divergence from the reference, share of tokens with the same top prediction.
    """
    d = utility.divergence
    if not d.measured:
        return [Cell("NOT MEASURED"), Cell("NOT MEASURED")]
    return [_stat_cell(d.kl_mean, token=False), _stat_cell(d.same_top, token=False)]


def utility_limit_text(report: ReportJson) -> str:
    """The utility criterion's limit in words, for the summary.

    Args:
        report: the typed report.

    Returns:
        The limit on the metric the checklist reads (validation loss or a task metric).
    """
    th = report.checklist.thresholds
    metric = th.utility_metric or "loss"
    if metric == "loss":
        return f"validation loss increase <= {100 * th.max_utility_loss:g}%"
    crit = next((c for v in report.checklist.per_quantizer.values() for c in v.criteria if c.id == "utility"), None)
    return f"utility on {metric} {crit.comparison if crit else '<='} {fmt_sig(crit and crit.threshold)}"


def utility_section(report: ReportJson) -> Section | None:
    """Utility beside privacy: divergence from the reference and the task metrics per quantizer.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the result carries no divergence block.
    """
    if "divergence" not in report.result:
        return None
    grid = report.grid
    tables = [_divergence_table(grid)]
    names = sorted({n for r in grid for n in r.utility.task_metrics})
    if names:
        tables.append(_task_table(grid, names))
    groups = indistinguishable_by_kl(grid)
    bullets = [
        f"KL does not order {lit(', '.join(g))}: their intervals over runs overlap, so their difference in KL is "
        "within what the runs disagree on (for near-lossless quantizers, read the task metrics and attacks instead)."
        for g in groups
    ]
    return Section(
        "Utility against full precision",
        _divergence_paragraphs(report) + _task_paragraphs(report),
        tables,
        bullets=bullets,
        anchor="utility",
    )
