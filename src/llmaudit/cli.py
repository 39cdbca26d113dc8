"""The `llmaudit` command line.

llmaudit audit [RECIPE] [key=value ...]     finetune -> score -> report (default: the CPU demo)
llmaudit finetune RECIPE [key=value ...]    LoRA runs with membership masks and checkpoints
llmaudit score RUN_DIR_OR_RECIPE [...]      per-sample token losses of every quantized checkpoint
llmaudit report RUN_DIR                     r_Q, attacks, memorization -> report.json / .md / .html
llmaudit import TRAINING_DIR --base M --train F --heldout F --out RUN_DIR   audit your own fine-tune
llmaudit indicator | attack | memorization LOSS_TABLE   on any loss table (bring your own losses)
llmaudit validate synthetic | capacity      validations where the truth is known
llmaudit quantizers                         every quantizer and whether it can run here
llmaudit status RUN_DIR                     what is done, running and missing
llmaudit submit STAGE RECIPE                shard jobs on SLURM (submitit) or local processes
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from pathlib import Path

import typer

from llmaudit.analyze.experiment import analyze
from llmaudit.common.errors import UserError
from llmaudit.common.io import read_json, to_json
from llmaudit.common.runtime import env_threads, set_threads
from llmaudit.finetune.runs import finetune as do_finetune
from llmaudit.jobs.importing import run_import
from llmaudit.jobs.local import score_in_processes
from llmaudit.jobs.plan import format_plan, make_plan
from llmaudit.jobs.status import format_status, report_is_current, stage_status
from llmaudit.jobs.submit import submit as do_submit
from llmaudit.jobs.targets import config_from_recipe, config_from_run_dir, resolve_target, split_recipe_args
from llmaudit.quantize import list_quantizers
from llmaudit.report.model_card import UnknownQuantizerError
from llmaudit.report.tables import attack_command, attack_summary_lines, indicator_command, memorization_command
from llmaudit.report.terminal import gate_decision, print_summary
from llmaudit.report.write import write_model_card, write_report
from llmaudit.score.stage import score as do_score
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import parse_shard
from llmaudit.validate.capacity import capacity_command
from llmaudit.validate.indicators import markdown_table, validate_indicators_command
from llmaudit.validate.synthetic.outputs import validate_synthetic_command

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help shows what to type: `[RECIPE]`, `score.quantizers='[fp32,hqq-4]'` are not markup
    help="Membership-privacy audit of quantized LLMs: which quantizer leaks least about the fine-tuning data?",
)
validate_app = typer.Typer(
    no_args_is_help=True, rich_markup_mode=None, help="Validations on data where the truth is known."
)
app.add_typer(validate_app, name="validate")


def _print_version(value: bool) -> None:
    if value:
        from llmaudit import __version__

        typer.echo(f"llmaudit {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print llmaudit's version and exit."
    ),
) -> None:
    """Membership-privacy audit of quantized LLMs: which quantizer leaks least about the fine-tuning data?"""


GATE_EXIT_CODE = 3
"""Exit code of `--gate` when the quantizer to ship is not cleared (2 means bad input; 1 an internal error)."""

RECIPE_HELP = "A recipe YAML file or the name of a shipped recipe (demo-cpu, qwen2.5-0.5b-smolinstruct, ...)."
OVERRIDES_HELP = "Overrides as dotted key=value pairs, e.g. train.epochs=3 score.quantizers='[fp32,hqq-4]'."
SHARD_HELP = "Do only shard I of N (0-based, e.g. 0/4): units are dealt round-robin, so N jobs cover the grid once."


QUIET_LOGGERS = ("torchao", "bitsandbytes", "torch.utils._pytree")


class CurrentStderrHandler(logging.StreamHandler):
    """A log handler that writes to whatever sys.stderr is when a record is emitted, not to the stream that was
    sys.stderr when logging was set up: a command run in-process (a test, a notebook) with its stderr redirected
    must not leave the root logger holding that stream after it is closed."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the current sys.stderr is used instead
        pass


def _setup() -> None:
    # Deprecation chatter from transformers/peft internals says nothing about the user's audit.
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    logging.basicConfig(
        level=os.environ.get("LLMAUDIT_LOG", "WARNING"),
        format="%(levelname)s %(name)s: %(message)s",
        handlers=[CurrentStderrHandler()],
    )
    if "LLMAUDIT_LOG" not in os.environ:
        # Import-time notices of optional kernels that llmaudit does not use on this machine (torchao's
        # CUDA extensions, bitsandbytes' CPU gemm from `kernels`, torch's pytree deprecation of torchao's
        # enums). LLMAUDIT_LOG=WARNING shows them again.
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
    set_threads(env_threads())
    if not sys.stderr.isatty():  # a log file or a pipe: no carriage-return frames from the libraries' bars either
        _progress(True)


def _progress(no_progress: bool) -> bool:
    """Progress bars only on a terminal: --no-progress, or a stderr that is not a TTY (a log, a pipe), gives
    concise lines instead, and silences the weight-loading and download bars of transformers / huggingface_hub."""
    no_progress = no_progress or not sys.stderr.isatty()
    if no_progress:
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        disable_progress_bars()
        hf_logging.disable_progress_bar()
    return not no_progress


RELEASE_HELP = "The quantizer you ship: model_card.md describes it and --gate judges it (default: the recommended one)."
GATE_HELP = (
    f"Exit with code {GATE_EXIT_CODE} when the quantizer to ship (--release, default the recommended one) is not "
    "cleared for release (overall verdict not PASS), so a CI job can block the release; 0 when it is cleared."
)


def _finish(report: dict, *, release: str | None, gate: bool) -> None:
    """The verdict on one screen (the recommendation last); with --gate, exit GATE_EXIT_CODE unless cleared."""
    typer.echo("")
    print_summary(report)
    if gate:
        cleared, why = gate_decision(report, release)
        typer.echo(f"[gate] {'cleared' if cleared else 'BLOCKED'}: {why}", err=True)
        if not cleared:
            raise typer.Exit(GATE_EXIT_CODE)


TRUST_HELP = (
    "Allow code shipped with the model (transformers' trust_remote_code). Never read from a run directory: "
    "only this flag (or your own recipe) turns it on."
)


@app.command(context_settings={"allow_extra_args": True})
def finetune(
    args: list[str] = typer.Argument(None, help=f"[RECIPE] [key=value ...]. {RECIPE_HELP} {OVERRIDES_HELP}"),
    out: Path | None = typer.Option(None, "--out", help="Run directory (default: ./llmaudit-out/<name>)."),
    shard: str | None = typer.Option(None, help=SHARD_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help="Print concise lines instead of progress bars."),
) -> None:
    """LoRA fine-tuning runs, each on a random subset of the sample pool (membership recorded), with adapter
    checkpoints along each trajectory. Rerunning skips finished runs and resumes interrupted ones."""
    recipe, overrides = split_recipe_args(list(args or []))
    cfg = config_from_recipe(recipe, overrides, out)
    store = do_finetune(cfg, shard=parse_shard(shard), progress=_progress(no_progress))
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate/torchrun only the main process reports
        typer.echo(f"[finetune] done: {store.root}")


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
    target, overrides = split_recipe_args(list(args or []))
    if target is None:  # never silently the demo's store
        raise UserError(
            "llmaudit score needs a target: a run directory (llmaudit score llmaudit-out/NAME) or a recipe "
            "(llmaudit score demo-cpu), then key=value overrides"
        )
    cfg, store = resolve_target(target, overrides, out, trust_remote_code=trust_remote_code)
    if cfg.score.processes > 1 and shard is None:
        score_in_processes(cfg, store, echo=typer.echo, deep_verify=deep_verify, refresh_utility=refresh_utility)
    else:
        do_score(
            cfg,
            store,
            shard=parse_shard(shard),
            progress=_progress(no_progress),
            deep_verify=deep_verify,
            refresh_utility=refresh_utility,
        )


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="The experiment directory written by finetune/score."),
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
    released model's card); print the verdict. An inconsistent store is refused."""
    store = RunStore(run_dir)
    cfg = config_from_run_dir(run_dir, [])
    chosen = [q.strip() for q in quantizers.split(",") if q.strip()] if quantizers else None
    if release is not None and chosen is None and not include_samples and report_is_current(store):
        card = write_model_card(store, release)  # another quantizer's card: from report.json, in seconds
        typer.echo(f"[report] wrote {card} from {store.report_dir / 'report.json'} (the report is up to date)")
        report_data = read_json(store.report_dir / "report.json", what="report")
        return _finish(report_data, release=release, gate=gate)
    if release is not None and chosen is not None and release not in chosen:  # refused before the analysis
        raise UnknownQuantizerError(f"--release {release!r} is not among --quantizers {', '.join(chosen)}: add it")
    result = analyze(cfg, store, quantizers=chosen)
    paths = write_report(store, result, include_samples=include_samples, release=release)
    typer.echo(f"[report] wrote {', '.join(str(p) for k, p in paths.items() if k != 'plots')}")
    _finish(json.loads(Path(paths["json"]).read_text(encoding="utf-8")), release=release, gate=gate)


@app.command("import", context_settings={"allow_extra_args": True})
def import_(
    args: list[str] = typer.Argument(
        None,
        help="TRAINING_DIR (the trainer's output_dir: checkpoint-N/ subdirectories and/or final weights), then "
        f"key=value overrides of the recorded config. {OVERRIDES_HELP}",
    ),
    base: str = typer.Option(
        ..., "--base", help="The base model the run(s) fine-tuned: hub id, local dir, GGUF, builtin:NAME."
    ),
    train: list[Path] = typer.Option(
        ..., "--train", help="Each run's training file (JSONL/JSON/parquet), in run order; repeat per run."
    ),
    heldout: Path = typer.Option(..., "--heldout", help="Records no run trained on (JSONL/JSON/parquet)."),
    runs: list[Path] = typer.Option(None, "--runs", help="Further training output directories, one per run (repeat)."),
    out: Path = typer.Option(..., "--out", help="The run directory to create."),
    name: str | None = typer.Option(None, "--name", help="Experiment name (default: the --out directory's name)."),
    record_format: str = typer.Option(
        "auto",
        "--format",
        help="How records were rendered in training: auto (by their fields), chat (the chat template), raw "
        "(prompt + completion as plain text) or text.",
    ),
    max_train: int | None = typer.Option(
        None, "--max-train", help="Audit at most N training records (deterministic draw)."
    ),
    max_heldout: int | None = typer.Option(
        None, "--max-heldout", help="Use at most N held-out records (deterministic draw)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the draws, the pool/validation split and the blind baseline."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars while loading models."),
    quantized: list[str] = typer.Option(
        None,
        "--quantized",
        help="NAME=PATH: your own quantized model of a run's final checkpoint, scored as given for quantizer NAME "
        "(a .gguf for gguf-*, a checkpoint directory for gptq-*, awq-4, bnb-*); once per run, in run order.",
    ),
) -> None:
    """Audit a fine-tune you trained yourself (transformers.Trainer / TRL output, LoRA or full model): writes
    a run store that references the checkpoints (digests recorded, nothing copied), takes membership from
    the training and held-out files, and measures the blind baseline (a text-only classifier of train vs
    held-out). Then `llmaudit score RUN_DIR` and `llmaudit report RUN_DIR` work as for `llmaudit finetune`."""
    _progress(no_progress)
    rest = list(args or [])
    dirs = [Path(rest.pop(0))] if rest and "=" not in rest[0] else []
    run_import(
        dirs + list(runs or []),
        base=base,
        train_files=list(train),
        heldout_file=heldout,
        out=out,
        name=name,
        record_format_option=record_format,
        max_train=max_train,
        max_heldout=max_heldout,
        seed=seed,
        overrides=rest,
        trust_remote_code=trust_remote_code,
        quantized=list(quantized or []),
        echo=typer.echo,
    )


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
    t0 = time.time()
    recipe, overrides = split_recipe_args(list(args or []))
    cfg = config_from_recipe(recipe, overrides, out)
    progress = _progress(no_progress)
    store = do_finetune(cfg, progress=progress)
    if cfg.score.processes > 1:
        score_in_processes(cfg, store, echo=typer.echo)
    else:
        do_score(cfg, store, progress=progress)
    result = analyze(cfg, store)
    paths = write_report(store, result, release=release)
    typer.echo(
        f"[audit] finished in {time.time() - t0:.0f}s; wrote {', '.join(str(p) for k, p in paths.items() if k != 'plots')}"
    )
    _finish(json.loads(Path(paths["json"]).read_text(encoding="utf-8")), release=release, gate=gate)


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
    n_boot: int = typer.Option(
        500, min=0, max=100_000, help="Bootstrap resamples for the intervals (at most 100,000, as attack.n_boot)."
    ),
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
    results = attack_command(loss_table, out, n_boot=n_boot, fpc=fpc, n_pool=n_pool, n_train=n_train, r_q=rq)
    for line in attack_summary_lines(results):
        typer.echo(line)
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
    recipe, overrides = split_recipe_args(list(args or []))
    validate_synthetic_command(Path(recipe) if recipe else None, overrides, out)


@validate_app.command("indicators", context_settings={"allow_extra_args": True})
def validate_indicators(
    args: list[str] = typer.Argument(
        None, help="[RECIPE] [key=value ...] of the synthetic protocol (default: synthetic-validation)."
    ),
    out: Path = typer.Option(
        Path("llmaudit-out/indicator-validation"), "--out", help="Output directory (indicators.json, indicators.md)."
    ),
    store: list[Path] = typer.Option(
        None,
        "--store",
        help="A reported run directory to validate against its attacks (repeat); default: the real-model recipes' stores that exist.",
    ),
    quick: bool = typer.Option(
        False, "--quick", help="2 data sets x 40 runs: a smoke test, never counts as validation."
    ),
    no_synthetic: bool = typer.Option(False, "--no-synthetic", help="Skip the synthetic protocol (stores only)."),
) -> None:
    """Every candidate attack-free indicator, the published r_Q included, on the synthetic protocol (against
    the baseline MIS) and on run stores (against their attacks), with each one's validation status."""
    recipe, overrides = split_recipe_args(list(args or []))
    result = validate_indicators_command(
        out,
        synthetic_recipe=recipe,
        overrides=overrides,
        stores=list(store) if store else None,
        quick=quick,
        synthetic=not no_synthetic,
        log=typer.echo,
    )
    typer.echo(markdown_table(result))
    typer.echo(f"wrote {out / 'indicators.json'} and {out / 'indicators.md'}")


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
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_HELP),
    no_plan: bool = typer.Option(False, "--no-plan", help="Do not print the plan (workload and time estimate) first."),
) -> None:
    """Send a stage to a cluster as cluster.shards independent shard jobs (`--shard I/N` each) through submitit:
    a SLURM array job per stage with `cluster.cluster: slurm` (later stages wait for earlier ones), or local
    processes with `cluster.cluster: local` (waits until they finish). Every stage resumes from disk, so
    submitting again after a crash or preemption redoes nothing that is finished."""
    if stage not in ("finetune", "score", "report", "all"):
        raise typer.BadParameter(f"{stage!r} is not one of finetune, score, report, all", param_hint="STAGE")
    target, overrides = split_recipe_args(list(args or []))
    cfg, store = resolve_target(target, overrides, out, trust_remote_code=trust_remote_code)
    jobs = do_submit(cfg, stage, echo=typer.echo, show_plan=not no_plan)  # type: ignore[arg-type]
    typer.echo(f"[submit] {len(jobs)} job(s); `llmaudit status {store.root}` shows progress")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 2000 else text[:2000] + " ..."


BUG_REPORTS = "the llmaudit maintainers (the issue tracker of the repository llmaudit was installed from)"


def _internal_error(exc: BaseException) -> str:
    """The one line of a failure that is not the user's: what broke, that it is llmaudit's fault, where to report."""
    return (
        f"internal error (a bug in llmaudit, not in your input): {type(exc).__name__}: {_one_line(exc)[:500]}; "
        f"please report it to {BUG_REPORTS} with the command and the traceback that LLMAUDIT_DEBUG=1 prints."
    )


def main() -> None:
    """The console entry point: bad input (a UserError) is one line on stderr and exit code 2; a machine problem
    (a missing file, a full disk) names the file, exit 2; anything else is a bug: one line saying so and where to
    report it, exit 1 (LLMAUDIT_DEBUG=1 re-raises with the traceback); an interrupt exits 130 (rerun to resume)."""
    debug = os.environ.get("LLMAUDIT_DEBUG", "") not in ("", "0")
    try:
        _setup()
        app()
    except KeyboardInterrupt:
        typer.echo("interrupted: finished units are kept; run the same command again to resume.", err=True)
        sys.exit(130)
    except UserError as exc:
        if debug:
            raise
        typer.echo(f"error: {_one_line(exc)}", err=True)
        sys.exit(2)
    except OSError as exc:  # a missing input, a full disk, a permission: name the file
        if debug:
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        typer.echo(f"error: {exc.strerror or _one_line(exc)}{where}; check the path and free space.", err=True)
        sys.exit(2)
    except Exception as exc:
        if debug:
            raise
        typer.echo(_internal_error(exc), err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
