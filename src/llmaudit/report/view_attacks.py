"""The report's attack sections: every attack on every quantizer (AUROC, calibrated TPR, LiRA under every
evaluation, the strongest against LOSS), the skipped attacks, the blind baseline, the attack definitions and r_Q
against attack success."""

from __future__ import annotations

from llmaudit.analyze.attacks.registry import attack_spec
from llmaudit.analyze.metrics import fpr_key
from llmaudit.common.formatting import fmt_ci, fmt_num
from llmaudit.report.cells import Cell, Section, Table, code, lit
from llmaudit.report.cells import value_cell as _v
from llmaudit.report.models import AttackEntry, GridRow, ReportJson
from llmaudit.report.policy import CHECKLIST_FPR


def _tpr_cell(att: AttackEntry | None, evaluation: str, alpha_key: str) -> Cell:
    """An attack's TPR at one FPR under one evaluation, with its interval; n/a when not measured."""
    t = None if att is None else att.tpr_at(evaluation, alpha_key)
    if t is None:
        return Cell("n/a")
    return _v(t.tpr, t.ci, unreliable=not t.reliable)


def _attack_tables(grid: list[GridRow], names: list[str]) -> list[Table]:
    """Attacks x quantizers (one row per attack: there are more attacks than quantizers): pooled AUROC,
    then calibrated TPR at the checklist's FPR."""
    key = fpr_key(CHECKLIST_FPR)
    quantizers = [r.quantizer for r in grid]

    def auroc(r: GridRow, n: str) -> Cell:
        att = r.attacks.get(n)
        return _v(att.auroc, att.auroc_ci) if att else Cell("skipped")

    def tpr(r: GridRow, n: str) -> Cell:
        return _tpr_cell(r.attacks[n], "pooled_calibrated", key) if n in r.attacks else Cell("skipped")

    return [
        Table(["AUROC (pooled)"] + quantizers, [[Cell(n, code=True)] + [auroc(r, n) for r in grid] for n in names]),
        Table(
            ["TPR at 1% FPR (calibrated)"] + quantizers,
            [[Cell(n, code=True)] + [tpr(r, n) for r in grid] for n in names],
        ),
    ]


def _strongest_table(grid: list[GridRow]) -> Table | None:
    """Per quantizer, the strongest attack and how much stronger than LOSS it is; None without LOSS."""
    rows = []
    for r in grid:
        vs = r.strongest_vs_loss
        if vs is None or (vs.tpr_at_1pct_calibrated is None and vs.auroc is None):
            continue
        tpr, auc = vs.tpr_at_1pct_calibrated, vs.auroc
        rows.append(
            [
                Cell(r.quantizer, code=True),
                Cell(tpr.attack if tpr else "n/a", code=bool(tpr)),
                Cell(fmt_num(tpr and tpr.value), unreliable=bool(tpr) and tpr.reliable is False),
                Cell(fmt_num(tpr and tpr.loss)),
                Cell(f"{tpr.gain:+.3f}" if tpr else "n/a"),
                Cell(auc.attack if auc else "n/a", code=bool(auc)),
                Cell(fmt_num(auc and auc.value)),
                Cell(fmt_num(auc and auc.loss)),
                Cell(f"{auc.gain:+.3f}" if auc else "n/a"),
            ]
        )
    if not rows:
        return None
    header = ["quantizer", "diagnostic: highest (TPR@1% cal.)", "its TPR", "LOSS TPR", "gain", "highest (AUROC)"]
    return Table(header + ["its AUROC", "LOSS AUROC", "gain"], rows)


def _skipped_bullets(grid: list[GridRow]) -> list[str]:
    """One bullet per reason an attack was skipped, naming the attacks and the quantizers."""
    by_reason: dict[str, tuple[dict, dict]] = {}
    for r in grid:
        for n, why in r.skipped_attacks.items():
            attacks, quantizers = by_reason.setdefault(why, ({}, {}))
            attacks[n], quantizers[r.quantizer] = None, None
    return [
        f"skipped {', '.join(code(n) for n in attacks)} on {', '.join(code(q) for q in quantizers)}: {lit(why)}"
        for why, (attacks, quantizers) in sorted(by_reason.items())
    ]


def _lira_table(grid: list[GridRow], names: list[str]) -> Table | None:
    """The LiRA attacks under every evaluation (naive, calibrated, per-sample, 0.1% FPR); None without LiRA."""
    key = fpr_key(CHECKLIST_FPR)
    lira = [n for n in ("lira_offline", "lira_online") if n in names]
    lira_rows = []
    for r in grid:
        for n in lira:
            att = r.attacks.get(n)
            if att is None:  # not run, or not measurable, on this quantizer
                lira_rows.append([Cell(r.quantizer, code=True), Cell(n)] + [Cell("skipped")] * 5)
                continue
            lira_rows.append(
                [
                    Cell(r.quantizer, code=True),
                    Cell(n),
                    _v(att.auroc, att.auroc_ci),
                    _tpr_cell(att, "pooled_naive", key),
                    _tpr_cell(att, "pooled_calibrated", key),
                    _tpr_cell(att, "per_sample", key),
                    _tpr_cell(att, "pooled_calibrated", fpr_key(0.001)),
                ]
            )
    if not lira_rows:
        return None
    header = ["quantizer", "LiRA", "AUROC", "TPR@1% naive", "TPR@1% calibrated", "TPR@1% per-sample avg"]
    return Table(header + ["TPR@0.1% calibrated"], lira_rows)


def _blind_baseline_paragraph(report: ReportJson) -> str | None:
    """The text-only (no model) baseline's AUROC and the attacks that do not beat it; None when not in the report."""
    blind = report.blind_baseline
    if blind is None:
        return None
    if blind.highest is not None:
        top = blind.highest
        text = (
            f"Blind baseline (no model, a text-only classifier of each run's members vs non-members): mean AUROC "
            f"{fmt_num(blind.mean_auroc)} over {blind.runs} run(s), highest {fmt_num(top.auroc)}{fmt_ci(top.ci)} (run {top.run}). "
        )
        weak = blind.attacks_not_above_it
        text += (
            f"Attacks whose AUROC does not exceed its upper bound: {lit('; '.join(f'{q}: ' + ', '.join(v) for q, v in weak.items()))}."
            if weak
            else "Every attack's AUROC exceeds its upper bound."
        )
        return text
    if blind.reason:
        return f"Blind baseline not measured: {lit(blind.reason)}."
    return None


def attacks_section(report: ReportJson) -> Section:
    """Every attack on every quantizer: the strongest in-sample, AUROC and TPR at 1% FPR per attack, LiRA's variants.

    Args:
        report: the typed report.

    Returns:
        The section's view model (a diagnostic: the verdict reads the headline).
    """
    grid = report.grid
    names = list(dict.fromkeys(n for r in grid for n in r.attacks))
    strongest = _strongest_table(grid)
    tables = ([strongest] if strongest is not None else []) + _attack_tables(grid, names)
    lira = _lira_table(grid, names)
    if lira is not None:
        tables.append(lira)
    bullets = _skipped_bullets(grid)
    paras = [
        "Diagnostics (the verdict reads the headline, the strongest attack chosen on other folds: section Verdict): "
        "every attack on every quantizer's final checkpoints, each run in turn as the target (leave-one-out references). "
        "AUROC pooled over targets; TPR at 1% FPR with per-sample calibration (the pooled-naive TPR overstates risk, docs/science.md section 4), "
        "95% bootstrap intervals in brackets; † = unreliable (fewer than 10/alpha non-members). Loss-based attacks on models that did not "
        "overfit are often near chance: an interval containing 0.5 AUROC means no measurable leakage by that attack, not proof of privacy. "
        "The first table names, per quantizer, the attack highest on all the data (in-sample) and its gain over LOSS. EZ-MIA, WBC and ref_qbase compare the target "
        "with the base model (the reference unit; `*_qbase`: the base quantized like the target), RMIA with the other runs; "
        "the variants are labelled conventions of the published code (docs/science.md section 4).",
    ]
    blind = _blind_baseline_paragraph(report)
    if blind is not None:
        paras.append(blind)
    return Section("Membership inference attacks", paras, tables, bullets=bullets, anchor="attacks")


def _summary(name: str) -> str:
    """The registered attack's definition in words (an attack not registered in this process: none)."""
    try:
        return attack_spec(name).summary + "; "
    except ValueError:
        return ""


def definitions_section(report: ReportJson) -> Section:
    """The attacks' recorded definitions (`version:parameters`), one bullet per attack.

    Args:
        report: the typed report.

    Returns:
        The section's view model.
    """
    defs = report.provenance.attack_definitions
    return Section(
        "Attack definitions",
        ["Recorded with every result so that scores under different definitions are never compared silently:"],
        bullets=[f"{code(n)}: {_summary(n)}{code(d)}" for n, d in (defs.items() if defs else ())],
        anchor="definitions",
    )


def _spearman_cell(metrics: dict, m: str) -> Cell:
    entry = metrics.get(m) if isinstance(metrics.get(m), dict) else {}
    return Cell(fmt_num(entry.get("rho")), f"p {fmt_num(entry.get('p_value'))}")


def correlation_section(report: ReportJson) -> Section:
    """Spearman's rho between the quantizers' mean r_Q and attack success, per metric and per attack.

    Args:
        report: the typed report.

    Returns:
        The section's view model.
    """
    paras = [
        "Spearman rho between the quantizers' mean r_Q and attack success; negative = higher r_Q went with weaker attacks, as the indicator claims."
    ]
    best_bits = [
        f"{m}: rho {fmt_num(v.rho)} (p {fmt_num(v.p_value)}, {v.n_quantizers} quantizers)"
        for m, v in report.r_q_vs_best_attack.items()
    ]
    if best_bits:
        paras.append("Against the best attack per quantizer: " + "; ".join(best_bits) + ".")
    per_attack = report.spearman_r_q_vs_attacks.attacks if report.spearman_r_q_vs_attacks else {}
    rows = [
        [Cell(attack, code=True)]
        + [_spearman_cell(metrics, m) for m in ("auroc", "tpr_at_1pct_naive", "tpr_at_1pct_calibrated")]
        for attack, metrics in per_attack.items()
        if isinstance(metrics, dict)
    ]
    tables = (
        [Table(["attack", "rho vs AUROC", "rho vs TPR@1% naive", "rho vs TPR@1% calibrated"], rows)] if rows else []
    )
    by_size = report.indicator_stability.by_size if report.indicator_stability else []
    if by_size:
        tables.append(
            Table(
                ["runs used", "mean rho with the all-runs ranking", "std"],
                [[Cell(str(v.k_runs)), Cell(fmt_num(v.mean_rho)), Cell(fmt_num(v.std_rho))] for v in by_size],
            )
        )
        paras.append(
            "Stability of the r_Q ranking: Spearman rho between the ranking from a random subset of runs and from all runs (second table)."
        )
    return Section("r_Q against attack success", paras, tables, anchor="correlation")
