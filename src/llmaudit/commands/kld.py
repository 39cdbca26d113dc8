"""`llmaudit kld QUANT.gguf ...`: llama.cpp's KL statistics of quantized GGUF files against a base model, computed
by llmaudit under ``llama-perplexity --kl-divergence``'s protocol and printed with the tool's labels, so that the
numbers can be set beside the tool's (or beside the tables published with GGUF releases).

The base is either a log-probability file the tool wrote (``--base-logits FILE``, from ``llama-perplexity -m BASE
-f TEXT --kl-divergence-base FILE``), or a base GGUF and a text (``--base BASE.gguf --text TEXT``), from which
llmaudit computes that file itself (kept with ``--save-base-logits FILE``: the tool reads it back with
``--kl-divergence-base FILE --kl-divergence``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import typer

from llmaudit.commands.base import app
from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json

DEFAULT_BATCH = 2048
"""Tokens per decode call, llama-perplexity's -b (`analyze.gguf_kld.DEFAULT_BATCH`, held here so that `--help`
imports neither llama.cpp nor torch)."""


@dataclass(frozen=True)
class BaseSource:
    """Where the base log-probabilities come from: a file llama-perplexity wrote (`logits`), or a base GGUF and a
    text (`gguf`, `text`) evaluated in chunks of `n_ctx` tokens (at most `chunks` of them), the file kept at `save`."""

    logits: Path | None = None
    gguf: Path | None = None
    text: Path | None = None
    save: Path | None = None
    n_ctx: int = 512
    chunks: int | None = None


def _check_inputs(quantized: list[Path], source: BaseSource) -> None:
    """One-line refusals before any model is loaded."""
    if (source.logits is None) == (source.gguf is None):
        raise UserError("kld: pass either --base-logits FILE (llama-perplexity --kl-divergence-base's file) or "
                        "--base BASE.gguf --text TEXT")  # fmt: skip
    if source.gguf is not None and source.text is None:
        raise UserError("kld: --base BASE.gguf needs --text TEXT (the text both models are evaluated on)")
    if source.gguf is None and (source.text is not None or source.save is not None):
        raise UserError("kld: --text and --save-base-logits go with --base BASE.gguf")
    if not quantized and source.save is None:
        raise UserError("kld: nothing to do; fix: name quantized .gguf files, or --save-base-logits FILE")
    for path in [*quantized, *([source.gguf] if source.gguf else [])]:
        if not (path.is_file() and path.suffix == ".gguf"):
            raise UserError(f"{path}: not a .gguf file; fix: pass GGUF model files")
    for path in [p for p in (source.logits, source.text) if p is not None]:
        if not path.is_file():
            raise UserError(f"{path}: no such file")
    from llmaudit.quantize.llama_cpp_lib import availability

    reason = availability()
    if reason:
        raise UserError(f"kld evaluates the GGUF files with llama.cpp: {reason}")


def kld_command(quantized: list[Path], source: BaseSource, *, batch: int = DEFAULT_BATCH,
                threads: int | None = None) -> list[dict]:  # fmt: skip
    """The statistics of each quantized file against the base (module docstring); one JSON record each
    (``gguf_kld.summary_record``)."""
    _check_inputs(quantized, source)
    import torch

    from llmaudit.analyze.gguf_kld import compare_with_base, summary_record, write_base
    from llmaudit.quantize.gguf_logits import read_base_logits

    threads = threads or max(1, torch.get_num_threads())
    with tempfile.TemporaryDirectory(prefix="llmaudit-kld-") as tmp:
        if source.gguf is not None:
            content = source.text.read_text(encoding="utf-8", errors="replace")  # type: ignore[union-attr]
            target = source.save or Path(tmp) / "base.logits"
            logits = write_base(source.gguf, target, text=content, n_ctx=source.n_ctx, chunks=source.chunks,
                                threads=threads, batch=batch)  # fmt: skip
        else:
            logits = read_base_logits(source.logits)  # type: ignore[arg-type]
        return [
            summary_record(str(q), compare_with_base(logits, q, threads=threads, batch=batch), logits)
            for q in quantized
        ]


@app.command()
def kld(
    quantized: list[Path] = typer.Argument(None, help="Quantized .gguf files to compare with the base."),
    base_logits: Path | None = typer.Option(
        None, help="A base log-probability file of llama-perplexity --kl-divergence-base (its tokens are the text)."
    ),  # fmt: skip
    base: Path | None = typer.Option(None, help="The base model as a .gguf (with --text), instead of --base-logits."),
    text: Path | None = typer.Option(None, help="The text to evaluate (UTF-8), with --base."),
    save_base_logits: Path | None = typer.Option(None, help="Keep the base file computed from --base/--text here."),
    ctx: int = typer.Option(512, min=4, max=1 << 20, help="Tokens per chunk (llama-perplexity's -c), with --base."),
    chunks: int | None = typer.Option(None, min=1, help="At most this many chunks (its --chunks), with --base."),
    batch: int = typer.Option(DEFAULT_BATCH, min=4, max=1 << 20, help="Tokens per decode call (its -b)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the statistics here as JSON."),
    threads: int | None = typer.Option(
        None, min=1, max=1024, help="llama.cpp's CPU threads (default: this process's, $LLMAUDIT_THREADS when set)."
    ),  # fmt: skip
) -> None:
    """llama.cpp's KL statistics (llama-perplexity --kl-divergence) of quantized GGUF files, computed by llmaudit."""
    source = BaseSource(base_logits, base, text, save_base_logits, ctx, chunks)
    records = kld_command(list(quantized or []), source, batch=batch, threads=threads)  # argument errors first

    from llmaudit.analyze.llama_kld import format_summary

    if save_base_logits is not None:
        typer.echo(f"wrote the base log-probabilities to {save_base_logits}")
    for record in records:
        stats = record["statistics"]
        note = "" if stats["n_tokens"] >= 100 else " (llama-perplexity prints no statistics below 100 positions)"
        typer.echo(f"\n{record['quantized']}: {stats['n_tokens']} scored positions{note}")
        typer.echo(format_summary(stats))
    if json_out is not None:
        atomic_write_json(json_out, {"comparisons": records})
        typer.echo(f"\nwrote {json_out}")
