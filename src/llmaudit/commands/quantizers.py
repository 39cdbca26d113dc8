"""`llmaudit quantizers`: every registered quantizer and whether its library and device are available here."""

from __future__ import annotations

import typer

from llmaudit.commands.base import (
    app,
)
from llmaudit.quantize import list_quantizers


@app.command()
def quantizers() -> None:
    """Every registered quantizer, its family and bits, and whether its library and device are available."""
    for info in list_quantizers():
        status = "ok" if info.available else f"unavailable: {info.reason}"
        typer.echo(f"{info.name:>12}  {info.family:<6} {info.bits:>5} bits  {status}")
