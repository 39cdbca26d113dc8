"""The `llmaudit` command line.

llmaudit audit [RECIPE] [key=value ...]     finetune -> score -> report (default: the CPU demo)
llmaudit finetune RECIPE [key=value ...]    LoRA runs with membership masks and checkpoints
llmaudit score RUN_DIR_OR_RECIPE [...]      per-sample token losses of every quantized checkpoint
llmaudit report RUN_DIR                     r_Q, attacks, memorization -> report.json / .md / .html
llmaudit indicator | attack | memorization LOSS_TABLE   on any loss table (bring your own losses)
llmaudit validate synthetic | capacity      validations where the truth is known
llmaudit quantizers                         every quantizer and whether it can run here
llmaudit status RUN_DIR                     what is done, running and missing
llmaudit submit STAGE RECIPE                shard jobs on SLURM (submitit) or local processes
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer

from llmaudit.analyze.experiment import analyze
from llmaudit.common.io import read_json, to_json
from llmaudit.common.runtime import configure_threads, env_threads, set_threads
from llmaudit.config import RecipeError, apply_overrides, config_from_dict, load_recipe
from llmaudit.data.records import DataError
from llmaudit.finetune.runs import finetune as do_finetune
from llmaudit.jobs.status import format_status, stage_status
from llmaudit.jobs.submit import submit as do_submit
from llmaudit.models.builtin import BUILTIN_PREFIX
from llmaudit.models.loading import ModelError
from llmaudit.quantize import list_quantizers
from llmaudit.quantize.base import QuantizationError
from llmaudit.report.build import build_report
from llmaudit.report.markdown import render_markdown
from llmaudit.report.tables import attack_command, indicator_command, memorization_command
from llmaudit.report.write import write_report
from llmaudit.score.stage import score as do_score
from llmaudit.store.losstable import LossTableError
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.shards import parse_shard
from llmaudit.validate.capacity import capacity_command
from llmaudit.validate.synthetic.outputs import validate_synthetic_command

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Membership-privacy audit of quantized LLMs: which quantizer leaks least about the fine-tuning data?",
)
validate_app = typer.Typer(no_args_is_help=True, help="Validations on data where the truth is known.")
app.add_typer(validate_app, name="validate")

RECIPE_HELP = "A recipe YAML file or the name of a shipped recipe (demo-cpu, qwen2.5-0.5b-smolinstruct, ...)."
OVERRIDES_HELP = "Overrides as dotted key=value pairs, e.g. train.epochs=3 score.quantizers='[fp32,hqq-4]'."
SHARD_HELP = "Do only shard I of N (0-based, e.g. 0/4): units are dealt round-robin, so N jobs cover the grid once."


QUIET_LOGGERS = ("torchao", "bitsandbytes", "torch.utils._pytree")


class CliError(Exception):
    pass


def _setup() -> None:
    import warnings

    # Deprecation chatter from transformers/peft internals says nothing about the user's audit.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(level=os.environ.get("LLMAUDIT_LOG", "WARNING"), format="%(levelname)s %(name)s: %(message)s")
    if "LLMAUDIT_LOG" not in os.environ:
        # Import-time notices of optional kernels that llmaudit does not use on this machine (torchao's
        # CUDA extensions, bitsandbytes' CPU gemm from `kernels`, torch's pytree deprecation of torchao's
        # enums). LLMAUDIT_LOG=WARNING shows them again.
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    set_threads(env_threads())


def _progress(no_progress: bool) -> bool:
    """--no-progress also silences the weight-loading and download bars of transformers / huggingface_hub."""
    if no_progress:
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        disable_progress_bars()
        hf_logging.disable_progress_bar()
    return not no_progress


def _split_recipe_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The first argument is a recipe unless it looks like key=value."""
    if args and "=" not in args[0]:
        return args[0], args[1:]
    return None, args


def _load(recipe: str | None, overrides: list[str], out: Path | None):

    cfg = load_recipe(recipe, overrides)
    if out is not None:
        cfg = cfg.model_copy(update={"output_dir": str(out)})
    configure_threads(cfg.model.name.startswith(BUILTIN_PREFIX))
    return cfg


def _cfg_from_run_dir_or_recipe(target: str | None, overrides: list[str], out: Path | None):
    """A run directory (its manifest's config, plus overrides) or a recipe."""

    if target and Path(target).is_dir() and (Path(target) / "manifest.json").exists():
        store = RunStore(target)
        raw = apply_overrides(store.manifest()["config"], overrides)
        raw["output_dir"] = str(Path(target))
        cfg = config_from_dict(raw, source=f"{target}/manifest.json")
        configure_threads(cfg.model.name.startswith(BUILTIN_PREFIX))
        return cfg, store
    cfg = _load(target, overrides, out)
    return cfg, RunStore(cfg.resolved_output_dir())


@app.command(context_settings={"allow_extra_args": True})
def finetune(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]. {RECIPE_HELP} {OVERRIDES_HELP}"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    shard: str | None = typer.Option(None, help=SHARD_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help="Print concise lines instead of progress bars."),
) -> None:
    """LoRA fine-tuning runs, each on a random subset of the sample pool (membership recorded), with adapter
    checkpoints along each trajectory. Rerunning skips finished runs and resumes interrupted ones."""
    recipe, overrides = _split_recipe_args(list(args or []))
    cfg = _load(recipe, overrides, out)
    store = do_finetune(cfg, shard=parse_shard(shard), progress=_progress(no_progress))
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate/torchrun only the main process reports
        typer.echo(f"[finetune] done: {store.root}")


@app.command(context_settings={"allow_extra_args": True})
def score(
    args: list[str] = typer.Argument(None, help="RUN_DIR or RECIPE, then key=value overrides of the score section."),
    out: Path | None = typer.Option(None, "--out", help="Run directory when a recipe is given."),
    shard: str | None = typer.Option(None, help=SHARD_HELP),
    no_progress: bool = typer.Option(False, "--no-progress"),
) -> None:
    """Per-sample token losses of every (run, checkpoint, quantizer) unit, one parquet loss table per unit.
    Impossible quantizer requests are rejected before any work; finished units are skipped."""
    target, overrides = _split_recipe_args(list(args or []))
    cfg, store = _cfg_from_run_dir_or_recipe(target, overrides, out)
    do_score(cfg, store, shard=parse_shard(shard), progress=_progress(no_progress))


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="The experiment directory written by finetune/score."),
    include_samples: bool = typer.Option(
        False,
        "--include-samples",
        help="Also print the text of the most vulnerable samples (off: ids and scores only).",
    ),
) -> None:
    """Compute r_Q, the attacks and memorization from the loss tables and write report.json, report.md
    and a self-contained report.html (plots embedded)."""
    store = RunStore(run_dir)
    cfg = store.config()
    configure_threads(cfg.model.name.startswith(BUILTIN_PREFIX))
    result = analyze(cfg, store)
    paths = write_report(store, result, include_samples=include_samples)
    typer.echo(f"[report] wrote {', '.join(str(p) for k, p in paths.items() if k != 'plots')}")


@app.command(context_settings={"allow_extra_args": True})
def audit(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]; default: the CPU demo. {OVERRIDES_HELP}"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    no_progress: bool = typer.Option(False, "--no-progress"),
) -> None:
    """finetune, score and report in order. `llmaudit audit` alone runs the CPU demo (a few minutes)."""
    import time

    t0 = time.time()
    recipe, overrides = _split_recipe_args(list(args or []))
    cfg = _load(recipe, overrides, out)
    progress = _progress(no_progress)
    store = do_finetune(cfg, progress=progress)
    do_score(cfg, store, progress=progress)
    result = analyze(cfg, store)
    paths = write_report(store, result)
    typer.echo("")
    typer.echo(render_markdown(build_report(result), only=("summary", "checklist")).rstrip())
    typer.echo("")
    typer.echo(
        f"[audit] finished in {time.time() - t0:.0f}s; wrote {', '.join(str(p) for k, p in paths.items() if k != 'plots')}"
    )


@app.command()
def indicator(
    loss_table: Path = typer.Argument(..., help="A loss-table parquet file or a directory of them."),
    out: Path = typer.Option(Path("indicator.json"), "--out", help="JSON file to write."),
    split: str = typer.Option("val", help="Which split's losses enter r_Q (val = held-out, as in Algorithm 1)."),
) -> None:
    """r_Q per (run, quantizer) by Algorithm 2, the mean over runs with bootstrap intervals, ranks and stability."""
    res = indicator_command(loss_table, out, split=split)
    for q, entry in res["per_quantizer"].items():
        agg = entry["r_q"]
        typer.echo(f"{q:>14}: r_Q = {agg['mean']:.4g} [{agg['ci_low']:.4g}, {agg['ci_high']:.4g}] rank {entry['rank']}")
    typer.echo(f"wrote {out}")


@app.command()
def attack(
    loss_table: Path = typer.Argument(..., help="A loss-table parquet file or a directory of them."),
    out: Path = typer.Option(Path("attacks.json"), "--out", help="JSON file to write (ROC plots beside it)."),
    n_boot: int = typer.Option(500, help="Bootstrap resamples for the intervals."),
    fpc: str = typer.Option(
        "auto", help="Finite population correction: auto (from --n-pool/--n-train), off, or a number."
    ),
    n_pool: int | None = typer.Option(None, help="Pool size N_+ the runs' training sets were drawn from."),
    n_train: float | None = typer.Option(None, help="Training set size N per run."),
    r_q: Path | None = typer.Option(None, "--r-q", help="indicator.json (or {quantizer: r_Q} JSON) to correlate with."),
) -> None:
    """Every attack on each quantizer's final checkpoint, each run in turn as the target, with calibrated pooling."""
    rq = None
    if r_q is not None:
        data = read_json(r_q)
        rq = {q: e["r_q"]["mean"] for q, e in data["per_quantizer"].items()} if "per_quantizer" in data else data
    attack_command(loss_table, out, n_boot=n_boot, fpc=fpc, n_pool=n_pool, n_train=n_train, r_q=rq)
    typer.echo(f"wrote {out}")


@app.command()
def memorization(
    loss_table: Path = typer.Argument(..., help="A loss-table parquet file or a directory of them."),
    out: Path = typer.Option(Path("memorization.json"), "--out"),
    reference: str = typer.Option("base", help="'base' (run -1 rows) or run=R,quantizer=Q,checkpoint=C."),
    adapter_params: int | None = typer.Option(None, help="Trainable adapter parameters (bits per parameter)."),
    model_params: int | None = typer.Option(None, help="Model parameters."),
    bits_per_param: float = typer.Option(3.6, help="Capacity estimate in bits per parameter."),
) -> None:
    """Unintended memorization in bits (Morris et al.) per quantizer, members vs non-members."""
    memorization_command(
        loss_table,
        out,
        reference=reference,
        adapter_params=adapter_params,
        model_params=model_params,
        capacity_bits_per_param=bits_per_param,
        markdown_out=out.with_suffix(".md"),
    )
    typer.echo(f"wrote {out} and {out.with_suffix('.md')}")


@validate_app.command("synthetic", context_settings={"allow_extra_args": True})
def validate_synthetic(
    args: list[str] = typer.Argument(None, help="[RECIPE] [key=value ...] (default recipe: synthetic-validation)."),
    out: Path | None = typer.Option(None, "--out", help="Output directory (default ./synthetic-validation)."),
) -> None:
    """The indicator paper's synthetic validation: r_Q ranking vs baseline MIS ranking of 8 simple quantizers."""
    recipe, overrides = _split_recipe_args(list(args or []))
    validate_synthetic_command(Path(recipe) if recipe else None, overrides, out)


@validate_app.command("capacity")
def validate_capacity(
    out: Path = typer.Option(Path("llmaudit-out/capacity.json"), "--out"),
    seed: int = typer.Option(0),
) -> None:
    """Memorization capacity (bits per parameter) of tiny models on uniformly random tokens (known entropy)."""
    capacity_command(out, seed=seed, markdown_out=out.with_suffix(".md"))


@app.command()
def quantizers() -> None:
    """Every registered quantizer, its family and bits, and whether its library and device are available."""
    for info in list_quantizers():
        status = "ok" if info.available else f"unavailable: {info.reason}"
        typer.echo(f"{info.name:>12}  {info.family:<6} {info.bits:>5} bits  {status}")


@app.command()
def status(
    run_dir: Path = typer.Argument(..., help="The experiment directory written by finetune/score/submit."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON (for scripts)."),
) -> None:
    """What is done, running and missing: runs and their checkpoints, scoring units per quantizer, the report.
    A unit whose job was killed shows as missing (rerunning the stage resumes it)."""
    result = stage_status(RunStore(run_dir))
    typer.echo(to_json(result).rstrip() if as_json else format_status(result))


@app.command(context_settings={"allow_extra_args": True})
def submit(
    stage: str = typer.Argument(..., help="finetune, score, report, or all (the three in order)."),
    args: list[str] = typer.Argument(
        None,
        help=f"RECIPE (or RUN_DIR for score/report), then key=value overrides, e.g. cluster.shards=8. {RECIPE_HELP}",
    ),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
) -> None:
    """Send a stage to a cluster as cluster.shards independent shard jobs (`--shard I/N` each) through submitit:
    a SLURM array job per stage with `cluster.cluster: slurm` (later stages wait for earlier ones), or local
    processes with `cluster.cluster: local` (waits until they finish). Every stage resumes from disk, so
    submitting again after a crash or preemption redoes nothing that is finished."""
    if stage not in ("finetune", "score", "report", "all"):
        raise typer.BadParameter(f"{stage!r} is not one of finetune, score, report, all", param_hint="STAGE")
    target, overrides = _split_recipe_args(list(args or []))
    cfg, store = _cfg_from_run_dir_or_recipe(target, overrides, out)
    jobs = do_submit(cfg, stage, echo=typer.echo)  # type: ignore[arg-type]
    typer.echo(f"[submit] {len(jobs)} job(s); `llmaudit status {store.root}` shows progress")


def main() -> None:
    _setup()
    try:
        app()
    except (
        CliError,
        RecipeError,
        DataError,
        StoreError,
        ModelError,
        LossTableError,
        QuantizationError,
        FileNotFoundError,
        FloatingPointError,
        ValueError,
    ) as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
