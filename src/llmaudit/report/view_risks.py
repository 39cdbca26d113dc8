"""The report's sections on extraction risk, release sets and the one-run epsilon lower bound (docs/science.md
sections 13-15), from the typed report (`llmaudit.report.models_risks`)."""

from __future__ import annotations

from llmaudit.analyze.decision.models import Estimate
from llmaudit.common.formatting import fmt_num
from llmaudit.report.cells import Cell, Section, Table, lit
from llmaudit.report.models import ReportJson
from llmaudit.report.models_risks import ExtractionSection, ReleaseSetNotMeasured

MEASURES = {"greedy": "greedy", "sampled": "(n, p)"}


def estimate_text(e: Estimate | None, digits: int = 3) -> str:
    """An estimate as 'value [low, high]'.

    Args:
        e: the estimate, or None.
        digits: significant digits of each number.

    Returns:
        The text; 'n/a' without a value, an unbounded side as n/a.
    """
    if e is None or e.value is None:
        return "n/a"
    return f"{fmt_num(e.value, digits)} [{fmt_num(e.low, digits)}, {fmt_num(e.high, digits)}]"


def _estimate_cell(e: Estimate | None) -> Cell:
    if e is None or e.value is None:
        return Cell("n/a")
    return Cell(fmt_num(e.value), f"[{fmt_num(e.low)}, {fmt_num(e.high)}]")


def _extraction_rows(ex: ExtractionSection) -> list[list[Cell]]:
    rows = []
    for q, block in ex.risk.per_quantizer.items():
        rates = {r.measure: r for r in block.rates}
        changes = {c.measure: c for c in block.comparison}
        cells = [Cell(q, code=True)]
        for m in MEASURES:
            r = rates.get(m)
            cells += [_estimate_cell(r and r.members), _estimate_cell(r and r.nonmembers)]
            cells += [_estimate_cell(r and r.memorized)]
            c = changes.get(m)
            cells.append(
                Cell(c.direction, estimate_text(c.memorized))
                if c
                else Cell("reference" if q == ex.risk.reference else "n/a")
            )
        rows.append(cells)
    return rows


def _greedy_check_bullets(ex: ExtractionSection) -> list[str]:
    out = []
    for q, c in ex.greedy_check.items():
        verdict = "equal row by row" if c.agree else f"{c.top1_only} top-1-only and {c.text_only} text-only rows differ"
        out.append(
            f"{lit(q)}: greedy rate from the top-1 flags {fmt_num(c.rate_top1)}, from the generated greedy answers "
            f"{fmt_num(c.rate_text)} on {c.answers} validation answers ({verdict})"
        )
    return out


def extraction_section(report: ReportJson) -> Section | None:
    """Extraction rates of members and non-members per quantizer with their intervals, and the paired change of the
    memorized part against full precision.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no extraction block.
    """
    ex = report.extraction
    if ex is None or not ex.risk.per_quantizer:
        return None
    risk = ex.risk
    header = ["quantizer"]
    for label in MEASURES.values():
        header += [f"{label}: members", f"{label}: non-members", f"{label}: memorized", f"{label}: vs reference"]
    paras = [
        "How often the training response comes back from the prompt, without generating: **greedy** = "
        f"{lit(risk.definitions.get('greedy', ''))}; **(n, p)** with n = {risk.n}, p = {risk.p:g} = "
        f"{lit(risk.definitions.get('sampled', ''))} (p_z >= {risk.p_exact_threshold:.5f}). Members are the "
        "(run, record) pairs trained on, non-members the others; memorized = members minus non-members (95% "
        "intervals, records resampled with all their runs). vs reference: the memorized part's paired change "
        f"against {lit(risk.reference or 'n/a')} (MORE / LESS / SAME / CANNOT TELL, as the release decision's "
        "comparison)."
    ]
    bullets = [lit(c.sentence) for b in risk.per_quantizer.values() for c in b.comparison]
    bullets += [f"{lit(q)}: {lit(why)}" for q, b in risk.per_quantizer.items() for why in b.not_measured.values()]
    bullets += _greedy_check_bullets(ex)
    return Section(
        "Extraction risk per quantizer",
        paras,
        [Table(header, _extraction_rows(ex), highlight_first=True)],
        bullets,
        anchor="extraction",
    )


def release_sets_section(report: ReportJson) -> Section | None:
    """Each release set's verdict under the release rule and its difference with its best single file.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no release sets.
    """
    if not report.release_sets:
        return None
    header = ["release set", "verdict", "strongest-attack TPR", "best single file", "set - best single file"]
    rows, bullets = [], []
    for s in report.release_sets:
        if isinstance(s, ReleaseSetNotMeasured):
            rows.append([Cell(s.name, code=True), Cell("NOT MEASURED", status="NOT MEASURED")] + [Cell("n/a")] * 3)
            bullets.append(f"{lit(s.name)}: {lit(s.not_measured)}")
            continue
        tpr = s.decision.strongest.tpr if s.decision.strongest is not None else None
        rows.append(
            [
                Cell(s.name, code=True),
                Cell(s.decision.status, status=s.decision.status),
                _estimate_cell(tpr),
                Cell(s.best_single_file or "n/a", code=bool(s.best_single_file)),
                Cell(s.direction, estimate_text(s.versus_best_single)),
            ]
        )
        bullets.append(lit(s.sentence))
    paras = [
        "Files of one fine-tune published together, judged by the release rule as one release: per attack the "
        "files' scores combined (mean, joint, max) beside every file's own attacks; compared with the strongest "
        "single file of the set (paired bootstrap, the best file retaken in every resample)."
    ]
    return Section("Release sets", paras, [Table(header, rows)], bullets, anchor="release-sets")


def epsilon_section(report: ReportJson) -> Section | None:
    """The one-run epsilon lower bound per quantizer, or why the store's design gives none.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no epsilon block.
    """
    eps = report.epsilon
    if eps is None:
        return None
    if not eps.qualifies:
        why = f"Not computed for this store ({lit(eps.design)} membership): {lit(eps.reason)}."
        return Section("Privacy-loss lower bound (one run)", [why], anchor="epsilon")
    header = ["quantizer", "epsilon_lb", "attack", "k+ / k-", "correct / guesses", "pairs m"]
    rows = []
    for q, b in eps.per_quantizer.items():
        value = fmt_num(b.epsilon_lb) if b.status == "MEASURED" else "NOT MEASURED"
        rows.append(
            [
                Cell(q, code=True),
                Cell(value, b.reason),
                Cell(b.attack or "n/a", code=bool(b.attack)),
                Cell(f"{b.k_plus} / {b.k_minus}" if b.k_plus is not None else "n/a"),
                Cell(f"{b.correct} / {b.guesses}" if b.guesses is not None else "n/a"),
                Cell(str(b.records) if b.records is not None else "n/a"),
            ]
        )
    first = next(iter(eps.per_quantizer.values()), None)
    paras = [lit(first.statement)] if first else []
    if first:
        paras.append(
            f"Significance {first.significance:g}, delta {first.delta:g}, k+ and k- chosen by {lit(first.strategy)} "
            f"over {first.hypotheses} hypotheses (attacks that read models only, each also centred on its record)."
        )
    return Section("Privacy-loss lower bound (one run)", paras, [Table(header, rows)], anchor="epsilon")
