"""The `llmaudit` command line.

llmaudit audit [RECIPE] [key=value ...]     finetune -> score -> report (default: the CPU demo)
llmaudit finetune RECIPE [key=value ...]    LoRA runs with membership masks and checkpoints
llmaudit score RUN_DIR_OR_RECIPE [...]      per-sample token losses of every quantized checkpoint
llmaudit report RUN_DIR                     r_Q, attacks, memorization -> report.json / .md / .html
llmaudit import TRAINING_DIR --base M --train F --heldout F --out RUN_DIR   audit your own fine-tune
llmaudit indicator | attack | memorization LOSS_TABLE   on any loss table (bring your own losses)
llmaudit validate synthetic | capacity      validations where the truth is known
llmaudit quantizers                         every quantizer and whether it can run here
llmaudit kld QUANT.gguf --base-logits FILE  llama-perplexity --kl-divergence's statistics, computed by llmaudit
llmaudit status RUN_DIR                     what is done, running and missing
llmaudit submit STAGE RECIPE                shard jobs on SLURM (submitit) or local processes
"""

from __future__ import annotations

import os
import sys

import typer

from llmaudit.commands import app  # the Typer application with every command registered
from llmaudit.commands.base import setup
from llmaudit.common.children import end_with_parent
from llmaudit.common.errors import UserError
from llmaudit.common.safe_text import escape_controls, install

__all__ = ["app", "main"]


def _one_line(exc: BaseException) -> str:
    """The message of `exc` on one line, its control characters escaped (a file name from data may hold escape
    sequences: they are shown, never obeyed), at most 2,000 characters."""
    text = escape_controls(" ".join(str(exc).split())) or type(exc).__name__
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
    report it, exit 1 (LLMAUDIT_DEBUG=1 re-raises with the traceback); an interrupt exits 130 (rerun to resume).
    While the command runs, stdout escapes every control character written to it but line breaks and colours
    (`common.safe_text.SafeStream`), and every error line is escaped too: text from data never drives the terminal."""
    debug = os.environ.get("LLMAUDIT_DEBUG", "") not in ("", "0")
    end_with_parent()  # a child of `audit`'s fine-tuning or scoring processes stops when the audit does
    stdout = sys.stdout
    sys.stdout = install(stdout)
    try:
        _run(debug)
    finally:
        sys.stdout = stdout


def _run(debug: bool) -> None:
    try:
        setup()
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
        where = f" ({escape_controls(exc.filename)})" if getattr(exc, "filename", None) else ""
        text = escape_controls(exc.strerror) if exc.strerror else _one_line(exc)
        typer.echo(f"error: {text}{where}; check the path and free space.", err=True)
        sys.exit(2)
    except Exception as exc:
        if debug:
            raise
        typer.echo(_internal_error(exc), err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
