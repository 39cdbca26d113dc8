"""`llmaudit attack`'s ROC figures: one log-log ROC PNG per quantizer of a bare attack result (no report)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from llmaudit.common.io import atomic_write_bytes


def plot_roc_loglog(results: Mapping, path: str | Path) -> list[Path]:
    """One log-log ROC PNG per quantizer: offline LiRA (calibrated) and the best other attack, with the chance line.

    Args:
        results: the attacks' result ("quantizers" with each one's curves).
        path: where the files go: PATH_STEM_<quantizer>.png next to it.

    Returns:
        The paths written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    written = []
    grid = np.logspace(-4, 0, 50)
    for q, block in results["quantizers"].items():
        fig, ax = plt.subplots(figsize=(5, 5))
        curves = []
        if "lira_offline" in block["attacks"]:
            curves.append(("LiRA offline", block["attacks"]["lira_offline"]["roc_curve"].get("pooled_calibrated"), "-"))
        best = block.get("best_attack")
        if best:
            rc = block["attacks"][best]["roc_curve"]
            curves.append((f"{best} (pooled naive)", rc.get("pooled_naive"), "--"))
            curves.append((f"{best} (calibrated)", rc.get("pooled_calibrated"), ":"))
        for label, curve, style in curves:
            if curve:
                ax.plot(curve["fpr"], np.maximum(curve["tpr"], 1e-5), style, label=label)
        ax.plot(grid, grid, color="grey", lw=0.8, label="chance")
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(1e-4, 1),
            ylim=(1e-4, 1.05),
            xlabel="false positive rate",
            ylabel="true positive rate",
            title=f"ROC, quantizer {q}",
        )
        ax.legend(loc="lower right", fontsize=8)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
        plt.close(fig)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(q))
        written.append(atomic_write_bytes(path.parent / f"{path.stem}_{safe}.png", buf.getvalue()))
    return written
