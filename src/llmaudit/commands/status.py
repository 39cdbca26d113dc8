"""`llmaudit status RUN_DIR`: what is done, running and missing, with the fix for each problem."""

from __future__ import annotations

from pathlib import Path

import typer

from llmaudit.commands.base import (
    app,
)
from llmaudit.common.io import to_json
from llmaudit.common.safe_text import escape_controls


@app.command()
def status(
    run_dir: Path = typer.Argument(..., help="The experiment directory written by finetune/score/submit."),
    as_json: bool = typer.Option(False, "--json", help="Print the status as JSON (for scripts)."),
) -> None:
    """What is done, running and missing: runs and their checkpoints, scoring units per quantizer, the report.
    A unit whose job was killed shows as missing (rerunning the stage resumes it). Names from the store (files,
    quantizers, job errors) are shown with their control characters escaped; --json escapes them as JSON does."""
    from llmaudit.planning.arguments import check_run_dir

    check_run_dir(run_dir)  # argument errors answer before the work is imported

    from llmaudit.planning.status import format_status, stage_status
    from llmaudit.store.run_store import RunStore

    result = stage_status(RunStore(run_dir))
    typer.echo(to_json(result).rstrip() if as_json else escape_controls(format_status(result), keep_newlines=True))
