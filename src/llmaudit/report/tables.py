""" "Bring your own losses": the indicator, the attacks and memorization on any loss table, written as
JSON (and Markdown / ROC plots) beside it. The commands `llmaudit indicator|attack|memorization`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llmaudit.analyze.attacks.definitions import DEFAULT_ATTACKS
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.indicator import indicator_from_table
from llmaudit.analyze.memorization import (
    DEFAULT_BITS_PER_PARAM,
    memorization_from_table,
    parse_reference,
    parse_scaling_law,
)
from llmaudit.common.io import atomic_write_json, atomic_write_text, read_json
from llmaudit.report.memorization_md import markdown_section
from llmaudit.report.plots import plot_roc_loglog
from llmaudit.store.losstable import read_loss_table


def write_indicator_json(result: Mapping[str, Any], path: str | os.PathLike) -> Path:
    """Write an `indicator_from_table` result atomically. nan/inf are written as NaN/Infinity
    (Python's json reads them back; the status fields say what they mean)."""
    return atomic_write_json(path, result)


def indicator_command(loss_table: Path, out: Path, split: str = "val") -> dict[str, Any]:
    """`llmaudit indicator LOSS_TABLE --out FILE`: read, score, write; returns the result."""
    result = indicator_from_table(read_loss_table(loss_table), split=split)
    result["protocol"]["loss_table"] = str(loss_table)
    write_indicator_json(result, out)
    return result


def attack_command(
    loss_table: Path,
    out: Path,
    *,
    quantizers: Sequence[str] | None = None,
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    fpc: str | float | None = "auto",
    n_boot: int = 1000,
    seed: int = 0,
    n_pool: int | None = None,
    n_train: float | None = None,
    r_q: Mapping[str, float] | Path | None = None,
    reference_quantizer: str | None = None,
    plots: bool = True,
    decision: DecisionSettings | None = None,
) -> dict:
    """`llmaudit attack LOSS_TABLE --out FILE`: run the attacks, write FILE (JSON) and, with plots, the
    log-log ROC PNGs FILE_STEM_roc_<quantizer>.png next to it. r_q: {quantizer: r_Q} or a JSON file of it.
    decision: the release rule's settings (default: its defaults with this seed); its verdict and comparison with
    the full-precision quantizer are in FILE under "decision"."""

    df = read_loss_table(loss_table)
    if r_q is not None and not isinstance(r_q, Mapping):
        r_q = {str(q): float(v) for q, v in read_json(r_q).items()}
    results = run_attacks(
        df,
        quantizers=quantizers,
        attacks=attacks,
        fpc=fpc,
        n_boot=n_boot,
        seed=seed,
        n_pool=n_pool,
        n_train=n_train,
        r_q=r_q,
        reference_quantizer=reference_quantizer,
        decision=decision or DecisionSettings(seed=seed),
    )
    results["loss_table"] = str(loss_table)
    out = Path(out)
    if plots:
        results["plots"] = [str(p) for p in plot_roc_loglog(results, out.parent / f"{out.stem}_roc")]
    atomic_write_json(out, results)
    return results


def attack_summary_lines(results: Mapping[str, Any]) -> list[str]:
    """What `llmaudit attack` prints: per quantizer the strongest attack by AUROC against LOSS, then each
    reason an attack was skipped (once, with the attacks and quantizers it concerns) and each table warning."""
    lines, skipped = [], {}
    for q, block in results["quantizers"].items():
        aurocs = {a: e["headline"]["auroc"] for a, e in block["attacks"].items()}
        if aurocs:
            best = max(aurocs, key=lambda a: aurocs[a])
            loss = f", LOSS {aurocs['loss']:.3f}" if "loss" in aurocs else ""
            lines.append(f"{q}: strongest attack by AUROC {best} {aurocs[best]:.3f}{loss} ({len(aurocs)} attacks)")
        for attack, why in block["skipped"].items():
            skipped.setdefault(why, {}).setdefault(attack, []).append(q)
        lines += [f"{q}: warning: {w}" for w in block.get("warnings", [])]
    for why, attacks in skipped.items():
        quantizers = sorted({q for qs in attacks.values() for q in qs})
        lines.append(f"skipped {', '.join(attacks)} on {', '.join(quantizers)}: {why}")
    for q, d in ((results.get("decision") or {}).get("per_quantizer") or {}).items():
        comparison = (d.get("comparison") or {}).get("sentence")
        lines.append(f"{q}: release rule {d['status']}: {d['reason']}" + (f"; {comparison}" if comparison else ""))
    return lines


def memorization_command(
    loss_table: str | os.PathLike,
    out: str | os.PathLike = Path("llmaudit-out/memorization.json"),
    reference: str = "base",
    adapter_params: int | None = None,
    model_params: int | None = None,
    capacity_bits_per_param: float = DEFAULT_BITS_PER_PARAM,
    scaling_law: str | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    markdown_out: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """`llmaudit memorization LOSS_TABLE --out FILE`: read a loss table (file or directory), write the
    result as JSON (atomically) and, if asked, the markdown section. Returns the result.

    reference: "base", "run=R,quantizer=Q[,checkpoint=C]", or the path of a parquet loss table scored
    by the reference model. scaling_law: "c1=..,c2=..,c3=..[,dataset_size=samples|tokens]"."""

    df = read_loss_table(loss_table)
    result = memorization_from_table(
        df,
        reference=parse_reference(reference),
        adapter_params=adapter_params,
        model_params=model_params,
        capacity_bits_per_param=capacity_bits_per_param,
        scaling_law=parse_scaling_law(scaling_law) if scaling_law else None,
        n_boot=n_boot,
        seed=seed,
    )
    result = {"source": str(loss_table), **result}
    atomic_write_json(out, result)
    if markdown_out is not None:
        atomic_write_text(markdown_out, markdown_section(result))
    return result
