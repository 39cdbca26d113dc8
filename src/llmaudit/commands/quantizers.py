"""`llmaudit quantizers`: every registered quantizer, by backend, and whether it can run here (one install hint per
backend that cannot)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterable
from typing import TYPE_CHECKING

import typer

from llmaudit.commands.base import (
    app,
)

if TYPE_CHECKING:
    from llmaudit.quantize import QuantizerInfo

WIDTH = 120
"""Columns of the table when the output is not a terminal (at most this on one)."""


def _why(info: QuantizerInfo) -> str:
    """The reason a quantizer is unavailable, without its own name in front (shared by its backend)."""
    reason = str(info.reason or "")
    prefix = f"{info.name}: "
    return reason[len(prefix) :] if reason.startswith(prefix) else reason


NBSP = "\xa0"
"""Joins a name and its bits while the list is wrapped (textwrap breaks only at ASCII whitespace)."""


def _names(members: list[QuantizerInfo]) -> str:
    """ "name (bits), ..." with a name's -imatrix twin of the same bits folded into it: "name[-imatrix] (bits)"."""
    by_name = {i.name: i for i in members}
    out = []
    for i in members:
        if i.name.endswith("-imatrix") and i.name.removesuffix("-imatrix") in by_name:
            continue
        twin = by_name.get(f"{i.name}-imatrix")
        name = f"{i.name}[-imatrix]" if twin is not None and twin.bits == i.bits else i.name
        out.append(f"{name}{NBSP}({i.bits:.3g})")
    return ", ".join(out)


def backend_lines(infos: Iterable[QuantizerInfo], width: int = WIDTH) -> list[str]:
    """One block per backend (family): its quantizers with their bits, whether they run here, and, for those that
    do not, the reason and the fix once; every line at most `width` columns."""
    groups: dict[tuple[str, str], list[QuantizerInfo]] = {}
    for info in infos:
        groups.setdefault((info.family, "" if info.available else _why(info)), []).append(info)
    lines = [f"{'backend':<8} {'here':<5}  quantizers (nominal bits per weight; NAME[-imatrix]: with and without)"]
    indent = " " * 16
    for (family, why), members in groups.items():
        wrapped = textwrap.wrap(_names(members), width - len(indent), break_on_hyphens=False) or [""]
        wrapped = [w.replace(NBSP, " ") for w in wrapped]
        lines.append(f"{family:<8} {'no' if why else 'yes':<5}  {wrapped[0]}")
        lines += [indent + w for w in wrapped[1:]]
        if why:
            lines += textwrap.wrap(
                f"why: {why}", width, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
            )
    return lines


@app.command()
def quantizers() -> None:
    """Every registered quantizer by backend, its nominal bits, and whether its library and device are available
    here (if not: why, and the install command, once per backend)."""
    from llmaudit.quantize import list_quantizers

    width = min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)
    for line in backend_lines(list_quantizers(), width):
        typer.echo(line)
