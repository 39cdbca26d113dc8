"""`llmaudit memorization LOSS_TABLE`: unintended memorization in bits on any loss table, written as JSON and a
Markdown section."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from llmaudit.commands.base import app
from llmaudit.common.io import atomic_write_json, atomic_write_text


def memorization_command(
    loss_table: str | os.PathLike,
    out: str | os.PathLike = Path("llmaudit-out/memorization.json"),
    reference: str = "base",
    *,
    scaling_law: str | None = None,
    markdown_out: str | os.PathLike | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Read a loss table (file or directory), write the result as JSON (atomically) and, if asked, the Markdown
    section; return the result. reference: "base", "run=R,quantizer=Q[,checkpoint=C]", or the path of a parquet
    loss table scored by the reference model. scaling_law: "c1=..,c2=..,c3=..[,dataset_size=samples|tokens]".
    options: what `memorization_from_table` takes (adapter_params, model_params, capacity_bits_per_param, n_boot,
    seed)."""
    from llmaudit.analyze.memorization import memorization_from_table, parse_reference
    from llmaudit.analyze.memorization_capacity import parse_scaling_law
    from llmaudit.report.memorization_md import markdown_section
    from llmaudit.store.losstable import read_loss_table

    result = memorization_from_table(
        read_loss_table(loss_table),
        reference=parse_reference(reference),
        scaling_law=parse_scaling_law(scaling_law) if scaling_law else None,
        **options,
    )
    result = {"source": str(loss_table), **result}
    atomic_write_json(out, result)
    if markdown_out is not None:
        atomic_write_text(markdown_out, markdown_section(result))
    return result


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
        reference,
        adapter_params=adapter_params,
        model_params=model_params,
        capacity_bits_per_param=bits_per_param,
        markdown_out=out.with_suffix(".md"),
    )
    typer.echo(f"wrote {out} and {out.with_suffix('.md')}")
