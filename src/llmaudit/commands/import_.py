"""`llmaudit import TRAINING_DIR --base M --train F --heldout F --out RUN_DIR`: a run store for your own fine-tune."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    OVERRIDES_HELP,
    TRUST_HELP,
    app,
    progress,
)

ARGS_HELP = (
    "TRAINING_DIR (the trainer's output_dir: checkpoint-N/ subdirectories and/or final weights), then "
    f"key=value overrides of the recorded config. {OVERRIDES_HELP}"
)
BASE_HELP = "The base model the run(s) fine-tuned: hub id, local dir, GGUF, builtin:NAME."
TRAIN_HELP = "Each run's training file (JSONL/JSON/parquet), in run order; repeat per run."
FORMAT_HELP = (
    "How records were rendered in training: auto (by their fields), chat (the chat template), raw "
    "(prompt + completion as plain text) or text."
)
QUANTIZED_HELP = (
    "NAME=PATH: your own quantized model of a run's final checkpoint, scored as given for quantizer NAME "
    "(a .gguf for gguf-*, a checkpoint directory for gptq-*, awq-4, bnb-*); once per run, in run order."
)


@app.command("import", context_settings={"allow_extra_args": True})
def import_(
    args: list[str] = typer.Argument(None, help=ARGS_HELP),
    base: str = typer.Option(..., "--base", help=BASE_HELP),
    train: list[Path] = typer.Option(..., "--train", help=TRAIN_HELP),
    heldout: Path = typer.Option(..., "--heldout", help="Records no run trained on (JSONL/JSON/parquet)."),
    runs: list[Path] = typer.Option(None, "--runs", help="Further training output directories, one per run (repeat)."),
    out: Path = typer.Option(..., "--out", help="The run directory to create."),
    name: str | None = typer.Option(None, "--name", help="Experiment name (default: the --out directory's name)."),
    record_format: str = typer.Option("auto", "--format", help=FORMAT_HELP),
    max_train: int | None = typer.Option(None, "--max-train", help="Audit at most N training records (seeded draw)."),
    max_heldout: int | None = typer.Option(None, "--max-heldout", help="At most N held-out records (seeded draw)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the draws, the pool/validation split and the blind baseline."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help=TRUST_HELP),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars while loading models."),
    quantized: list[str] = typer.Option(None, "--quantized", help=QUANTIZED_HELP),
) -> None:
    """Audit a fine-tune you trained yourself (transformers.Trainer / TRL output, LoRA or full model): writes
    a run store that references the checkpoints (digests recorded, nothing copied), takes membership from
    the training and held-out files, and measures the blind baseline (a text-only classifier of train vs
    held-out). Then `llmaudit score RUN_DIR` and `llmaudit report RUN_DIR` work as for `llmaudit finetune`."""
    from llmaudit.importing.pipeline import run_import

    progress(no_progress)
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
