"""`llmaudit score RUN_DIR`: the loss tables of every (run, checkpoint, quantizer) unit, resumable and lockable."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    SHARD_HELP,
    TRUST_HELP,
    app,
    progress,
)
from llmaudit.store.shards import parse_shard


@app.command(context_settings={"allow_extra_args": True})
def score(
    args: list[str] = typer.Argument(None, help="RUN_DIR or RECIPE, then key=value overrides of the score section."),
    out: Path | None = typer.Option(None, "--out", help="Run directory when a recipe is given."),
    shard: str | None = typer.Option(None, help=SHARD_HELP),
    no_progress: bool = typer.Option(False, "--no-progress"),
    deep_verify: bool = typer.Option(
        False,
        "--deep-verify",
        help="Read every finished unit in full (per-token values too) and rescore any that fails.",
    ),
    refresh_utility: bool = typer.Option(
        False,
        "--refresh-utility",
        help="Also rescore the finished final units whose KL / generation columns were made with other settings "
        "(or are missing: stores scored by an earlier llmaudit).",
    ),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_HELP),
) -> None:
    """Per-sample token losses of every (run, checkpoint, quantizer) unit, one parquet loss table per unit.
    Impossible quantizer requests are rejected before any work; finished units are skipped, failed ones
    moved aside and scored again; several processes may score one store at once (units are locked)."""
    from llmaudit.planning.arguments import check_target, require_target, split_recipe_args

    target, overrides = split_recipe_args(list(args or []))
    target = require_target(target, "score")  # never silently the demo's store
    check_target(target, overrides)
    shard_spec = parse_shard(shard)  # argument errors answer before the work is imported

    from llmaudit.jobs.local import score_in_processes
    from llmaudit.planning.sizing import sizing_report
    from llmaudit.planning.targets import resolve_target
    from llmaudit.score.stage import score as do_score

    cfg, store = resolve_target(target, overrides, out, trust_remote_code=trust_remote_code)
    reach, lines = sizing_report(cfg, store)
    if not reach.verdict_reachable:  # said before the first unit is scored, not after the compute (stdout: stderr
        for line in lines:  # carries only what stops a command)
            typer.echo(f"[score] sizing: {line}")
        typer.echo("[score] WARNING: this store cannot reach a release verdict; scoring goes on")
    if cfg.score.processes > 1 and shard is None:
        score_in_processes(cfg, store, echo=typer.echo, deep_verify=deep_verify, refresh_utility=refresh_utility)
    else:
        do_score(
            cfg,
            store,
            shard=shard_spec,
            progress=progress(no_progress),
            deep_verify=deep_verify,
            refresh_utility=refresh_utility,
        )
