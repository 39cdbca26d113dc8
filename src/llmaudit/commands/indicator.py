"""`llmaudit indicator LOSS_TABLE`: the published attack-free indicator r_Q on any loss table, written as JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from llmaudit.commands.base import app
from llmaudit.common.io import atomic_write_json


def indicator_command(loss_table: Path, out: Path, split: str = "val") -> dict[str, Any]:
    """Read, score, write `out` atomically (nan/inf as NaN/Infinity, which Python's json reads back; the status
    fields say what they mean); return the result."""
    from llmaudit.analyze.rq_aggregate import indicator_from_table
    from llmaudit.store.losstable import read_loss_table

    result = indicator_from_table(read_loss_table(loss_table), split=split)
    result["protocol"]["loss_table"] = str(loss_table)
    atomic_write_json(out, result)
    return result


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
