"""`llmaudit audit [RECIPE]`: finetune, score and report in order, then the verdict (no recipe: the CPU demo)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from llmaudit.commands.base import (
    GATE_HELP,
    OVERRIDES_HELP,
    RELEASE_HELP,
    app,
    finish_written,
    progress,
    written,
)
from llmaudit.common.memory import bounded_primitive_cache


@app.command(context_settings={"allow_extra_args": True})
def audit(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]; default: the CPU demo. {OVERRIDES_HELP}"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
    release: str | None = typer.Option(None, "--release", help=RELEASE_HELP),
    gate: bool = typer.Option(False, "--gate", help=GATE_HELP),
) -> None:
    """finetune, score and report in order, then print the verdict. `llmaudit audit` alone runs the CPU demo (a
    few minutes)."""
    from llmaudit.planning.arguments import check_target, split_recipe_args

    t0 = time.time()
    recipe, overrides = split_recipe_args(list(args or []))
    check_target(recipe, overrides)  # argument errors answer before the work is imported

    from llmaudit.analyze.store_analysis import analyze
    from llmaudit.jobs.local import finetune_stage, score_in_processes
    from llmaudit.planning.targets import config_from_recipe
    from llmaudit.report.write import write_report
    from llmaudit.score.stage import score as do_score

    with bounded_primitive_cache():  # from the start: any oneDNN work fixes the process's cache size
        cfg = config_from_recipe(recipe, overrides, out)
        show_progress = progress(no_progress)
        store = finetune_stage(cfg, recipe, overrides, shard=None, show_progress=show_progress, echo=typer.echo)
    if cfg.score.processes > 1:
        score_in_processes(cfg, store, echo=typer.echo)
    else:
        do_score(cfg, store, progress=show_progress)
    result = analyze(cfg, store)
    paths = write_report(store, result, release=release)
    typer.echo(f"[audit] finished in {time.time() - t0:.0f}s; {written(p for k, p in paths.items() if k != 'plots')}")
    finish_written(paths, store, release=release, gate=gate)
