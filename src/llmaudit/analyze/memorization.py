"""Memorization in bits: an attack-free view next to r_Q, computed from the same loss tables.

docs/science.md section 6, after Morris et al. (2025), "How much do language models memorize?":

    H(x | model)            = -log2 p(x | model)              (sum of the token NLLs, in bits)
    H(x | ref, target)      = -log2 max(p(x | target), p(x | ref)) = min(H(x | target), H(x | ref))
    mem_U(x)                = H(x | ref) - H(x | ref, target)  >= 0, additive over a data set

H is the information of the whole scored sequence (a sum over its tokens, never a mean). The reference
is the base model before fine-tuning (run == -1 in a loss table) unless the caller names another model.
The summed mem_U over a data set is a lower bound on what the target holds about it, because a
reference that explains x less well than the target's own generalisation would raise it.

The math is pure functions (`sequence_bits`, `mem_u_bits`; `membership_f1_sigmoid_law` in
`llmaudit.analyze.memorization_capacity`, with the capacity view); the table functions only select and join rows
(the reference model's rows: `llmaudit.analyze.memorization_reference`);
`llmaudit.commands.memorization.memorization_command` is the one place that touches the disk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.memorization_capacity import DEFAULT_BITS_PER_PARAM, capacity_view
from llmaudit.analyze.memorization_reference import (
    HOW_TO_SCORE,
    MemorizationError,
    Reference,
    parse_reference,
    select_reference_rows,
)
from llmaudit.common.errors import UserError
from llmaudit.common.stats import bootstrap_mean_interval
from llmaudit.store.losstable import REFERENCE_RUN, validate_loss_table

LN2 = math.log(2.0)

DEFINITION = (
    "mem_U(x) = H(x | ref) - H(x | ref, target), H(x | ref, target) = -log2 max(p(x | target), "
    "p(x | ref)); H of the whole scored sequence in bits (Morris et al. 2025)."
)


def sequence_bits(token_losses: Iterable[float] | np.ndarray) -> float:
    """Compute H(x | model) = -log2 p(x | model) of one scored sequence.

    Args:
        token_losses (np.ndarray): [n_tokens] per-token negative log-likelihoods in nats.
    Returns:
        float: their sum / ln 2, in bits.
    Raises:
        ValueError: when the losses are not one sequence.
    """
    losses = np.asarray(token_losses, dtype=np.float64)
    if losses.ndim != 1:
        raise ValueError(f"token_losses must be one sequence, shape [n_tokens]; got shape {losses.shape}.")
    return float(losses.sum() / LN2)


def sequences_bits(token_losses: Iterable[Iterable[float] | np.ndarray]) -> np.ndarray:
    """Compute `sequence_bits` of each sequence.

    Args:
        token_losses (Iterable[np.ndarray]): n sequences of per-token losses in nats.
    Returns:
        np.ndarray: [n] bits.
    """
    return np.array([sequence_bits(t) for t in token_losses], dtype=np.float64)


SEQUENCE_BITS = "sequence_bits"
"""The column of an analysis' light table (`llmaudit.analyze.store_table`): each row's `sequence_bits`, computed
from its token losses when its file was read and validated; the table's pool rows carry no token lists."""


def rows_bits(rows: pd.DataFrame) -> np.ndarray:
    """Compute H(x | model) in bits of each row of a loss table.

    Args:
        rows (pd.DataFrame): loss-table rows; their `SEQUENCE_BITS` column is read where the table carries it (a
            light table), else `sequences_bits` of their token losses (the same numbers).
    Returns:
        np.ndarray: [n] bits.
    """
    if SEQUENCE_BITS in rows.columns:
        return rows[SEQUENCE_BITS].to_numpy(dtype=np.float64)
    return sequences_bits(rows["token_losses"])


def mem_u_bits(h_ref: np.ndarray | float, h_target: np.ndarray | float) -> np.ndarray:
    """Compute the unintended memorization mem_U(x) = h_ref - min(h_ref, h_target), in bits.

    The max of the two probabilities is the min of the two code lengths, so the result is never negative: 0 where
    the target explains x no better than the reference, h_ref where the target gives x probability 1.

    Args:
        h_ref (np.ndarray | float): [n] (or broadcastable) H(x | ref) in bits.
        h_target (np.ndarray | float): [n] H(x | target) in bits.
    Returns:
        np.ndarray: [n] mem_U in bits.
    """
    h_ref = np.asarray(h_ref, dtype=np.float64)
    h_target = np.asarray(h_target, dtype=np.float64)
    return h_ref - np.minimum(h_ref, h_target)


def interval_over_runs(values: np.ndarray, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Average per-run values with a percentile bootstrap interval over runs (runs resampled).

    Args:
        values (np.ndarray): [R] per-run values; NaN entries (runs where the quantity is undefined) are dropped.
        n_boot (int): bootstrap resamples.
        seed (int): the resampling seed.
        level (float): the interval's confidence.
    Returns:
        dict[str, Any]: mean, low, high, n_runs; low and high None with fewer than two runs (one run says nothing
        about run-to-run spread), every value None without runs.
    """
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    n = int(values.size)
    if n == 0:
        return {"mean": None, "low": None, "high": None, "n_runs": 0}
    out: dict[str, Any] = {"mean": float(values.mean()), "low": None, "high": None, "n_runs": n}
    if n >= 2 and n_boot > 0:
        out["low"], out["high"] = bootstrap_mean_interval(values, n_boot=n_boot, confidence=level, seed=seed)
    return out


def resolve_reference(df: pd.DataFrame, reference: Reference) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Pick the reference model's rows (`select_reference_rows`) and their code lengths.

    Args:
        df (pd.DataFrame): the loss table.
        reference (Reference): "base", a mapping naming rows, or a separate loss table.
    Returns:
        tuple[pd.DataFrame, dict[str, Any]]: rows indexed by sample_id with columns h_ref_bits and ref_n_tokens, and
        their description (kind, run, quantizer, checkpoint, n_samples).
    """
    rows, kind = select_reference_rows(df, reference)
    description = {
        "kind": kind,
        "run": int(rows["run"].iloc[0]),
        "quantizer": str(rows["quantizer"].iloc[0]),
        "checkpoint": int(rows["checkpoint"].iloc[0]),
        "n_samples": int(len(rows)),
    }
    out = pd.DataFrame(
        {
            "h_ref_bits": rows_bits(rows),
            "ref_n_tokens": rows["n_tokens"].to_numpy(dtype=np.int64),
        },
        index=pd.Index(rows["sample_id"].to_numpy(), name="sample_id"),
    )
    return out, description


def final_checkpoint_rows(
    df: pd.DataFrame, *, exclude: tuple[int, str, int] | None = None
) -> tuple[pd.DataFrame, list[str]]:
    """Select the target rows: every fine-tuning run (run != -1) at its final checkpoint, all quantizers.

    A quantizer not scored at a run's final (largest) checkpoint is left out for that run, with a note.

    Args:
        df (pd.DataFrame): the loss table.
        exclude (tuple[int, str, int] | None): the (run, quantizer, checkpoint) of reference rows to leave out.
    Returns:
        tuple[pd.DataFrame, list[str]]: the rows and the notes.
    Raises:
        MemorizationError: when there is no fine-tuned run.
    """
    targets = df[df["run"] != REFERENCE_RUN]
    if exclude is not None:
        run, quantizer, checkpoint = exclude
        targets = targets[
            ~((targets["run"] == run) & (targets["quantizer"] == quantizer) & (targets["checkpoint"] == checkpoint))
        ]
    if targets.empty:
        raise MemorizationError(
            "the loss table has no fine-tuned runs to measure (rows with run >= 0 other than the reference)."
        )
    final = targets.groupby("run")["checkpoint"].transform("max")
    notes = []
    for run, sub in targets.groupby("run"):
        last = sub["checkpoint"].max()
        missing = sorted(set(sub["quantizer"]) - set(sub.loc[sub["checkpoint"] == last, "quantizer"]))
        if missing:
            notes.append(f"run {run}: quantizer(s) {missing} not scored at the final checkpoint {last}; left out.")
    return targets[targets["checkpoint"] == final], notes


def per_sample_memorization(
    df: pd.DataFrame, *, reference: Reference = "base"
) -> tuple[pd.DataFrame, dict[str, Any], list[str]]:
    """Compute mem_U of every (run, quantizer, sample) at each run's final checkpoint.

    Args:
        df (pd.DataFrame): the loss table ("val" rows are non-members by construction).
        reference (Reference): "base", a mapping naming rows, or a separate loss table.
    Returns:
        tuple[pd.DataFrame, dict[str, Any], list[str]]: (frame, reference description, notes); one row per target
        row with run, checkpoint, quantizer, sample_id, split, member, n_tokens, h_ref_bits, h_target_bits,
        h_joint_bits (the min of the two), mem_u_bits.
    Raises:
        MemorizationError: when a target sample has no reference loss.
    """
    if SEQUENCE_BITS not in df.columns:  # a light table was validated file by file as it was read
        df = validate_loss_table(df)
    ref, description = resolve_reference(df, reference)
    # A reference read from a separate table may reuse run numbers; only rows of this table are excluded.
    exclude = None
    if description["kind"] != "loss table":
        exclude = (description["run"], description["quantizer"], description["checkpoint"])
    targets, notes = final_checkpoint_rows(df, exclude=exclude)
    missing = sorted(set(targets["sample_id"]) - set(ref.index))
    if missing:
        raise MemorizationError(
            f"the reference ({description['kind']}: run={description['run']}, quantizer="
            f"{description['quantizer']!r}) was scored on {len(ref)} samples but {len(missing)} scored "
            f"sample(s) have no reference loss, e.g. {missing[:5]}. {HOW_TO_SCORE}"
        )
    columns = ["run", "checkpoint", "quantizer", "sample_id", "split", "member", "n_tokens"]
    out = targets[columns].reset_index(drop=True)
    out["h_ref_bits"] = ref["h_ref_bits"].reindex(out["sample_id"]).to_numpy()
    out["h_target_bits"] = rows_bits(targets)
    out["h_joint_bits"] = np.minimum(out["h_ref_bits"], out["h_target_bits"])
    out["mem_u_bits"] = mem_u_bits(out["h_ref_bits"].to_numpy(), out["h_target_bits"].to_numpy())
    ref_tokens = ref["ref_n_tokens"].reindex(out["sample_id"]).to_numpy()
    mismatch = int((ref_tokens != out["n_tokens"].to_numpy()).sum())
    if mismatch:
        notes.append(
            f"{mismatch} row(s) were scored on a different number of tokens by the reference and the "
            "target: bits compare only if both scored the same text (a different tokenizer is fine, a "
            "different span is not)."
        )
    return out, description, notes


def _per_run_row(sub: pd.DataFrame, adapter_params: int | None, model_params: int | None) -> dict[str, Any]:
    members = sub[sub["member"]]
    nonmembers = sub[~sub["member"]]
    member_total = float(members["mem_u_bits"].sum())
    member_mean = float(members["mem_u_bits"].mean()) if len(members) else math.nan
    nonmember_total = float(nonmembers["mem_u_bits"].sum())
    nonmember_mean = float(nonmembers["mem_u_bits"].mean()) if len(nonmembers) else math.nan
    # What training added: the members' bits beyond what as many never-trained samples receive.
    excess = member_total - len(members) * nonmember_mean if len(nonmembers) else math.nan
    row = {
        "n_members": int(len(members)),
        "n_nonmembers": int(len(nonmembers)),
        "member_total_bits": member_total,
        "member_mean_bits": member_mean,
        "nonmember_total_bits": nonmember_total,
        "nonmember_mean_bits": nonmember_mean,
        "mean_difference_bits": member_mean - nonmember_mean,
        "excess_member_bits": excess,
        "member_bits_per_adapter_param": member_total / adapter_params if adapter_params else math.nan,
        "excess_bits_per_adapter_param": excess / adapter_params if adapter_params else math.nan,
        "member_bits_per_model_param": member_total / model_params if model_params else math.nan,
        "excess_bits_per_model_param": excess / model_params if model_params else math.nan,
    }
    return row


AGGREGATED_METRICS = (
    "member_total_bits",
    "member_mean_bits",
    "nonmember_total_bits",
    "nonmember_mean_bits",
    "mean_difference_bits",
    "excess_member_bits",
    "member_bits_per_adapter_param",
    "excess_bits_per_adapter_param",
    "member_bits_per_model_param",
    "excess_bits_per_model_param",
)


def _clean(obj: Any) -> Any:
    """NaN -> None and numpy scalars -> Python, so the result is strict JSON."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def _check_count(name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if int(value) <= 0:
        raise UserError(f"{name}={value!r}: a parameter count must be a positive integer (or None).")
    return int(value)


def _per_run_rows(samples: pd.DataFrame, adapter_params: int | None, model_params: int | None) -> list[dict[str, Any]]:
    """One row per (quantizer, run) of the per-sample memorization, sorted: its checkpoint and `_per_run_row`."""
    per_run: list[dict[str, Any]] = []
    for (quantizer, run), sub in samples.groupby(["quantizer", "run"], sort=True):
        per_run.append(
            {"quantizer": quantizer, "run": int(run), "checkpoint": int(sub["checkpoint"].iloc[0])}
            | _per_run_row(sub, adapter_params, model_params)
        )
    return per_run


def _per_quantizer_intervals(per_run_frame: pd.DataFrame, *, n_boot: int, seed: int) -> dict[str, Any]:
    """Per quantizer: its runs and, for each of `AGGREGATED_METRICS`, `interval_over_runs` over those runs."""
    per_quantizer: dict[str, Any] = {}
    for quantizer, sub in per_run_frame.groupby("quantizer", sort=True):
        per_quantizer[str(quantizer)] = {
            "runs": [int(r) for r in sub["run"]],
            **{
                metric: interval_over_runs(sub[metric].to_numpy(), n_boot=n_boot, seed=seed)
                for metric in AGGREGATED_METRICS
            },
        }
    return per_quantizer


def memorization_from_table(
    df: pd.DataFrame,
    *,
    reference: Reference = "base",
    adapter_params: int | None = None,
    model_params: int | None = None,
    capacity_bits_per_param: float = DEFAULT_BITS_PER_PARAM,
    scaling_law: Mapping[str, Any] | None = None,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure memorization in bits per quantizer, at the final checkpoint of every run.

    Members are pool rows with member=True; non-members are pool rows with member=False and every "val" row. For
    each (quantizer, run): totals and means of mem_U over members and non-members, their mean difference, the
    members' excess over as many non-members, and the members' bits per adapter / model parameter. Per quantizer:
    the mean over runs with a percentile-bootstrap interval over runs.

    Args:
        df (pd.DataFrame): a loss table (`llmaudit.losstable`).
        reference (Reference): "base" (run -1 rows), {"run": R, "quantizer": Q[, "checkpoint": C]} naming other rows
            of the table, or a DataFrame (a loss table scored by the reference model).
        adapter_params (int | None): the adapter's parameters (positive), for bits per parameter.
        model_params (int | None): the model's parameters (positive).
        capacity_bits_per_param (float): for the capacity view (capacity = params x bits per param), > 0.
        scaling_law (Mapping[str, Any] | None): None, or {"c1", "c2", "c3"[, "dataset_size": "samples" | "tokens"]}:
            the constants of `membership_f1_sigmoid_law`; its output is reported only under "extrapolation".
        n_boot (int): bootstrap resamples over runs.
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: definition, reference, per_quantizer, per_run, capacity and notes, strict JSON.
    Raises:
        UserError: on a non-positive parameter count or capacity, or a malformed scaling law.
        MemorizationError: when the table cannot give the view (no reference rows, no fine-tuned run).
    """
    adapter_params = _check_count("adapter_params", adapter_params)
    model_params = _check_count("model_params", model_params)
    if not capacity_bits_per_param > 0:
        raise UserError(f"capacity_bits_per_param={capacity_bits_per_param!r}: must be > 0.")
    samples, ref_description, notes = per_sample_memorization(df, reference=reference)
    per_run = _per_run_rows(samples, adapter_params, model_params)
    per_quantizer = _per_quantizer_intervals(pd.DataFrame(per_run), n_boot=n_boot, seed=seed)
    result = {
        "definition": DEFINITION,
        "reference": ref_description,
        "adapter_params": adapter_params,
        "model_params": model_params,
        "interval": f"95% percentile bootstrap over runs ({n_boot} resamples, seed {seed})",
        "per_quantizer": per_quantizer,
        "per_run": per_run,
        "capacity": capacity_view(
            samples,
            adapter_params=adapter_params,
            model_params=model_params,
            capacity_bits_per_param=capacity_bits_per_param,
            scaling_law=scaling_law,
        ),
        "notes": notes,
    }
    return _clean(result)


__all__ = [
    "AGGREGATED_METRICS",
    "DEFINITION",
    "LN2",
    "MemorizationError",
    "SEQUENCE_BITS",
    "Reference",
    "final_checkpoint_rows",
    "interval_over_runs",
    "mem_u_bits",
    "memorization_from_table",
    "parse_reference",
    "per_sample_memorization",
    "resolve_reference",
    "rows_bits",
    "sequence_bits",
    "sequences_bits",
]
