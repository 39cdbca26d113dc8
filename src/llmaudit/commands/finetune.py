"""`llmaudit finetune RECIPE`: LoRA runs on random subsets of the pool, membership recorded, resumable."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from llmaudit.commands.base import (
    OVERRIDES_HELP,
    RECIPE_HELP,
    SHARD_HELP,
    app,
    progress,
)
from llmaudit.common.memory import bounded_primitive_cache
from llmaudit.store.shards import parse_shard


@app.command(context_settings={"allow_extra_args": True})
def finetune(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]. {RECIPE_HELP} {OVERRIDES_HELP}"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    shard: str | None = typer.Option(None, help=SHARD_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help="Print concise lines instead of progress bars."),
) -> None:
    """LoRA fine-tuning runs, each on a random subset of the sample pool (membership recorded), with adapter
    checkpoints along each trajectory. Rerunning skips finished runs and resumes interrupted ones."""
    from llmaudit.planning.arguments import check_target, split_recipe_args

    recipe, overrides = split_recipe_args(list(args or []))
    check_target(recipe, overrides)
    shard_spec = parse_shard(shard)  # argument errors answer before the work is imported

    from llmaudit.jobs.local import finetune_stage
    from llmaudit.planning.targets import config_from_recipe

    with bounded_primitive_cache():  # from the start: any oneDNN work fixes the process's cache size
        cfg = config_from_recipe(recipe, overrides, out)
        store = finetune_stage(
            cfg, recipe, overrides, shard=shard_spec, show_progress=progress(no_progress), echo=typer.echo
        )
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate/torchrun only the main process reports
        typer.echo(f"[finetune] done: {store.root}")
