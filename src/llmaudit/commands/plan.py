"""`llmaudit plan [RECIPE]`: the grid, tokens, disk and wall time of an audit before anything runs."""

from __future__ import annotations

import typer

from llmaudit.commands.base import (
    OVERRIDES_HELP,
    app,
)
from llmaudit.common.io import to_json
from llmaudit.jobs.plan import format_plan, make_plan
from llmaudit.jobs.targets import config_from_recipe, split_recipe_args


@app.command(context_settings={"allow_extra_args": True})
def plan(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]; default: the CPU demo. {OVERRIDES_HELP}"),
    device: str = typer.Option(
        "auto", "--device", help="auto, cpu or cuda (measured here), or a GPU to price: h100, h200, a100, l40s, a6000."
    ),
    jobs: int = typer.Option(
        1,
        "--jobs",
        min=1,
        max=100_000,
        help="Parallel shard jobs (e.g. GPUs of a SLURM array) for the parallel estimate (at most 100,000, as cluster.shards).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON (for scripts)."),
) -> None:
    """The price of an audit before it runs: runs, checkpoints, quantizers, scoring units, tokens to train
    and to score, GPTQ calibrations, disk, and the wall time per stage, from a few-second calibration on
    this machine or a named GPU's published peak. Nothing is written."""
    recipe, overrides = split_recipe_args(list(args or []))
    cfg = config_from_recipe(recipe, overrides)
    result = make_plan(cfg, device=device, jobs=jobs, echo=lambda *a: typer.echo(*a, err=True))
    typer.echo(to_json(result).rstrip() if as_json else format_plan(result))
