"""Which samples an attack finds most exposed: ids and scores only, never text."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.attacks.evaluate import final_pool, leave_one_out
from llmaudit.analyze.attacks.lira import lira_offline, lira_statistic


def vulnerable_samples(df: pd.DataFrame, quantizer: str, fpc_value: float | None, top: int = 20) -> dict[str, Any]:
    """List the samples offline LiRA finds most exposed: ids and scores only, never text.

    The score of a sample is the mean, over the runs that trained on it, of its calibrated LiRA statistic when that
    run is the target (leave-one-out; the other runs where it was out give its Gaussian).

    Args:
        df (pd.DataFrame): the loss table.
        quantizer (str): the quantizer's name.
        fpc_value (float | None): LiRA's finite population correction.
        top (int): the most samples listed.
    Returns:
        dict[str, Any]: the attack, the score's definition and the samples (sample_id, score, n_member_runs),
        highest score first.
    """

    rows, _ = final_pool(df, quantizer)
    loss = rows.pivot(index="run", columns="sample_id", values="loss").sort_index()
    member = rows.pivot(index="run", columns="sample_id", values="member").sort_index().astype(bool)
    samples = [str(c) for c in loss.columns]
    z = leave_one_out(lira_offline, lira_statistic(loss.to_numpy()), member.to_numpy(), fpc_value)
    keep = member.to_numpy()
    with np.errstate(invalid="ignore"):
        z_in = np.where(keep & np.isfinite(z), z, np.nan)
        counts = np.isfinite(z_in).sum(0)
        score = np.where(counts > 0, np.nansum(np.nan_to_num(z_in, nan=0.0), 0) / np.maximum(counts, 1), np.nan)
    order = [i for i in np.argsort(-np.nan_to_num(score, nan=-np.inf)) if np.isfinite(score[i])][:top]
    return {
        "attack": "lira_offline",
        "score_definition": "mean over the runs that trained on the sample of its calibrated offline-LiRA z-score (leave-one-out)",
        "samples": [
            {"sample_id": samples[i], "score": float(score[i]), "n_member_runs": int(counts[i])} for i in order
        ],
    }
