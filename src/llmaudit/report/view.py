"""The report's view model: sections of paragraphs, tables of cells and figures, shared by the
Markdown and HTML renderers so both show the same numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmaudit.analyze.metrics import fpr_key
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci, fmt_size
from llmaudit.report.cells import Cell, Section, Table, code, lit
from llmaudit.report.cells import value_cell as _v
from llmaudit.report.plots import FIGURES
from llmaudit.report.policy import CHECKLIST_FPR, DISABLED, FAIL, INCONCLUSIVE, NOT_MEASURED, PASS
from llmaudit.report.release import comparison_sentence, direction_of
from llmaudit.report.utility_view import divergence_cells, utility_limit_text, utility_section
from llmaudit.report.verdict_view import comparison_section, rule_bullets, verdict_section


def _criterion_cell(c: dict[str, Any]) -> Cell:
    if c["id"] == "utility" and c.get("metric", "loss") == "loss":
        val = f"{fmt_pct(c['value'])}{fmt_pct_ci(c['ci'])}" if c["value"] is not None else "n/a"
    else:
        val = f"{fmt_num(c['value'])}{fmt_ci(c['ci'])}"
        if c["id"] == "attack_tpr" and c.get("attack"):
            val = f"{lit(c['attack'])}: {val}"
    return Cell(c["status"], val, status=c["status"])


def _summary_section(report: dict[str, Any]) -> Section:
    prov = report["provenance"]
    mem = prov.get("membership") or {}
    th = report["checklist"]["thresholds"]
    overall = {q: v["overall"] for q, v in report["checklist"]["per_quantizer"].items()}
    counts = {s: sum(1 for v in overall.values() if v == s) for s in (PASS, INCONCLUSIVE, NOT_MEASURED, FAIL)}
    paras = [
        f"Model {code(prov['model'])} with a LoRA adapter (r={lit((prov.get('adapter') or {}).get('r'))}), {lit(mem.get('runs'))} fine-tuning runs on "
        f"random halves of {lit(mem.get('pool_size'))} pool samples; data fingerprint {code((prov.get('data') or {}).get('fingerprint'))}; "
        f"{len(report['grid'])} quantizers against the full-precision reference {code(report['reference_quantizer'])}.",
        "Release checklist: "
        + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        + f" (limits: strongest attack's TPR at 1% FPR <= {th['max_tpr_at_1pct_fpr']:g}, r_Q >= {th['min_r_q']:g}"
        f"{' (disabled)' if th['min_r_q'] <= 0 else ''}, {utility_limit_text(report)}, "
        f"at least {th['min_runs']} runs for a criterion over runs).",
    ]
    blind = report.get("blind_baseline") or {}
    if blind.get("warning"):
        paras.append(f"**Warning, blind baseline:** {lit(blind['warning'])}.")
    agreement = report.get("indicator_agreement") or {}
    if agreement.get("sentence"):
        paras.append(f"**r_Q against the attacks: {agreement['verdict']}.** {lit(agreement['sentence'])}")
    summary = report.get("indicators") or {}
    primary = next((i for i in summary.get("indicators") or [] if i["name"] == summary.get("primary")), None)
    if primary and primary.get("agreement"):
        paras.append(
            f"**{lit(primary['name'])} (candidate indicator, validation {lit(primary['status'])}) against the attacks: "
            f"{lit(primary['agreement']['verdict'])}.** {lit(primary['agreement']['sentence'])}"
            + (DAMAGE_CAVEAT if primary.get("beyond_damage") == "no" else "")
        )
    if report.get("not_scored"):
        paras.append(
            f"**Left out, not completely scored yet:** {lit(report['not_scored'])} (`llmaudit score` finishes them)."
        )
    source = prov.get("model_source") or {}
    if source.get("gguf_file_type"):
        paras.append(
            f"The base weights were dequantized from GGUF {lit(source['gguf_file_type'])} ({code(Path(source.get('gguf_file', '')).name)}"
            + (
                f"; tensors: {lit(', '.join(f'{n} {k}' for k, n in source['gguf_tensor_types'].items()))}"
                if source.get("gguf_tensor_types")
                else ""
            )
            + "): the full-precision reference already sits on that grid, which a quantizer aligned with it reproduces, "
            "rounding the fine-tuning back toward the base (docs/science.md section 3)."
        )
    return Section("Summary", paras, anchor="summary")


def _checklist_section(report: dict[str, Any]) -> Section:
    rows = []
    grid = {r["quantizer"]: r for r in report["grid"]}
    for q, v in report["checklist"]["per_quantizer"].items():
        crit = {c["id"]: c for c in v["criteria"]}
        row = grid[q]
        rows.append(
            [
                Cell(q, code=True),
                Cell(v["overall"], status=v["overall"]),
                _criterion_cell(crit["attack_tpr"]),
                Cell(
                    direction_of(row), (comparison_sentence(row) or "") if not row.get("is_reference") else "reference"
                ),
                _criterion_cell(crit["r_q"]),
                _criterion_cell(crit["indicator"]),
                _criterion_cell(crit["utility"]),
            ]
        )
    reasons = []
    for q, v in report["checklist"]["per_quantizer"].items():
        bad = [f"{c['id']}: {lit(c['reason'])}" for c in v["criteria"] if c["status"] not in (PASS, DISABLED)]
        if bad:
            reasons.append(f"{code(q)}: " + "; ".join(bad))
    table = Table(
        [
            "quantizer",
            "overall",
            "attack TPR at 1% FPR (strongest, cross-fitted)",
            "vs full precision",
            "r_Q",
            "indicator",
            "utility (val loss vs ref)",
        ],
        rows,
        highlight_first=report["grid"][0]["is_reference"],
    )
    return Section(
        "Release checklist",
        ["Per quantizer, each criterion's status with its estimate and 95% interval; the rules:"],
        [table],
        bullets=[lit(r) for r in report["checklist"]["rules"]]
        + rule_bullets(report)
        + ["Why not PASS: " + r for r in reasons]
        + _biased_bullets(report),
        anchor="checklist",
    )


def _biased_bullets(report: dict[str, Any]) -> list[str]:
    """Per quantizer, the in-sample maximum over attacks, labelled selection-biased, beside the honest estimate."""
    out = []
    for q, v in report["checklist"]["per_quantizer"].items():
        a = next(c for c in v["criteria"] if c["id"] == "attack_tpr")
        top = a.get("in_sample_max") or {}
        if top.get("attack"):
            out.append(
                f"{code(q)}: in-sample maximum {code(top['attack'])} {fmt_num(top['value'])} (the highest of the attacks on "
                f"the data it was chosen on: selection-biased upward; the verdict reads the cross-fitted "
                f"{fmt_num(a.get('value'))})"
            )
    return out


def _grid_section(report: dict[str, Any]) -> Section:
    task_names = sorted({n for r in report["grid"] for n in r["utility"]["task_metrics"]})
    header = ["quantizer", "family", "bits", "eff. bits", "size (vs ref)", "val loss", "Δ val loss vs ref"]
    header += ["KL vs ref (nats/token)", "same top p"] + [f"task: {n}" for n in task_names]
    header += ["r_Q", "r_Q rank", "best attack", "TPR at 1% FPR (cal.)", "best AUROC"]
    rows = []
    for r in report["grid"]:
        u = r["utility"]
        best, best_auc = r.get("best_attack") or {}, r.get("best_attack_by_auroc") or {}
        size = fmt_size(r["model_size_bytes"]) + (
            f" ({100 * r['size_vs_reference']:.0f}%)" if r["size_vs_reference"] is not None else ""
        )
        cells = [
            Cell(r["quantizer"] + (" (ref)" if r["is_reference"] else ""), code=True),
            Cell((r["family"] or "") + (f" (calibrated on {r['calibration']})" if r.get("calibration") else "")),
            Cell(fmt_num(r["bits"], 2)),
            Cell(fmt_num(r["effective_bits"], 2)),
            Cell(size),
            _v(u["val_loss"], u["val_loss_ci"]),
            Cell(fmt_pct(u["relative_change"]), fmt_pct_ci(u["relative_change_ci"]).strip()),
        ]
        cells += divergence_cells(u)
        for n in task_names:
            m = u["task_metrics"].get(n) or {}
            cells.append(_v(m.get("value"), m.get("ci")))
        cells += [
            _v(r["r_q"]["mean"], r["r_q"]["ci"], 4),
            Cell(f"{r['r_q']['rank']:g}" if r["r_q"]["rank"] is not None else "n/a"),
            Cell(best.get("name") or "n/a"),
            _v(best.get("value"), best.get("ci"), unreliable=best.get("reliable") is False),
            Cell(
                f"{best_auc.get('name')}: {fmt_num(best_auc.get('value'))}" if best_auc else "n/a",
                fmt_ci(best_auc.get("ci")).strip(),
            ),
        ]
        rows.append(cells)
    paras = [
        "Full precision is the reference (first row; first column in the HTML). Utility: validation loss of the final checkpoint, "
        "mean over runs with a 95% bootstrap interval over runs, and its relative change vs the reference. "
        + "KL vs ref and same top p: divergence from the unquantized checkpoint, mean over runs (section below). "
        + ("Task metrics: as the recipe requests. " if task_names else "Task metrics: none requested by the recipe. ")
        + "r_Q: attack-free indicator (higher = more secure), mean over runs with a 95% bootstrap interval; rank 1 = most secure. "
        "Best attack: the attack with the highest per-sample-calibrated pooled TPR at 1% FPR; best AUROC: over all attacks. "
        "Calibrated on: where a calibrated quantizer (GPTQ, AWQ, a GGUF importance matrix) took its calibration text "
        "(heldout = validation records no run trained on; members = each run's own training records; file = a text the "
        "user named). "
        "† marks an estimate flagged unreliable (fewer than 10/alpha non-members).",
    ]
    return Section(
        "Quantizer grid", paras, [Table(header, rows, transpose_html=True, highlight_first=True)], anchor="grid"
    )


def _tpr_cell(att: dict | None, evaluation: str, alpha_key: str) -> Cell:
    """An attack's TPR at one FPR under one evaluation, with its interval; n/a when not measured."""
    t = ((att or {}).get("low_fpr") or {}).get(evaluation, {}).get(alpha_key)
    if not t:
        return Cell("n/a")
    return _v(t["tpr"], t["ci"], unreliable=not t["reliable"])


def _attack_tables(grid: list[dict[str, Any]], names: list[str]) -> list[Table]:
    """Attacks x quantizers (one row per attack: there are more attacks than quantizers): pooled AUROC,
    then calibrated TPR at the checklist's FPR."""
    key = fpr_key(CHECKLIST_FPR)
    quantizers = [r["quantizer"] for r in grid]

    def auroc(r: dict, n: str) -> Cell:
        att = r["attacks"].get(n)
        return _v(att.get("auroc"), att.get("auroc_ci")) if att else Cell("skipped")

    def tpr(r: dict, n: str) -> Cell:
        return _tpr_cell(r["attacks"].get(n), "pooled_calibrated", key) if n in r["attacks"] else Cell("skipped")

    return [
        Table(["AUROC (pooled)"] + quantizers, [[Cell(n, code=True)] + [auroc(r, n) for r in grid] for n in names]),
        Table(
            ["TPR at 1% FPR (calibrated)"] + quantizers,
            [[Cell(n, code=True)] + [tpr(r, n) for r in grid] for n in names],
        ),
    ]


def _strongest_table(grid: list[dict[str, Any]]) -> Table | None:
    """Per quantizer, the strongest attack and how much stronger than LOSS it is; None without LOSS."""
    rows = []
    for r in grid:
        vs = r.get("strongest_vs_loss") or {}
        tpr, auc = vs.get("tpr_at_1pct_calibrated") or {}, vs.get("auroc") or {}
        if not vs:
            continue
        rows.append(
            [
                Cell(r["quantizer"], code=True),
                Cell(tpr.get("attack") or "n/a", code=bool(tpr)),
                Cell(fmt_num(tpr.get("value")), unreliable=tpr.get("reliable") is False),
                Cell(fmt_num(tpr.get("loss"))),
                Cell(f"{tpr['gain']:+.3f}" if tpr else "n/a"),
                Cell(auc.get("attack") or "n/a", code=bool(auc)),
                Cell(fmt_num(auc.get("value"))),
                Cell(fmt_num(auc.get("loss"))),
                Cell(f"{auc['gain']:+.3f}" if auc else "n/a"),
            ]
        )
    if not rows:
        return None
    header = ["quantizer", "strongest (TPR@1% cal.)", "its TPR", "LOSS TPR", "gain", "strongest (AUROC)"]
    return Table(header + ["its AUROC", "LOSS AUROC", "gain"], rows)


def _skipped_bullets(grid: list[dict[str, Any]]) -> list[str]:
    """One bullet per reason an attack was skipped, naming the attacks and the quantizers."""
    by_reason: dict[str, tuple[dict, dict]] = {}
    for r in grid:
        for n, why in r["skipped_attacks"].items():
            attacks, quantizers = by_reason.setdefault(why, ({}, {}))
            attacks[n], quantizers[r["quantizer"]] = None, None
    return [
        f"skipped {', '.join(code(n) for n in attacks)} on {', '.join(code(q) for q in quantizers)}: {lit(why)}"
        for why, (attacks, quantizers) in sorted(by_reason.items())
    ]


def _lira_table(grid: list[dict[str, Any]], names: list[str]) -> Table | None:
    """The LiRA attacks under every evaluation (naive, calibrated, per-sample, 0.1% FPR); None without LiRA."""
    key = fpr_key(CHECKLIST_FPR)
    lira = [n for n in ("lira_offline", "lira_online") if n in names]
    lira_rows = []
    for r in grid:
        for n in lira:
            att = r["attacks"].get(n)
            if att is None:  # not run, or not measurable, on this quantizer
                lira_rows.append([Cell(r["quantizer"], code=True), Cell(n)] + [Cell("skipped")] * 5)
                continue
            lira_rows.append(
                [
                    Cell(r["quantizer"], code=True),
                    Cell(n),
                    _v(att["auroc"], att["auroc_ci"]),
                    _tpr_cell(att, "pooled_naive", key),
                    _tpr_cell(att, "pooled_calibrated", key),
                    _tpr_cell(att, "per_sample", key),
                    _tpr_cell(att, "pooled_calibrated", fpr_key(0.001)),
                ]
            )
    if not lira_rows:
        return None
    return Table(
        [
            "quantizer",
            "LiRA",
            "AUROC",
            "TPR@1% naive",
            "TPR@1% calibrated",
            "TPR@1% per-sample avg",
            "TPR@0.1% calibrated",
        ],
        lira_rows,
    )


def _blind_baseline_paragraph(report: dict[str, Any]) -> str | None:
    """The text-only (no model) baseline's AUROC and the attacks that do not beat it; None when not in the report."""
    blind = report.get("blind_baseline") or {}
    if blind.get("highest"):
        top = blind["highest"]
        text = (
            f"Blind baseline (no model, a text-only classifier of each run's members vs non-members): mean AUROC "
            f"{fmt_num(blind['mean_auroc'])} over {blind['runs']} run(s), highest {fmt_num(top['auroc'])}{fmt_ci(top['ci'])} (run {top['run']}). "
        )
        weak = blind.get("attacks_not_above_it") or {}
        text += (
            f"Attacks whose AUROC does not exceed its upper bound: {lit('; '.join(f'{q}: ' + ', '.join(v) for q, v in weak.items()))}."
            if weak
            else "Every attack's AUROC exceeds its upper bound."
        )
        return text
    if blind.get("reason"):
        return f"Blind baseline not measured: {lit(blind['reason'])}."
    return None


def _attacks_section(report: dict[str, Any]) -> Section:
    grid = report["grid"]
    names = list(dict.fromkeys(n for r in grid for n in r["attacks"]))
    strongest = _strongest_table(grid)
    tables = ([strongest] if strongest is not None else []) + _attack_tables(grid, names)
    lira = _lira_table(grid, names)
    if lira is not None:
        tables.append(lira)
    bullets = _skipped_bullets(grid)
    paras = [
        "Every attack on every quantizer's final checkpoints, each run in turn as the target (leave-one-out references). "
        "AUROC pooled over targets; TPR at 1% FPR with per-sample calibration (the pooled-naive TPR overstates risk, docs/science.md section 4), "
        "95% bootstrap intervals in brackets; † = unreliable (fewer than 10/alpha non-members). Loss-based attacks on models that did not "
        "overfit are often near chance: an interval containing 0.5 AUROC means no measurable leakage by that attack, not proof of privacy. "
        "The first table names, per quantizer, the strongest attack and its gain over LOSS. EZ-MIA, WBC and ref_qbase compare the target "
        "with the base model (the reference unit; `*_qbase`: the base quantized like the target), RMIA with the other runs; "
        "the variants are labelled conventions of the published code (docs/science.md section 4).",
    ]
    blind = _blind_baseline_paragraph(report)
    if blind is not None:
        paras.append(blind)
    return Section("Membership inference attacks", paras, tables, bullets=bullets, anchor="attacks")


def _definitions_section(report: dict[str, Any]) -> Section:
    defs = report["provenance"].get("attack_definitions") or {}
    return Section(
        "Attack definitions",
        ["Recorded with every result so that scores under different definitions are never compared silently:"],
        bullets=[f"{code(n)}: {code(d)}" for n, d in defs.items()],
        anchor="definitions",
    )


def _correlation_section(report: dict[str, Any]) -> Section:
    sp = report.get("spearman_r_q_vs_attacks") or {}
    best = report.get("r_q_vs_best_attack") or {}
    paras = [
        "Spearman rho between the quantizers' mean r_Q and attack success; negative = higher r_Q went with weaker attacks, as the indicator claims."
    ]
    best_bits = [
        f"{m}: rho {fmt_num(v.get('rho'))} (p {fmt_num(v.get('p_value'))}, {v.get('n_quantizers')} quantizers)"
        for m, v in best.items()
    ]
    if best_bits:
        paras.append("Against the best attack per quantizer: " + "; ".join(best_bits) + ".")
    rows = []
    for attack, metrics in (sp.get("attacks") or {}).items():
        if isinstance(metrics, dict):
            rows.append(
                [Cell(attack, code=True)]
                + [
                    Cell(
                        fmt_num((metrics.get(m) or {}).get("rho")),
                        f"p {fmt_num((metrics.get(m) or {}).get('p_value'))}",
                    )
                    for m in ("auroc", "tpr_at_1pct_naive", "tpr_at_1pct_calibrated")
                ]
            )
    tables = (
        [Table(["attack", "rho vs AUROC", "rho vs TPR@1% naive", "rho vs TPR@1% calibrated"], rows)] if rows else []
    )
    stab = report.get("indicator_stability") or {}
    if stab.get("by_size"):
        tables.append(
            Table(
                ["runs used", "mean rho with the all-runs ranking", "std"],
                [
                    [Cell(str(v["k_runs"])), Cell(fmt_num(v.get("mean_rho"))), Cell(fmt_num(v.get("std_rho")))]
                    for v in stab["by_size"]
                ],
            )
        )
        paras.append(
            "Stability of the r_Q ranking: Spearman rho between the ranking from a random subset of runs and from all runs (second table)."
        )
    return Section("r_Q against attack success", paras, tables, anchor="correlation")


DAMAGE_CAVEAT = (
    " On the validation grid it did not track the attacks beyond damage: with the held-out loss partialled out, "
    "its correlation with the attacks was not significant (docs/science.md section 8), so on a grid whose "
    "quantizers differ mostly in how much they damage the model it says what the utility column says."
)


def _indicators_section(report: dict[str, Any]) -> Section | None:
    """The published r_Q and the candidate indicators side by side, with their validation status."""
    summary = report.get("indicators")
    if not summary:
        return None
    shown = [i for i in summary["indicators"] if i["computable"]]
    primary = summary.get("primary")
    order = ["rq_published", primary] + [i["name"] for i in shown if i["name"] not in ("rq_published", primary)]
    columns = [i for name in dict.fromkeys(order) for i in shown if i["name"] == name]
    header = ["quantizer"] + [f"{i['name']} ({i['status']})" for i in columns]
    rows = [
        [Cell(r["quantizer"], code=True)]
        + [_v(i["values"].get(r["quantizer"]), i["ci"].get(r["quantizer"]), 4) for i in columns]
        for r in report["grid"]
    ]
    paras = [
        "Attack-free indicators (higher = more secure), means over runs with 95% intervals, each with its validation "
        "status from `llmaudit validate indicators` (docs/science.md section 8): `rq_published` is the indicator paper's "
        f"r_Q; {code(primary)} is this report's candidate. Only an indicator that passed validation may drive a checklist "
        "criterion. The agreement lines test each one against the attacks of this grid (expected sign: negative)."
    ]
    bullets = []
    for i in columns:
        syn = (
            f"synthetic Spearman vs MIS {fmt_num(i['synthetic_spearman'], 2)}; "
            if i["synthetic_spearman"] is not None
            else ""
        )
        agree = (i.get("agreement") or {}).get("sentence") or "not comparable"
        bullets.append(
            f"{code(i['name'])} ({lit(i['version'])}, {lit(i['family'])}): validation {lit(i['status'])}; {syn}{lit(agree)}"
            + (DAMAGE_CAVEAT if i.get("beyond_damage") == "no" else "")
        )
    for i in summary["indicators"]:
        if not i["computable"]:
            bullets.append(f"{code(i['name'])}: not computable from this store ({lit(i['reason'])}).")
    return Section(
        "Attack-free indicators",
        paras,
        [Table(header, rows, highlight_first=report["grid"][0]["is_reference"])],
        bullets=bullets,
        anchor="indicators",
    )


def _memorization_section(report: dict[str, Any]) -> Section | None:
    mem = report.get("memorization")
    if not mem:
        return None
    rows = []
    for q, v in mem["per_quantizer"].items():
        rows.append(
            [Cell(q, code=True), Cell(str(v["n_runs"]))]
            + [
                _v(v[k]["mean"], v[k]["ci"], 3)
                for k in (
                    "member_mean_bits",
                    "nonmember_mean_bits",
                    "mean_difference_bits",
                    "excess_member_bits",
                    "member_bits_per_adapter_param",
                )
            ]
        )
    ref = mem.get("reference") or {}
    paras = [
        f"Unintended memorization in bits: {lit(mem.get('definition'))} Reference: "
        f"{'the base model before fine-tuning' if ref.get('kind') == 'base' else 'a named reference model'}; targets: each run's final checkpoint; "
        f"means over runs, brackets: {lit(mem.get('interval'))}. Per-run detail is in report.json only (`result.memorization.per_run`).",
    ]
    if mem.get("adapter_capacity_bits") is not None:
        paras.append(
            f"Capacity view: adapter capacity about {mem['adapter_capacity_bits']:,.0f} bits; median over runs of adapter "
            f"capacity / training-set information = {fmt_num(mem.get('median_adapter_capacity_over_information'), 2)}. "
            f"{lit(mem.get('capacity_note') or '')}"
        )
    header = [
        "quantizer",
        "runs",
        "members: mean bits",
        "non-members: mean bits",
        "difference (bits/sample)",
        "excess member bits (total)",
        "member bits / adapter param",
    ]
    return Section(
        "Memorization in bits",
        paras,
        [Table(header, rows, highlight_first=report["grid"][0]["is_reference"])],
        bullets=[str(n) for n in mem.get("notes") or []],
        anchor="memorization",
    )


def _samples_section(report: dict[str, Any]) -> Section:
    vs = report["vulnerable_samples"]
    if not vs["available"]:
        return Section(
            "Most vulnerable samples", [f"Quantizer {code(vs['quantizer'])}: {lit(vs.get('note'))}."], anchor="samples"
        )
    header = ["rank", "sample id", "score"] + (["text"] if vs["include_samples"] else [])
    rows = [
        [Cell(str(s["rank"])), Cell(s["sample_id"], code=True), Cell(fmt_num(s["score"]))]
        + (
            [Cell(s.get("text") if s.get("text") is not None else "(not found in data/pool.jsonl)")]
            if vs["include_samples"]
            else []
        )
        for s in vs["samples"]
    ]
    paras = [
        f"Top {len(rows)} samples of the reference quantizer {code(vs['quantizer'])} by the per-sample score of attack {code(vs['attack'])}"
        + (f" ({lit(vs['score_definition'])})" if vs.get("score_definition") else "")
        + f"; {lit(vs['note'])}."
    ]
    return Section("Most vulnerable samples", paras, [Table(header, rows)], anchor="samples")


def _provenance_section(report: dict[str, Any]) -> Section:
    p = report["provenance"]
    data = p.get("data") or {}
    mem = p.get("membership") or {}
    adapter = p.get("adapter") or {}
    train = p.get("train") or {}
    params = p.get("parameters") or {}
    versions = ", ".join(f"{lit(k)} {lit(v)}" for k, v in (p.get("library_versions") or {}).items() if v)
    bullets = [
        f"Experiment {code(p.get('experiment_name'))}, identity hash {code(p.get('identity_hash'))}, run directory {code(p.get('run_dir'))}.",
        f"Model {code(p.get('model'))} ({lit(params.get('model_total'))} parameters); adapter: LoRA r={lit(adapter.get('r'))}, alpha={lit(adapter.get('alpha'))}, "
        f"dropout={lit(adapter.get('dropout'))}, target modules {lit(', '.join(map(str, adapter.get('target_modules') or [])))} ({lit(params.get('adapter_trainable'))} trainable parameters).",
        f"Training: {lit(train.get('runs'))} runs, {lit(train.get('epochs'))} epochs, batch {lit(train.get('batch_size'))}, lr {lit(train.get('lr'))}, "
        f"weight decay {lit(train.get('weight_decay'))}, {lit(train.get('checkpoints_per_epoch'))} checkpoint(s) per epoch.",
        f"Data: route {lit(data.get('route'))}, source {lit(data.get('source'))}, tasks {lit(', '.join(map(str, data.get('tasks') or [])))}, "
        f"{lit(data.get('n_usable'))} usable records; fingerprint {code(data.get('fingerprint'))}.",
        f"Membership: {lit(mem.get('runs'))} runs, pool of {lit(mem.get('pool_size'))}, members per run {lit(sorted(set(mem.get('n_train') or [])))}, "
        f"finite population correction factor {fmt_num(mem.get('fpc'))}.",
        f"Seeds: {lit(', '.join(f'{k}={v}' for k, v in (p.get('seeds') or {}).items()))}; attack bootstrap seed "
        f"{lit((p.get('attack_settings') or {}).get('seed'))}, {lit((p.get('attack_settings') or {}).get('n_boot'))} resamples.",
        f"llmaudit {lit(p.get('llmaudit_version'))} (result schema v{p.get('result_schema_version')}, report schema v{report['report_schema_version']}); {versions}.",
        f"r_Q estimator: {lit((p.get('indicator_protocol') or {}).get('estimator'))}; {lit((p.get('indicator_protocol') or {}).get('formula'))}.",
    ]
    return Section("Provenance", [], bullets=bullets, anchor="provenance")


def _reading_section() -> Section:
    return Section(
        "Reading this report",
        bullets=[
            "report.json holds everything, including per-run detail; NaN and infinite values are null there (strict JSON).",
            "Intervals are 95% percentile bootstraps; an interval that crosses a checklist limit is INCONCLUSIVE, never PASS.",
            "A TPR at an FPR below 10 / (number of non-members) is unreliable and marked †; a criterion resting on it is NOT MEASURED.",
            "r_Q is the estimator of Algorithm 2 (docs/science.md section 2); `llmaudit validate synthetic` measures how well its ranking tracks the baseline MIS.",
            "No training text appears in this report unless it was written with --include-samples.",
        ],
        anchor="reading",
    )


def sections(report: dict[str, Any]) -> list[Section]:

    figs = Section("Figures", figures=[n for n in FIGURES if n in report.get("plots", {})], anchor="figures")
    out = [
        verdict_section(report),
        _summary_section(report),
        _checklist_section(report),
        comparison_section(report),
        _grid_section(report),
        utility_section(report),
        figs,
        _attacks_section(report),
        _definitions_section(report),
        _correlation_section(report),
        _indicators_section(report),
        _memorization_section(report),
        _samples_section(report),
        _provenance_section(report),
        _reading_section(),
    ]
    return [s for s in out if s is not None]
