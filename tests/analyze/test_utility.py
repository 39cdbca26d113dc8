"""Utility per quantizer against values worked out by hand."""

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.utility import trajectory_from_table, utility_from_table


def rows():
    # run 0 and 1, checkpoints 5 (earlier) and 10 (final), two validation samples, fp32 and hqq-4
    out = []
    losses = {
        ("fp32", 0, 10): [1.0, 3.0],  # mean 2.0
        ("fp32", 1, 10): [2.0, 2.0],  # mean 2.0
        ("hqq-4", 0, 10): [1.5, 3.5],  # mean 2.5: +25%
        ("hqq-4", 1, 10): [2.2, 2.2],  # mean 2.2: +10%
        ("fp32", 0, 5): [9.0, 9.0],  # earlier checkpoints never count for utility
        ("fp32", 1, 5): [9.0, 9.0],
        ("hqq-4", 0, 5): [9.0, 9.0],
        ("hqq-4", 1, 5): [9.0, 9.0],
    }
    for (q, run, ckpt), values in losses.items():
        for j, v in enumerate(values):
            out.append(
                dict(run=run, checkpoint=ckpt, quantizer=q, sample_id=f"v{j}", split="val", member=False, loss=v)
            )
    out.append(dict(run=-1, checkpoint=0, quantizer="fp32", sample_id="v0", split="val", member=False, loss=4.0))
    out.append(dict(run=-1, checkpoint=0, quantizer="fp32", sample_id="v1", split="val", member=False, loss=6.0))
    return pd.DataFrame(out)


def test_utility_is_the_final_checkpoints_validation_loss_and_its_change_vs_the_reference():
    util = utility_from_table(rows(), ["fp32", "hqq-4"], "fp32", n_boot=200, seed=0)
    assert util["fp32"]["val_loss"] == pytest.approx(2.0)
    assert util["fp32"]["val_loss_per_run"] == pytest.approx([2.0, 2.0])
    assert util["hqq-4"]["val_loss"] == pytest.approx(2.35)
    assert util["hqq-4"]["relative_change"] == pytest.approx((0.25 + 0.10) / 2)
    low, high = util["hqq-4"]["relative_change_ci"]
    assert low == pytest.approx(0.10) and high == pytest.approx(0.25)  # two runs: the resampled means span them
    assert util["fp32"]["relative_change"] == 0.0
    assert util["_base_model"]["val_loss"] == pytest.approx(5.0)


def test_trajectory_averages_runs_per_checkpoint():
    traj = trajectory_from_table(rows())
    assert traj["hqq-4"]["checkpoint"] == [5, 10]
    assert traj["hqq-4"]["val_loss"] == pytest.approx([9.0, np.mean([2.5, 2.2])])
