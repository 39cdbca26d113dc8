"""The report's context sections: the attack-free indicators, memorization in bits, the most vulnerable samples,
provenance and how to read the report."""

from __future__ import annotations

from llmaudit.common.formatting import fmt_num
from llmaudit.report.cells import Cell, Section, Table, code, lit
from llmaudit.report.cells import value_cell as _v
from llmaudit.report.models import (
    Adapter,
    AttackSettings,
    DataSource,
    IndicatorProtocol,
    Membership,
    Parameters,
    ReportJson,
    Training,
)

DAMAGE_CAVEAT = (
    " On the validation grid it did not track the attacks beyond damage: with the held-out loss partialled out, "
    "its correlation with the attacks was not significant (docs/science.md section 8), so on a grid whose "
    "quantizers differ mostly in how much they damage the model it says what the utility column says."
)

MEMORIZATION_KEYS = (
    "member_mean_bits",
    "nonmember_mean_bits",
    "mean_difference_bits",
    "excess_member_bits",
    "member_bits_per_adapter_param",
)


def indicators_section(report: ReportJson) -> Section | None:
    """The published r_Q and the candidate indicators side by side, with their validation status.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no candidate indicators.
    """
    summary = report.indicators
    if not summary:
        return None
    shown = [i for i in summary.indicators if i.computable]
    primary = summary.primary
    order = ["rq_published", primary] + [i.name for i in shown if i.name not in ("rq_published", primary)]
    columns = [i for name in dict.fromkeys(order) for i in shown if i.name == name]
    header = ["quantizer"] + [f"{i.name} ({i.status})" for i in columns]
    rows = [
        [Cell(r.quantizer, code=True)] + [_v(i.values.get(r.quantizer), i.ci.get(r.quantizer), 4) for i in columns]
        for r in report.grid
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
            f"synthetic Spearman vs MIS {fmt_num(i.synthetic_spearman, 2)}; "
            if i.synthetic_spearman is not None
            else ""
        )
        agree = (i.agreement.sentence if i.agreement else "") or "not comparable"
        bullets.append(
            f"{code(i.name)} ({lit(i.version)}, {lit(i.family)}): validation {lit(i.status)}; {syn}{lit(agree)}"
            + (DAMAGE_CAVEAT if i.beyond_damage == "no" else "")
        )
    for i in summary.indicators:
        if not i.computable:
            bullets.append(f"{code(i.name)}: not computable from this store ({lit(i.reason)}).")
    return Section(
        "Attack-free indicators",
        paras,
        [Table(header, rows, transpose_html=True, highlight_first=report.grid[0].is_reference)],
        bullets=bullets,
        anchor="indicators",
    )


def memorization_section(report: ReportJson) -> Section | None:
    """Unintended memorization in bits per quantizer (members, non-members, their difference), and the capacity view.

    Args:
        report: the typed report.

    Returns:
        The section's view model, or None when the report carries no memorization block.
    """
    mem = report.memorization
    if not mem:
        return None
    rows = [
        [Cell(q, code=True), Cell(str(v.n_runs))]
        + [_v(getattr(v, k).mean, getattr(v, k).ci, 3) for k in MEMORIZATION_KEYS]
        for q, v in mem.per_quantizer.items()
    ]
    ref = mem.reference if mem.reference is not None else dict()
    paras = [
        f"Unintended memorization in bits: {lit(mem.definition)} Reference: "
        f"{'the base model before fine-tuning' if ref.get('kind') == 'base' else 'a named reference model'}; targets: each run's final checkpoint; "
        f"means over runs, brackets: {lit(mem.interval)}. Per-run detail is in report.json only (`result.memorization.per_run`).",
    ]
    if mem.adapter_capacity_bits is not None:
        paras.append(
            f"Capacity view: adapter capacity about {mem.adapter_capacity_bits:,.0f} bits; median over runs of adapter "
            f"capacity / training-set information = {fmt_num(mem.median_adapter_capacity_over_information, 2)}. "
            f"{lit(mem.capacity_note or '')}"
        )
    header = ["quantizer", "runs", "members: mean bits", "non-members: mean bits", "difference (bits/sample)"]
    header += ["excess member bits (total)", "member bits / adapter param"]
    return Section(
        "Memorization in bits",
        paras,
        [Table(header, rows, highlight_first=report.grid[0].is_reference)],
        bullets=[str(n) for n in mem.notes],
        anchor="memorization",
    )


def samples_section(report: ReportJson) -> Section:
    """The most vulnerable samples of the reference quantizer by one attack's per-sample score.

    Args:
        report: the typed report.

    Returns:
        The section's view model: ids and scores, their text only with --include-samples; the reason when no
        sample is listed.
    """
    vs = report.vulnerable_samples
    if not vs.available:
        return Section(
            "Most vulnerable samples", [f"Quantizer {code(vs.quantizer)}: {lit(vs.note)}."], anchor="samples"
        )
    header = ["rank", "sample id", "score"] + (["text"] if vs.include_samples else [])
    rows = [
        [Cell(str(s.rank)), Cell(s.sample_id, code=True), Cell(fmt_num(s.score))]
        + ([Cell(s.text if s.text is not None else "(not found in data/pool.jsonl)")] if vs.include_samples else [])
        for s in vs.samples
    ]
    paras = [
        f"Top {len(rows)} samples of the reference quantizer {code(vs.quantizer)} by the per-sample score of attack {code(vs.attack)}"
        + (f" ({lit(vs.score_definition)})" if vs.score_definition else "")
        + f"; {lit(vs.note)}."
    ]
    return Section("Most vulnerable samples", paras, [Table(header, rows)], anchor="samples")


def provenance_section(report: ReportJson) -> Section:
    """Where the numbers come from: experiment, model and adapter, training, data, membership, seeds, versions.

    Args:
        report: the typed report.

    Returns:
        The section's view model.
    """
    p = report.provenance
    data, mem, adapter = p.data or DataSource(), p.membership or Membership(), p.adapter or Adapter()
    train, params = p.train or Training(), p.parameters or Parameters()
    settings, protocol = p.attack_settings or AttackSettings(), p.indicator_protocol or IndicatorProtocol()
    versions = ", ".join(
        f"{lit(k)} {lit(v)}" for k, v in (p.library_versions.items() if p.library_versions else ()) if v
    )
    bullets = [
        f"Experiment {code(p.experiment_name)}, identity hash {code(p.identity_hash)}, run directory {code(p.run_dir)}.",
        f"Model {code(p.model)} ({lit(params.model_total)} parameters); adapter: LoRA r={lit(adapter.r)}, alpha={lit(adapter.alpha)}, "
        f"dropout={lit(adapter.dropout)}, target modules {lit(', '.join(map(str, adapter.target_modules or [])))} ({lit(params.adapter_trainable)} trainable parameters).",
        f"Training: {lit(train.runs)} runs, {lit(train.epochs)} epochs, batch {lit(train.batch_size)}, lr {lit(train.lr)}, "
        f"weight decay {lit(train.weight_decay)}, {lit(train.checkpoints_per_epoch)} checkpoint(s) per epoch.",
        f"Data: route {lit(data.route)}, source {lit(data.source)}, tasks {lit(', '.join(map(str, data.tasks or [])))}, "
        f"{lit(data.n_usable)} usable records; fingerprint {code(data.fingerprint)}.",
        f"Membership: {lit(mem.runs)} runs, pool of {lit(mem.pool_size)}, members per run {lit(sorted(set(mem.n_train or [])))}, "
        f"finite population correction factor {fmt_num(mem.fpc)}.",
        f"Seeds: {lit(', '.join(f'{k}={v}' for k, v in (p.seeds.items() if p.seeds else ())))}; attack bootstrap seed "
        f"{lit(settings.seed)}, {lit(settings.n_boot)} resamples.",
        f"llmaudit {lit(p.llmaudit_version)} (result schema v{p.result_schema_version}, report schema v{report.report_schema_version}); {versions}.",
        f"r_Q estimator: {lit(protocol.estimator)}; {lit(protocol.formula)}.",
    ]
    return Section("Provenance", [], bullets=bullets, anchor="provenance")


def reading_section(report: ReportJson) -> Section:
    """How to read the report: strict JSON, interval levels, unreliable marks, no training text by default.

    Args:
        report: the typed report (the text is the same for every report).

    Returns:
        The section's view model.
    """
    return Section(
        "Reading this report",
        bullets=[
            "report.json holds everything, including per-run detail; NaN and infinite values are null there (strict JSON).",
            "The headline leakage and the comparison with full precision carry the interval level the release decision "
            "records (shown beside them); the other intervals are 95% percentile bootstraps. An interval that crosses a "
            "checklist limit is INCONCLUSIVE, never PASS.",
            "A TPR at an FPR below 10 / (number of non-members) is unreliable and marked †; a criterion resting on it is NOT MEASURED.",
            "r_Q is the estimator of Algorithm 2 (docs/science.md section 2); `llmaudit validate synthetic` measures how well its ranking tracks the baseline MIS.",
            "No training text appears in this report unless it was written with --include-samples.",
        ],
        anchor="reading",
    )
