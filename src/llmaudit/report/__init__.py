"""`llmaudit report`: the quantizer grid, privacy and utility side by side, full precision as reference.

One result object (`llmaudit.analyze.store_analysis.analyze`) is rendered three ways from one built report
(`build.build_report`): report.json (complete, strict JSON, written from the typed models of `models` and
validated against `schema.REPORT_SCHEMA`, generated from them),
report.md and a self-contained report.html (inline CSS, figures embedded as base64 PNG, no scripts, no
external resources), both made from one view model (`view.shown_sections`). The figures are also written as PNG
files under report/plots/.

    grid     one row per quantizer: size, utility, r_Q, every attack, with intervals
    policy   the release checklist (PASS / FAIL / INCONCLUSIVE / NOT MEASURED) and the recommendation
    build    the report object; models: its typed contract (every renderer reads a report.json, of this or an
             earlier version, through `models.as_report`); schema: its JSON schema, generated from the models
    view     sections (view_attacks, view_context), tables, cells; markdown, html: the renderers; plots: the figures
    write    writes everything atomically; gate: the release gate's files; model_card: the model card

Privacy of the report itself: no training text appears in any output. Samples are named by id and score
only; their text is added only with `include_samples=True` (`llmaudit report --include-samples`).
"""
