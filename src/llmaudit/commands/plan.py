"""`llmaudit plan [RECIPE | RUN_DIR]`: the grid, tokens, disk and wall time of an audit before anything runs, and
whether its design can reach a release verdict."""

from __future__ import annotations

from dataclasses import asdict

import typer

from llmaudit.commands.base import (
    OVERRIDES_HELP,
    app,
)
from llmaudit.common.io import to_json
from llmaudit.data.records import DataError


@app.command(context_settings={"allow_extra_args": True})
def plan(
    args: list[str] = typer.Argument(
        None, help=f"[RECIPE | RUN_DIR] [key=value ...]; default: the CPU demo. {OVERRIDES_HELP}"
    ),
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
    this machine or a named GPU's published peak; and whether its design (a recipe's, or a run directory's own
    membership) can reach a PASS or a FAIL. Nothing is written."""
    from llmaudit.planning.arguments import check_device, check_target, is_run_dir, split_recipe_args

    recipe, overrides = split_recipe_args(list(args or []))
    check_target(recipe, overrides)  # argument errors answer before the work is imported
    check_device(device)

    from llmaudit.planning.plan import format_plan, make_plan
    from llmaudit.planning.sizing import sizing_report
    from llmaudit.planning.targets import config_from_recipe, config_from_run_dir
    from llmaudit.store.run_store import RunStore

    store = RunStore(recipe) if is_run_dir(recipe) else None
    cfg = config_from_run_dir(recipe, overrides) if store else config_from_recipe(recipe, overrides)
    reach, lines = sizing_report(cfg, store)
    sizing = {"verdict_reachable": reach.verdict_reachable, **asdict(reach), "lines": lines}
    try:
        result = make_plan(cfg, device=device, jobs=jobs, echo=lambda *a: typer.echo(*a, err=True))
    except DataError as exc:  # a run directory whose data the plan cannot redraw (an import): sized, not priced
        if store is None:
            raise
        result = {"experiment": cfg.name, "price": f"not priced: {str(exc).splitlines()[0]}"}
    result["sizing"] = sizing
    if as_json:
        typer.echo(to_json(result).rstrip())
        return
    typer.echo(format_plan(result) if "workload" in result else f"{cfg.name}: {result['price']}")
    typer.echo("  verdict         " + "\n                  ".join(lines))
