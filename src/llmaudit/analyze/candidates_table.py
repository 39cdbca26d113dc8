"""The candidate indicators (`llmaudit.analyze.candidates`) scored from a loss table: every candidate for
every (run, quantizer), aggregated per quantizer (`candidates_from_table`, docs/science.md section 8).

Aggregation over runs: per quantizer, the mean over the runs with a finite value and a percentile
bootstrap interval over those runs; non-finite runs are counted, never dropped silently. A candidate whose
inputs the table lacks is nan with the reason, never approximated.

Mapping of the table's rows to a candidate's inputs (fixed with the pre-registration): held-out = the rows of
split "val" along the run's trajectory (checkpoints ascending, the last = the released model); training samples =
the rows of split "pool" with member = True for that run, at every checkpoint where such rows exist; full
precision = the reference quantizer of the same run. Rows of the base model (run = -1) are skipped; a checkpoint
that misses a sample is dropped (counted). In llmaudit's run stores the pool is scored at each run's final
checkpoint only, so the candidates that need training-sample losses at every checkpoint (rq_train, gap_std_traj)
are nan there, and the parameter controls are nan in every table.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.candidates import (
    CANDIDATES,
    CHECKPOINTS_FINAL,
    CHECKPOINTS_PARAMETERS,
    ORIENTATION,
    PREREGISTRATION,
    REASON_NAN,
    REASON_PARAMETERS,
    Candidate,
)
from llmaudit.common.stats import bootstrap_mean_interval, finite_mean
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN


def _wide(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int]:
    """(checkpoints [K] ascending, losses [K, n], checkpoints dropped because they miss a sample)."""
    if rows.empty:
        return np.zeros(0, dtype=np.int64), np.zeros((0, 0)), 0
    wide = rows.pivot(index="checkpoint", columns="sample_id", values="loss").sort_index()
    complete = wide.dropna(axis=0, how="any")
    return complete.index.to_numpy(dtype=np.int64), complete.to_numpy(dtype=np.float64), len(wide) - len(complete)


@dataclass
class _RunLosses:
    val_ckpts: np.ndarray
    val: np.ndarray
    train_ckpts: np.ndarray
    train: np.ndarray
    dropped: int


def _run_losses(block: pd.DataFrame | None) -> _RunLosses:
    if block is None:
        block = pd.DataFrame(columns=["checkpoint", "sample_id", "loss", "split", "member"])
    vc, v, dv = _wide(block[block["split"] == "val"])
    members = block[(block["split"] == "pool") & block["member"].astype(bool)]
    tc, t, dt = _wide(members)
    return _RunLosses(vc, v, tc, t, dv + dt)


def _final_rows(x: _RunLosses) -> tuple[np.ndarray, np.ndarray] | str:
    """(val [1, n_val], train [1, n_train]) at the run's final checkpoint, or the reason they are missing."""
    if x.val_ckpts.size == 0:
        return "no held-out (val) rows for this run and quantizer"
    final = x.val_ckpts[-1]
    where = np.flatnonzero(x.train_ckpts == final)
    if where.size == 0:
        return f"no member pool rows at the final checkpoint {int(final)}"
    return x.val[-1:], x.train[where[0] : where[0] + 1]


def _candidate_inputs(c: Candidate, x: _RunLosses, fp: _RunLosses | None, reference: str | None) -> dict | str:
    """The keyword arguments of candidate `c` for one (run, quantizer), or the reason it cannot be computed."""
    if c.checkpoints == CHECKPOINTS_PARAMETERS:
        return REASON_PARAMETERS
    if x.val_ckpts.size == 0:
        return "no held-out (val) rows for this run and quantizer"
    if c.checkpoints == CHECKPOINTS_FINAL and "train" not in c.inputs:
        return {"val": x.val[-1:]}
    if c.checkpoints == CHECKPOINTS_FINAL:
        rows = _final_rows(x)
        if isinstance(rows, str):
            return rows
        args = {"val": rows[0], "train": rows[1]}
        if "val_fp" in c.inputs:
            if fp is None:
                return (
                    "no full-precision reference quantizer in the table"
                    if reference is None
                    else f"no rows of the reference quantizer {reference!r} for this run"
                )
            fp_rows = _final_rows(fp)
            if isinstance(fp_rows, str):
                return f"reference quantizer {reference!r}: {fp_rows}"
            if fp.val_ckpts[-1] != x.val_ckpts[-1]:
                return (
                    f"the reference quantizer's final checkpoint {int(fp.val_ckpts[-1])} differs from this "
                    f"quantizer's {int(x.val_ckpts[-1])}"
                )
            args.update(val_fp=fp_rows[0], train_fp=fp_rows[1])
        return args
    # trajectory candidates: every checkpoint of the run's held-out trajectory
    if "train" not in c.inputs:
        return {"val": x.val}
    missing = np.setdiff1d(x.val_ckpts, x.train_ckpts)
    if missing.size:
        have = x.train_ckpts.tolist()
        return (
            f"needs training-sample losses at every checkpoint of the trajectory ({x.val_ckpts.size} checkpoints); "
            f"member pool rows exist at checkpoint(s) {have if len(have) <= 5 else have[:5] + ['...']} only "
            "(llmaudit's scorer scores the pool at each run's final checkpoint only)"
        )
    idx = np.searchsorted(x.train_ckpts, x.val_ckpts)
    train = x.train[idx]
    return {"val": x.val, "train": train} if "val" in c.inputs else {"train": train}


def _aggregate(values: np.ndarray, *, n_boot: int, confidence: float, seed: int) -> dict[str, Any]:
    finite = np.isfinite(values)
    low, high = bootstrap_mean_interval(values, n_boot=n_boot, confidence=confidence, seed=seed)
    return {
        "mean": finite_mean(values),
        "ci_low": low,
        "ci_high": high,
        "confidence": confidence,
        "n_runs": int(values.size),
        "n_finite": int(finite.sum()),
        "n_nonfinite": int((~finite).sum()),
        "n_nan": int(np.isnan(values).sum()),
    }


def _candidate_value(
    c: Candidate, x: _RunLosses, fp: _RunLosses | None, reference: str | None
) -> tuple[float, str | None]:
    """(value, reason) of candidate `c` for one (run, quantizer): nan with the reason when the table lacks its
    inputs, the formula rejects them (ValueError) or the formula is undefined (nan); reason None otherwise."""
    args = _candidate_inputs(c, x, fp, reference)
    value, reason = math.nan, None
    if isinstance(args, str):
        reason = args
    else:
        try:
            value = float(c.function(**args))
        except ValueError as exc:
            reason = f"not computable: {exc}"
        else:
            if math.isnan(value):
                reason = REASON_NAN
    return value, reason


def _per_run_entry(run: int, quantizer: str, x: _RunLosses) -> dict[str, Any]:
    """The `per_run` entry of one (run, quantizer) before its candidates are scored (empty values/reasons)."""
    return {
        "run": run,
        "quantizer": quantizer,
        "val_checkpoints": x.val_ckpts.tolist(),
        "train_checkpoints": x.train_ckpts.tolist(),
        "n_val": int(x.val.shape[1]) if x.val.size else 0,
        "n_train": int(x.train.shape[1]) if x.train.size else 0,
        "checkpoints_dropped": x.dropped,
        "values": {},
        "reasons": {},
    }


def _score_runs(
    blocks: Mapping[tuple[int, str], pd.DataFrame],
    runs: list[int],
    quantizers: list[str],
    names: list[str],
    reference: str | None,
) -> tuple[list[dict[str, Any]], dict[str, dict[str, np.ndarray]], dict[str, dict[str, Counter]]]:
    """Every candidate for every (run, quantizer) block: (per_run entries, values {name: {quantizer: [R]}},
    reasons {name: {quantizer: Counter of the reasons of the nan runs}})."""
    per_run: list[dict[str, Any]] = []
    values = {n: {q: np.full(len(runs), math.nan) for q in quantizers} for n in names}
    reasons: dict[str, dict[str, Counter]] = {n: {q: Counter() for q in quantizers} for n in names}
    for i, run in enumerate(runs):
        fp = _run_losses(blocks[run, reference]) if reference is not None and (run, reference) in blocks else None
        for q in quantizers:
            x = _run_losses(blocks.get((run, q)))
            entry = _per_run_entry(run, q, x)
            for n in names:
                value, reason = _candidate_value(CANDIDATES[n], x, fp, reference)
                values[n][q][i] = value
                entry["values"][n] = value
                if reason is not None:
                    entry["reasons"][n] = reason
                    reasons[n][q][reason] += 1
            per_run.append(entry)
    return per_run, values, reasons


def _candidate_summary(
    name: str,
    quantizers: list[str],
    values: Mapping[str, np.ndarray],
    reasons: Mapping[str, Counter],
    *,
    n_boot: int,
    confidence: float,
    seed: int,
) -> dict[str, Any]:
    """One candidate's entry of `candidates_from_table`: its description, whether any run is finite, the most
    common reason otherwise, and per quantizer the aggregate over runs (`_aggregate`) with values and reasons."""
    per_q = {}
    for q in quantizers:
        agg = _aggregate(values[q], n_boot=n_boot, confidence=confidence, seed=seed)
        agg["values"] = values[q].tolist()
        agg["reasons"] = dict(reasons[q])
        per_q[q] = agg
    computable = any(per_q[q]["n_finite"] > 0 for q in quantizers)
    all_reasons = sum((reasons[q] for q in quantizers), Counter())
    return {
        **CANDIDATES[name].describe(),
        "computable": computable,
        "reason": None if computable else (all_reasons.most_common(1)[0][0] if all_reasons else "no runs"),
        "per_quantizer": per_q,
    }


def _table_protocol(n_boot: int, confidence: float, seed: int) -> dict[str, Any]:
    """The `protocol` block of `candidates_from_table`: the fixed mapping from a loss table to the inputs."""
    return {
        "orientation": ORIENTATION,
        "held_out": "split 'val' rows of the run, every checkpoint (ascending; the last = the released model)",
        "training_samples": "split 'pool' rows with member = True for the run, at every checkpoint where they exist",
        "full_precision": "the reference quantizer's rows of the same run",
        "skipped": f"run {REFERENCE_RUN} (the base model)",
        "aggregation": "per quantizer: mean over runs with a finite value; percentile bootstrap of that mean over "
        "runs; non-finite runs counted",
        "n_boot": n_boot,
        "confidence": confidence,
        "seed": seed,
        "preregistration": PREREGISTRATION,
    }


def candidates_from_table(
    df: pd.DataFrame,
    *,
    reference_quantizer: str | None = None,
    quantizers: Iterable[str] | None = None,
    names: Iterable[str] | None = None,
    n_boot: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> dict[str, Any]:
    """Score every candidate for every (run, quantizer) of a loss table, aggregated per quantizer.

    The table's rows map to a candidate's inputs as the module docstring says. Per quantizer and candidate: the
    mean over the runs with a finite value, a percentile bootstrap interval of that mean over runs, and the counts
    of finite and non-finite runs.

    Args:
        df (pd.DataFrame): the loss table.
        reference_quantizer (str | None): full precision (default: the table's full-precision quantizer,
            `full_precision_reference`).
        quantizers (Iterable[str] | None): the quantizers scored (default: all in the table).
        names (Iterable[str] | None): the candidates (default: all of `CANDIDATES`).
        n_boot (int): bootstrap resamples of each mean over runs.
        confidence (float): the intervals' confidence.
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: protocol, reference_quantizer, runs, quantizers, candidates (description, computable,
        reason, per_quantizer) and per_run (values and reasons), JSON-ready.
    Raises:
        ValueError: for an unknown candidate.
    """
    names = list(CANDIDATES) if names is None else list(names)
    unknown = [n for n in names if n not in CANDIDATES]
    if unknown:
        raise ValueError(f"unknown candidate(s) {unknown}; available: {list(CANDIDATES)}.")
    table = df[df["run"] != REFERENCE_RUN]
    runs = sorted(int(r) for r in table["run"].unique())
    present = sorted(str(q) for q in table["quantizer"].unique())
    quantizers = present if quantizers is None else [str(q) for q in quantizers]
    reference = reference_quantizer if reference_quantizer is not None else full_precision_reference(present)
    blocks = {(int(r), str(q)): g for (r, q), g in table.groupby(["run", "quantizer"], sort=False)}

    per_run, values, reasons = _score_runs(blocks, runs, quantizers, names, reference)
    candidates = {
        n: _candidate_summary(n, quantizers, values[n], reasons[n], n_boot=n_boot, confidence=confidence, seed=seed)
        for n in names
    }
    return {
        "protocol": _table_protocol(n_boot, confidence, seed),
        "reference_quantizer": reference,
        "runs": runs,
        "quantizers": quantizers,
        "candidates": candidates,
        "per_run": per_run,
    }
