"""Memorization in bits: an attack-free view next to r_Q, computed from the same loss tables.

docs/science.md section 6, after Morris et al. (2025), "How much do language models memorize?":

    H(x | model)            = -log2 p(x | model)              (sum of the token NLLs, in bits)
    H(x | ref, target)      = -log2 max(p(x | target), p(x | ref)) = min(H(x | target), H(x | ref))
    mem_U(x)                = H(x | ref) - H(x | ref, target)  >= 0, additive over a data set

H is the information of the whole scored sequence (a sum over its tokens, never a mean). The reference
is the base model before fine-tuning (run == -1 in a loss table) unless the caller names another model.
The summed mem_U over a data set is a lower bound on what the target holds about it, because a
reference that explains x less well than the target's own generalisation would raise it.

The math is pure functions (`sequence_bits`, `mem_u_bits`, `membership_f1_sigmoid_law`); the table
functions only select and join rows (the reference model's rows: `llmaudit.analyze.memorization_reference`);
`llmaudit.commands.memorization.memorization_command` is the one place that touches the disk.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

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

DEFAULT_BITS_PER_PARAM = 3.6
"""Capacity of GPT-style transformers measured by Morris et al. (3.51 in bf16, 3.83 in fp32)."""

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


def membership_f1_sigmoid_law(
    capacity_bits: np.ndarray | float,
    dataset_size: np.ndarray | float,
    *,
    c1: float,
    c2: float,
    c3: float,
) -> np.ndarray:
    """F1 = 1/2 * (1 + c1 * sigmoid(c2 * (capacity_bits / dataset_size + c3))): an EXTRAPOLATION.

    The functional form of the membership-F1 scaling law of Morris et al.; capacity_bits and
    dataset_size broadcast to [m]. The constants have no defaults on purpose: the printed fit in the
    copy we hold is not self-consistent (docs/science.md section 6), so the caller supplies constants it has
    checked against its own data and must present the output as an extrapolation."""
    ratio = np.asarray(capacity_bits, dtype=np.float64) / np.asarray(dataset_size, dtype=np.float64)
    z = c2 * (ratio + c3)
    return 0.5 * (1.0 + c1 / (1.0 + np.exp(-z)))


def interval_over_runs(values: np.ndarray, *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Mean of per-run values [R] with a percentile bootstrap interval over runs (runs resampled).

    NaN entries (runs where the quantity is undefined) are dropped. With fewer than two runs the
    interval is None: one run says nothing about run-to-run spread."""
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
    """Pick the reference model's rows (`select_reference_rows`).

    Returns (rows indexed by sample_id with columns h_ref_bits and ref_n_tokens, description)."""
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
    """Target rows: every fine-tuning run (run != -1) at its final checkpoint, all quantizers.

    The final checkpoint of a run is the largest checkpoint among its rows; a quantizer not scored
    there is left out for that run, and said so in the returned notes."""
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
    """mem_U of every (run, quantizer, sample) at each run's final checkpoint.

    Returns (frame, reference description, notes). The frame has one row per target row with columns
    run, checkpoint, quantizer, sample_id, split, member, n_tokens, h_ref_bits, h_target_bits,
    h_joint_bits (= min of the two), mem_u_bits. "val" rows are non-members by construction."""
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
    """Memorization in bits per quantizer, at the final checkpoint of every run. JSON-ready dict.

    df: a loss table (`llmaudit.losstable`). Members are pool rows with member=True; non-members are
    pool rows with member=False and every "val" row. For each (quantizer, run): totals and means of
    mem_U over members and non-members, their mean difference, the members' excess over as many
    non-members, and the members' bits per adapter / model parameter. Per quantizer: the mean over runs
    with a percentile-bootstrap interval over runs (n_boot resamples, seed).

    reference: "base" (run -1 rows, default), {"run": R, "quantizer": Q[, "checkpoint": C]} naming
    other rows of the table, or a DataFrame (a loss table scored by the reference model).
    capacity_bits_per_param: for the capacity view (model capacity = params x bits per param).
    scaling_law: None, or {"c1", "c2", "c3"[, "dataset_size": "samples" | "tokens"]}: the constants
    of `membership_f1_sigmoid_law`; its output is reported only under "extrapolation"."""
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


def capacity_view(
    samples: pd.DataFrame,
    *,
    adapter_params: int | None,
    model_params: int | None,
    capacity_bits_per_param: float = DEFAULT_BITS_PER_PARAM,
    scaling_law: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Membership vs capacity: each run's training set against the model's capacity estimate.

    samples: the frame of `per_sample_memorization`. The training set's information is estimated as
    the sum of H(x | ref) over its members (the bits a perfect memorizer would have to store beyond
    the reference); membership is the same under every quantizer, so each (run, sample) counts once."""
    members = samples[samples["member"]].drop_duplicates(["run", "sample_id"])
    model_capacity = model_params * capacity_bits_per_param if model_params else None
    adapter_capacity = adapter_params * capacity_bits_per_param if adapter_params else None
    runs = []
    for run in sorted(samples["run"].unique()):
        sub = members[members["run"] == run]
        information = float(sub["h_ref_bits"].sum())
        runs.append(
            {
                "run": int(run),
                "n_member_samples": int(len(sub)),
                "n_member_tokens": int(sub["n_tokens"].sum()),
                "member_information_bits": information,
                "model_capacity_over_information": model_capacity / information
                if model_capacity and information > 0
                else None,
                "adapter_capacity_over_information": adapter_capacity / information
                if adapter_capacity and information > 0
                else None,
            }
        )
    view: dict[str, Any] = {
        "bits_per_param": float(capacity_bits_per_param),
        "model_capacity_bits": model_capacity,
        "adapter_capacity_bits": adapter_capacity,
        "per_run": runs,
        "note": (
            f"capacity = parameters x {capacity_bits_per_param:g} bits (Morris et al. measured about "
            "3.6 bits per parameter for GPT-style models trained from scratch on random data; a LoRA "
            "adapter's capacity is not measured there). Membership inference on the average sample is "
            "expected near chance once the training set's information exceeds the capacity."
        ),
    }
    if scaling_law is not None:
        view["extrapolation"] = _scaling_law_view(runs, model_capacity, adapter_capacity, scaling_law)
    return view


def _scaling_law_view(
    runs: list[dict[str, Any]],
    model_capacity: float | None,
    adapter_capacity: float | None,
    scaling_law: Mapping[str, Any],
) -> dict[str, Any]:
    law = dict(scaling_law)
    unit = law.pop("dataset_size", "samples")
    if unit not in ("samples", "tokens"):
        raise UserError(f"scaling_law dataset_size={unit!r}: allowed 'samples' or 'tokens'.")
    if set(law) != {"c1", "c2", "c3"}:
        raise UserError(
            f"scaling_law needs exactly the constants c1, c2, c3 (and optionally dataset_size); got "
            f"{sorted(law)}. There are no default constants: supply ones you checked against data."
        )
    capacity, source = (model_capacity, "model") if model_capacity else (adapter_capacity, "adapter")
    if not capacity:
        raise UserError("scaling_law needs model_params (or adapter_params) to compute a capacity.")
    key = "n_member_samples" if unit == "samples" else "n_member_tokens"
    sizes = np.array([max(r[key], 1) for r in runs], dtype=np.float64)
    constants = {k: float(v) for k, v in law.items()}
    predicted = membership_f1_sigmoid_law(capacity, sizes, **constants)
    return {
        "label": "extrapolation",
        "warning": (
            "EXTRAPOLATION, not a measurement: a sigmoid law of membership F1 against capacity / "
            "dataset size, fitted on models trained from scratch, evaluated with caller-supplied "
            "constants. Check it against measured attacks before relying on it."
        ),
        "formula": "F1 = 1/2 * (1 + c1 * sigmoid(c2 * (capacity_bits / dataset_size + c3)))",
        "constants": constants,
        "capacity_source": source,
        "dataset_size_unit": unit,
        "per_run": [
            {"run": r["run"], "dataset_size": float(s), "predicted_membership_f1": float(p)}
            for r, s, p in zip(runs, sizes, predicted)
        ],
    }


def parse_scaling_law(text: str) -> dict[str, Any]:
    """Command-line form "c1=..,c2=..,c3=..[,dataset_size=samples|tokens]"."""
    law: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise UserError(f"scaling law {text!r}: expected c1=..,c2=..,c3=..[,dataset_size=samples].")
        key, value = key.strip(), value.strip()
        law[key] = value if key == "dataset_size" else float(value)
    return law


__all__ = [
    "AGGREGATED_METRICS",
    "DEFAULT_BITS_PER_PARAM",
    "DEFINITION",
    "LN2",
    "MemorizationError",
    "SEQUENCE_BITS",
    "Reference",
    "capacity_view",
    "final_checkpoint_rows",
    "interval_over_runs",
    "mem_u_bits",
    "membership_f1_sigmoid_law",
    "memorization_from_table",
    "parse_reference",
    "parse_scaling_law",
    "per_sample_memorization",
    "resolve_reference",
    "rows_bits",
    "sequence_bits",
    "sequences_bits",
]
