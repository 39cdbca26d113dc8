"""`llmaudit attack LOSS_TABLE`: every attack on any loss table (bring your own losses), written as JSON with log-log
ROC plots beside it; prints the strongest attack per quantizer, the reasons of the skipped ones and the release rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from llmaudit.commands.base import app
from llmaudit.common.io import atomic_write_json, read_json

if TYPE_CHECKING:
    from llmaudit.analyze.attacks.settings import AttackRunSettings
    from llmaudit.analyze.decision import DecisionSettings


def attack_command(
    loss_table: Path,
    out: Path,
    settings: AttackRunSettings | None = None,
    *,
    quantizers: Sequence[str] | None = None,
    reference_quantizer: str | None = None,
    r_q: Mapping[str, float] | Path | None = None,
    plots: bool = True,
    decision: DecisionSettings | None = None,
) -> dict:
    """Run the attacks on a loss table and write the result as JSON, with log-log ROC plots beside it.

    Args:
        loss_table: a loss-table parquet file or a directory of them.
        out: the JSON file to write; with plots, the PNGs OUT_STEM_roc_<quantizer>.png go beside it.
        settings: how the attacks run and are evaluated (None: `AttackRunSettings()`, every registered attack).
        quantizers: the quantizers attacked (None: every one with pool rows of fine-tuned runs).
        reference_quantizer: the quantizer the others are compared with (None: the full-precision one).
        r_q: {quantizer: r_Q}, or a JSON file of it, to correlate the attacks with; None: no correlation.
        plots: write the ROC plots.
        decision: the release rule's settings (None: its defaults with the settings' seed); its verdict is in
            `out` under "decision".

    Returns:
        The result written (`run_attacks`'), with "loss_table" and, with plots, "plots" added.
    """
    from llmaudit.analyze.attacks.evaluate import run_attacks
    from llmaudit.analyze.attacks.settings import AttackRunSettings
    from llmaudit.analyze.decision import DecisionSettings
    from llmaudit.report.plots import plot_roc_loglog
    from llmaudit.store.losstable import read_loss_table

    settings = settings or AttackRunSettings()
    df = read_loss_table(loss_table)
    if r_q is not None and not isinstance(r_q, Mapping):
        r_q = {str(q): float(v) for q, v in read_json(r_q).items()}
    decision = decision or DecisionSettings(seed=settings.seed)
    kw = dict(quantizers=quantizers, reference_quantizer=reference_quantizer, r_q=r_q, decision=decision)
    results = run_attacks(df, settings, **kw)
    results["loss_table"] = str(loss_table)
    out = Path(out)
    if plots:
        results["plots"] = [str(p) for p in plot_roc_loglog(results, out.parent / f"{out.stem}_roc")]
    atomic_write_json(out, results)
    return results


def attack_summary_lines(results: Mapping[str, Any]) -> list[str]:
    """The lines `llmaudit attack` prints about a result.

    Args:
        results: the result of `attack_command`.

    Returns:
        Per quantizer the strongest attack by AUROC against LOSS, then each reason an attack was skipped (once, with
        the attacks and quantizers it concerns), each table warning, and the release rule's verdict.
    """
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


@app.command()
def attack(
    loss_table: Path = typer.Argument(..., help="A loss-table parquet file or a directory of them."),
    out: Path = typer.Option(Path("attacks.json"), "--out", help="JSON file to write (ROC plots beside it)."),
    n_boot: int = typer.Option(
        500, min=0, max=100_000, help="Bootstrap resamples for the intervals (at most 100,000, as attack.n_boot)."
    ),
    fpc: str = typer.Option(
        "auto", help="Finite population correction: auto (from --n-pool/--n-train), off, or a number."
    ),
    n_pool: int | None = typer.Option(None, help="Pool size N_+ the runs' training sets were drawn from."),
    n_train: float | None = typer.Option(None, help="Training set size N per run."),
    r_q: Path | None = typer.Option(None, "--r-q", help="indicator.json (or {quantizer: r_Q} JSON) to correlate with."),
) -> None:
    """Every attack on each quantizer's final checkpoint, each run in turn as the target, with calibrated pooling."""
    from llmaudit.analyze.attacks.settings import AttackRunSettings
    from llmaudit.common.errors import UserError

    try:
        settings = AttackRunSettings(n_boot=n_boot, fpc=fpc, n_pool=n_pool, n_train=n_train)
    except ValueError as exc:
        raise UserError(f"--fpc: {exc} Fix: --fpc auto, --fpc off, or a number in (0, 1].") from None
    rq = None
    if r_q is not None:
        data = read_json(r_q)
        rq = {q: e["r_q"]["mean"] for q, e in data["per_quantizer"].items()} if "per_quantizer" in data else data
    results = attack_command(loss_table, out, settings, r_q=rq)
    for line in attack_summary_lines(results):
        typer.echo(line)
    typer.echo(f"wrote {out}")
