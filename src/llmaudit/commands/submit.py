"""`llmaudit submit STAGE RECIPE`: shard jobs on SLURM (submitit) or local processes."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    RECIPE_HELP,
    TRUST_HELP,
    app,
)


@app.command(context_settings={"allow_extra_args": True})
def submit(
    stage: str = typer.Argument(..., help="finetune, score, report, or all (the three in order)."),
    args: list[str] = typer.Argument(
        None,
        help=f"RECIPE (or RUN_DIR for score/report), then key=value overrides, e.g. cluster.shards=8. {RECIPE_HELP}",
    ),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_HELP),
    no_plan: bool = typer.Option(False, "--no-plan", help="Do not print the plan (workload and time estimate) first."),
) -> None:
    """Send a stage to a cluster as cluster.shards independent shard jobs (`--shard I/N` each) through submitit:
    a SLURM array job per stage with `cluster.cluster: slurm` (later stages wait for earlier ones), or local
    processes with `cluster.cluster: local` (waits until they finish). Every stage resumes from disk, so
    submitting again after a crash or preemption redoes nothing that is finished."""
    from llmaudit.planning.arguments import check_target, split_recipe_args

    if stage not in ("finetune", "score", "report", "all"):
        raise typer.BadParameter(f"{stage!r} is not one of finetune, score, report, all", param_hint="STAGE")
    target, overrides = split_recipe_args(list(args or []))
    check_target(target, overrides)  # argument errors answer before the work is imported

    from llmaudit.jobs.submit import submit as do_submit
    from llmaudit.planning.plan import format_plan, make_plan
    from llmaudit.planning.targets import resolve_target

    cfg, store = resolve_target(target, overrides, out, trust_remote_code=trust_remote_code)
    if not no_plan:  # the plan of the whole audit (`llmaudit plan`) on the cluster's devices
        device = cfg.cluster.gpu_model or ("h100" if cfg.cluster.gpus_per_job else "cpu")
        typer.echo(format_plan(make_plan(cfg, device=device, jobs=cfg.cluster.shards, echo=typer.echo)))
    jobs = do_submit(cfg, stage, echo=typer.echo)  # type: ignore[arg-type]
    typer.echo(f"[submit] {len(jobs)} job(s); `llmaudit status {store.root}` shows progress")
