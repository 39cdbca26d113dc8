"""Outputs of `llmaudit validate synthetic`: results.json, results.md and plots."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import yaml

from llmaudit.common.formatting import fmt_sig
from llmaudit.common.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from llmaudit.validate.synthetic.config import load_config
from llmaudit.validate.synthetic.protocol import run_synthetic


def _dataset_section(d: dict[str, Any]) -> list[str]:
    """The lines of results.md for one data set: its heading and the per-quantizer table."""
    lines = [
        "",
        f"## {d['name']} (k_modes={d['k_modes']}, sigma={d['sigma']}): Spearman {d['comparison']['published']['spearman']:+.2f}, "
        f"full-precision val acc {d['classifier']['val_acc_full_precision']:.3f}",
        "",
        "| quantizer | r_Q mean | r_Q CI | undefined runs | MIS | MIS CI | rank r_Q | rank MIS | distinct points/run |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for q, t in d["table"].items():
        a = t["r_q"]
        lines.append(
            f"| {q} | {fmt_sig(a['mean'])} | [{fmt_sig(a['ci_low'])}, {fmt_sig(a['ci_high'])}] | {a['n_undefined']} | "
            f"{t['mis']:.3f} | [{t['mis_ci'][0]:.3f}, {t['mis_ci'][1]:.3f}] | {t['rank_r_q']:g} | {t['rank_mis']:g} | "
            f"{t['mean_distinct_points']:.1f} |"
        )
    return lines


def markdown_report(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        "# Synthetic validation of r_Q against the baseline MIS",
        "",
        f"{len(res['datasets'])} data sets x {cfg['n_runs']} runs, batch size {cfg['batch_size']}, lr {cfg['lr']}, "
        f"{cfg['epochs']} epochs; wall time {res['wall_time_s']:.0f} s. Rank 1 = most secure (highest r_Q / MIS).",
        "",
        "## Spearman(r_Q, MIS) per data set",
        "",
        "| estimator | mean rho | bootstrap std of mean | CI of mean | "
        + " | ".join(d["name"] for d in res["datasets"])
        + " |",
        "|---|---|---|---|" + "---|" * len(res["datasets"]),
    ]
    for v, s in res["summary"].items():
        lines.append(
            f"| {v} | {s['mean_spearman']:+.2f} | {s['boot_std_of_mean']:.2f} | "
            f"[{s['boot_ci_of_mean'][0]:+.2f}, {s['boot_ci_of_mean'][1]:+.2f}] | "
            + " | ".join(f"{x:+.2f}" for x in s["per_dataset"].values())
            + " |"
        )
    lines += [
        "",
        "'published' is the estimator of the paper; the others are labelled VARIANTS (see protocol.variants). "
        "'reciprocal' is a risk score: its positive correlation means r_Q's ranking reversed tracks MIS.",
        "",
        "## Stability (mean Spearman of a k-run ranking with the full ranking, averaged over data sets)",
        "",
        "| k_runs | " + " | ".join(str(k) for k in res["stability_summary"]["k_runs"]) + " |",
        "|---|" + "---|" * len(res["stability_summary"]["k_runs"]),
        "| r_Q | " + " | ".join(f"{x:.2f}" for x in res["stability_summary"]["r_q_mean_rho"]) + " |",
    ]
    if "mis_mean_rho" in res["stability_summary"]:
        lines.append("| MIS | " + " | ".join(f"{x:.2f}" for x in res["stability_summary"]["mis_mean_rho"]) + " |")
    for d in res["datasets"]:
        lines += _dataset_section(d)
    return "\n".join(lines) + "\n"


def _save_png(fig: Any, path: Path) -> Path:
    """The figure as a PNG (110 dpi), written atomically."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path, buf.getvalue())


def _rq_vs_mis_panel(ax: Any, d: dict[str, Any]) -> None:
    """One data set's panel: each quantizer's mean r_Q (log x) against its MIS, with both intervals."""
    for q, t in d["table"].items():
        ax.errorbar(
            t["r_q"]["mean"],
            t["mis"],
            yerr=[[t["mis"] - t["mis_ci"][0]], [t["mis_ci"][1] - t["mis"]]],
            xerr=[
                [max(t["r_q"]["mean"] - t["r_q"]["ci_low"], 0)],
                [max(t["r_q"]["ci_high"] - t["r_q"]["mean"], 0)],
            ],
            fmt="o",
            ms=4,
            capsize=2,
        )
        ax.annotate(q, (t["r_q"]["mean"], t["mis"]), fontsize=7)
    ax.set_xscale("log")
    ax.set_title(f"{d['name']}  rho={d['comparison']['published']['spearman']:+.2f}", fontsize=9)
    ax.set_xlabel("r_Q (mean over runs)")
    ax.set_ylabel("baseline MIS")


def write_plots(res: dict[str, Any], out: Path) -> list[Path]:
    """rq_vs_mis.png (one panel per data set) and stability.png (k-run ranking vs the full ranking)."""
    import matplotlib  # heavy: only when plots are written

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    ds = res["datasets"]
    ncol = min(3, len(ds))
    nrow = math.ceil(len(ds) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.4 * nrow), squeeze=False)
    for ax, d in zip(axes.flat, ds):
        _rq_vs_mis_panel(ax, d)
    for ax in list(axes.flat)[len(ds) :]:
        ax.axis("off")
    fig.tight_layout()
    paths.append(_save_png(fig, out / "rq_vs_mis.png"))
    plt.close(fig)

    st = res["stability_summary"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(st["k_runs"], st["r_q_mean_rho"], "o-", label="r_Q")
    if "mis_mean_rho" in st:
        ax.plot(st["k_runs"], st["mis_mean_rho"], "s-", label="baseline MIS")
    ax.axhline(0.9, color="grey", ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("runs in subsample")
    ax.set_ylabel("Spearman with full ranking")
    ax.legend()
    fig.tight_layout()
    paths.append(_save_png(fig, out / "stability.png"))
    plt.close(fig)
    return paths


def write_outputs(res: dict[str, Any], out: Path, plots: bool = True) -> dict[str, Path]:
    out = Path(out)
    paths = {
        "json": atomic_write_json(out / "results.json", res),
        "markdown": atomic_write_text(out / "results.md", markdown_report(res)),
        "config": atomic_write_text(out / "config.yaml", yaml.safe_dump(res["config"], sort_keys=False)),
    }
    if plots:
        for p in write_plots(res, out):
            paths[p.stem] = p
    return paths


def validate_synthetic_command(recipe: Path | None, overrides: list[str], out: Path | None = None) -> dict:
    """`llmaudit validate synthetic [RECIPE] [key=value ...] --out DIR`: run the protocol, write
    results.json, results.md, config.yaml and the plots under `out` (default ./synthetic-validation/).
    Returns the result dict."""
    cfg = load_config(recipe, overrides)
    out = Path(out) if out is not None else Path.cwd() / "synthetic-validation"
    print(
        f"synthetic validation: {len(cfg.k_modes) * len(cfg.sigmas)} data sets x {cfg.n_runs} runs, "
        f"{len(cfg.quantizers)} quantizers -> {out}",
        flush=True,
    )

    def save_partial(ds: dict[str, Any]) -> None:
        # each finished data set is kept, so an interrupted run still leaves its numbers
        atomic_write_json(
            out / "partial" / f"{ds['name']}.json",
            {
                **ds,
                "comparison": {v: {k: x for k, x in c.items() if k != "_boots"} for v, c in ds["comparison"].items()},
            },
        )

    res = run_synthetic(cfg, log=lambda s: print(s, flush=True), on_dataset=save_partial)
    paths = write_outputs(res, out, plots=cfg.plots)
    s = res["summary"]["published"]
    print(
        f"mean Spearman(r_Q, MIS) = {s['mean_spearman']:+.2f} (bootstrap std {s['boot_std_of_mean']:.2f}); "
        f"wall time {res['wall_time_s']:.0f} s; wrote {', '.join(str(p) for p in paths.values())}",
        flush=True,
    )
    return res
