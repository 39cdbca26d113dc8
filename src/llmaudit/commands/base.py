"""The `llmaudit` Typer application, the options and help texts the commands share, and what every command does
before and after its work: logging and threads (`setup`), progress bars or concise lines (`progress`), the verdict
on one screen and the release gate (`finish`)."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

import typer

from llmaudit.common.errors import GATE_EXIT_CODE
from llmaudit.common.safe_text import escape_controls
from llmaudit.common.threads import env_threads

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

    def format(self, record: logging.LogRecord) -> str:
        """The record's line with its control characters escaped (a logged file name from data is shown as written)."""
        return escape_controls(super().format(record), keep_newlines=True)


def setup() -> None:
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
    threads = env_threads()  # a bad $LLMAUDIT_THREADS is refused here, before any command
    if threads is not None:  # torch is imported only when there is a count to give it (`--help` never needs it)
        from llmaudit.common.runtime import set_threads

        set_threads(threads)
    if not sys.stderr.isatty():  # a log file or a pipe: no carriage-return frames from the libraries' bars either
        progress(True)


def progress(no_progress: bool) -> bool:
    """Progress bars only on a terminal: --no-progress, or a stderr that is not a TTY (a log, a pipe), gives
    concise lines instead, and silences the weight-loading and download bars of transformers / huggingface_hub."""
    no_progress = no_progress or not sys.stderr.isatty()
    if no_progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
        hf_logging = sys.modules.get("transformers.utils.logging")
        if hf_logging is not None:  # imported later, transformers takes its setting from huggingface_hub's
            hf_logging.disable_progress_bar()
    return not no_progress


RELEASE_HELP = "The quantizer you ship: model_card.md describes it and --gate judges it (default: the recommended one)."
GATE_HELP = (
    f"Exit with code {GATE_EXIT_CODE} when the quantizer to ship (--release, default the recommended one) is not "
    "cleared for release (overall verdict not PASS), so a CI job can block the release; 0 when it is cleared. "
    "Writes gate.json, gate-junit.xml and, on GitHub Actions, the step summary."
)


def finish(report: dict, *, release: str | None, gate: bool, out_dir: Path | None = None) -> None:
    """The verdict on one screen (the answer's last line: what may be released); with --gate, the reason line,
    the gate's files in `out_dir` (the report directory) and exit GATE_EXIT_CODE unless cleared."""
    from llmaudit.report.answer import wrap_segments
    from llmaudit.report.gate import gate_decision, write_gate_outputs
    from llmaudit.report.terminal import FIXED_WIDTH, print_summary

    typer.echo("")
    print_summary(report)
    if gate:
        cleared, why = gate_decision(report, release)
        head = f"[gate] {'cleared' if cleared else 'BLOCKED'}: "
        for line in wrap_segments(head, why.split("; "), FIXED_WIDTH, len(head)):
            typer.echo(line, err=True)
        if out_dir is not None:
            typer.echo(f"[gate] {written(write_gate_outputs(report, release, out_dir).values())}", err=True)
        if not cleared:
            raise typer.Exit(GATE_EXIT_CODE)


def finish_written(paths: dict, store, *, release: str | None, gate: bool) -> None:
    """`finish` on the report.json `write_report` just wrote (its `paths`) in the store's report directory."""
    import json

    report = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    finish(report, release=release, gate=gate, out_dir=store.report_dir)


def written(paths) -> str:
    """ "wrote a, b, c in DIR" for files of one directory (the full paths otherwise): one short line."""
    paths = [Path(p) for p in paths]
    parents = {p.parent for p in paths}
    if len(parents) == 1:
        return f"wrote {', '.join(p.name for p in paths)} in {parents.pop()}"
    return f"wrote {', '.join(str(p) for p in paths)}"


TRUST_HELP = (
    "Allow code shipped with the model (transformers' trust_remote_code). Never read from a run directory: "
    "only this flag (or your own recipe) turns it on."
)
