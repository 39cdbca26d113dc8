"""`llmaudit report RUN_DIR`: the analysis of a verified store, report.json/.md/.html, the model card, the verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    GATE_HELP,
    RELEASE_HELP,
    app,
    finish,
    finish_written,
    written,
)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="The experiment directory written by finetune/score."),
    overrides: list[str] = typer.Argument(
        None, help="key=value overrides of the report section, e.g. 'report.release_sets=[[fp32,gguf-q4_k_m]]'."
    ),
    include_samples: bool = typer.Option(
        False,
        "--include-samples",
        help="Also print the text of the most vulnerable samples (off: ids and scores only).",
    ),
    quantizers: str | None = typer.Option(
        None,
        "--quantizers",
        help="Comma-separated quantizers to report (default: every quantizer scored in the store).",
    ),
    release: str | None = typer.Option(None, "--release", help=RELEASE_HELP),
    gate: bool = typer.Option(False, "--gate", help=GATE_HELP),
) -> None:
    """Compute r_Q, the attacks and memorization from the verified loss tables and write report.json,
    report.md, a self-contained report.html (plots embedded) and model_card.md (the privacy section of the
    released model's card); print the verdict. An inconsistent store is refused. --gate always analyses the loss
    tables again (never report.json's word); --release alone writes the card from report.json when it is verified
    (`report.verify.verified_report`)."""
    from llmaudit.config import RecipeError
    from llmaudit.planning.arguments import check_run_dir

    check_run_dir(run_dir)  # argument errors answer before the work is imported
    overrides = list(overrides or [])
    outside = [o for o in overrides if not o.strip().startswith("report.")]
    if outside:
        raise RecipeError(f"{outside[0]!r}: `llmaudit report` takes overrides of the report section only (report.*)")

    from llmaudit.analyze.store_analysis import analyze
    from llmaudit.planning.status import report_is_current
    from llmaudit.planning.targets import config_from_run_dir
    from llmaudit.report.model_card import UnknownQuantizerError
    from llmaudit.report.verify import verified_report
    from llmaudit.report.write import write_model_card, write_report
    from llmaudit.store.run_store import RunStore

    store = RunStore(run_dir)
    cfg = config_from_run_dir(run_dir, overrides)
    chosen = [q.strip() for q in quantizers.split(",") if q.strip()] if quantizers else None
    if release is not None and chosen is None and not include_samples and not gate and not overrides:
        verified = verified_report(store, cfg, up_to_date=report_is_current(store))
        if verified is not None:  # another quantizer's card: from the verified report.json, in seconds
            card = write_model_card(store, release)
            typer.echo(f"[report] wrote {card} from {store.report_dir / 'report.json'} (the report is up to date)")
            return finish(verified, release=release, gate=False)
    if release is not None and chosen is not None and release not in chosen:  # refused before the analysis
        raise UnknownQuantizerError(f"--release {release!r} is not among --quantizers {', '.join(chosen)}: add it")
    result = analyze(cfg, store, quantizers=chosen)
    paths = write_report(store, result, include_samples=include_samples, release=release)
    typer.echo(f"[report] {written(p for k, p in paths.items() if k != 'plots')}")
    finish_written(paths, store, release=release, gate=gate)
