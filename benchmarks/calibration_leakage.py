"""Does calibrating a quantizer on members change what it leaks about them? (docs/results.md, "Calibration text")

Two stores of the same experiment (same runs, same samples) in which quantizer Q was scored with
calibration_source=members and with calibration_source=heldout. Per run, the calibration members C_r are recomputed
exactly as the score stage drew them (quantize.calibration: `calibration_samples` of the run's member texts, drawn
with the quantizer's seed). Reported, with 95% percentile-bootstrap intervals (samples resampled with all their runs):
- the paired per-sample loss change (members-calibrated minus held-out-calibrated) of calibration members, of the
  other members and of non-members, and the difference in differences (calibration members minus non-members:
  negative = calibrating on them made them look more like members);
- the LOSS attack (score = -loss, pooled over runs) under each calibration: AUROC and TPR at 1% FPR, for all members
  and for the calibration members alone, against all non-members.

    python benchmarks/calibration_leakage.py MEMBERS_STORE HELDOUT_STORE gptq-4
"""

from __future__ import annotations

import argparse
import json
import random

import numpy as np
import pandas as pd

from llmaudit.analyze.metrics import bootstrap_ci, roc_metrics
from llmaudit.common.io import read_json
from llmaudit.data.records import record_text
from llmaudit.store.run_store import RunStore


def calibration_members(store: RunStore, quantizer: str) -> dict[int, set[str]]:
    """{run: sample ids of the member texts the quantizer calibrated on} (members source), as the stage drew them."""
    options = read_json(store.quantizer_info_path(quantizer), what="quantizer record")["options"]
    pool = store.read_records("pool")
    masks = store.membership()
    out = {}
    for run in range(masks.shape[0]):
        members = [pool[i] for i in np.flatnonzero(masks[run])]
        texts = [record_text(r) for r in members]
        usable = [t for t in texts if t.strip()]
        chosen = set(random.Random(options["seed"]).sample(usable, min(options["calibration_samples"], len(usable))))
        out[run] = {r["sample_id"] for r, t in zip(members, texts, strict=True) if t in chosen}
    return out


def final_losses(store: RunStore, quantizer: str) -> pd.DataFrame:
    """run, sample_id, member, loss of the pool at every run's final checkpoint."""
    frames = []
    for run in range(store.membership().shape[0]):
        step = store.checkpoints(run)[-1]
        table = pd.read_parquet(store.unit_path(run, step, quantizer), columns=["sample_id", "split", "member", "loss"])
        table = table[table["split"] == "pool"].assign(run=run)
        frames.append(table)
    return pd.concat(frames, ignore_index=True)


def _interval(values_by_sample: pd.Series, n_boot: int, seed: int) -> dict:
    values = values_by_sample.to_numpy()
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), (n_boot, len(values)))].mean(axis=1)
    return {"mean": float(values.mean()), "low": float(np.percentile(means, 2.5)), "high": float(np.percentile(means, 97.5)), "n": len(values)}  # fmt: skip


def _did(paired: pd.DataFrame, n_boot: int, seed: int) -> dict:
    """Mean change of calibration members minus mean change of non-members, samples resampled within each group."""
    cal = paired[paired["group"] == "calibration members"]["change"].to_numpy()
    non = paired[paired["group"] == "non-members"]["change"].to_numpy()
    rng = np.random.default_rng(seed)
    draws = cal[rng.integers(0, len(cal), (n_boot, len(cal)))].mean(1) - non[
        rng.integers(0, len(non), (n_boot, len(non)))
    ].mean(1)
    return {"mean": float(cal.mean() - non.mean()), "low": float(np.percentile(draws, 2.5)), "high": float(np.percentile(draws, 97.5))}  # fmt: skip


def _attack(table: pd.DataFrame, keep: pd.Series, n_boot: int, seed: int) -> dict:
    rows = table[keep | ~table["member"]]
    scores, labels = -rows["loss"].to_numpy(), rows["member"].to_numpy()
    groups = pd.factorize(rows["sample_id"])[0]
    point = roc_metrics(scores, labels, fprs=(0.01,))
    ci = bootstrap_ci(scores, labels, fprs=(0.01,), n_boot=n_boot, seed=seed, groups=groups)
    return {
        "auroc": point["auroc"], "auroc_ci": [ci["auroc"]["low"], ci["auroc"]["high"]],
        "tpr_at_1pct": point["tpr_at_fpr"]["0.01"]["tpr"],
        "tpr_ci": [ci["tpr_at_fpr"]["0.01"]["low"], ci["tpr_at_fpr"]["0.01"]["high"]],
        "members": int(labels.sum()), "non_members": int((~labels).sum()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("members_store")
    parser.add_argument("heldout_store")
    parser.add_argument("quantizer")
    parser.add_argument("--n-boot", type=int, default=1000)
    args = parser.parse_args()
    on_members, on_heldout = RunStore(args.members_store), RunStore(args.heldout_store)
    sources = [read_json(s.quantizer_info_path(args.quantizer), what="quantizer record")["options"].get("calibration_source", "members") for s in (on_members, on_heldout)]  # fmt: skip
    assert sources == ["members", "heldout"], f"calibration sources are {sources}, expected members then heldout"
    chosen = calibration_members(on_members, args.quantizer)
    a, b = final_losses(on_members, args.quantizer), final_losses(on_heldout, args.quantizer)
    paired = a.merge(b, on=["run", "sample_id", "member"], suffixes=("_members", "_heldout"))
    assert len(paired) == len(a) == len(b)
    paired["change"] = paired["loss_members"] - paired["loss_heldout"]
    paired["calibrated_on"] = [sid in chosen[run] for run, sid in zip(paired["run"], paired["sample_id"], strict=True)]
    paired["group"] = np.where(paired["calibrated_on"], "calibration members", np.where(paired["member"], "other members", "non-members"))  # fmt: skip
    out = {"quantizer": args.quantizer, "loss_change": {}, "did": _did(paired, args.n_boot, 0), "attack": {}}
    for group, rows in paired.groupby("group"):
        out["loss_change"][group] = _interval(rows.groupby("sample_id")["change"].mean(), args.n_boot, 0)
    for label, table, column in (("members-calibrated", paired, "loss_members"), ("heldout-calibrated", paired, "loss_heldout")):  # fmt: skip
        view = table.rename(columns={column: "loss"})
        out["attack"][label] = {
            "all members": _attack(view, view["member"], args.n_boot, 0),
            "calibration members": _attack(view, view["calibrated_on"], args.n_boot, 0),
        }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
