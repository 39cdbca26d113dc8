"""Memorization against capacity: each run's training set next to the model's capacity, and the scaling law.

docs/science.md section 6, after Morris et al. (2025), "How much do language models memorize?": a model's
capacity is its parameters x about 3.6 bits; the membership-F1 sigmoid law of capacity / dataset size is reported
only as an extrapolation, with constants the caller supplies. The per-sample memorization these views read is
`llmaudit.analyze.memorization`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.common.errors import UserError

DEFAULT_BITS_PER_PARAM = 3.6
"""Capacity of GPT-style transformers measured by Morris et al. (3.51 in bf16, 3.83 in fp32)."""


def membership_f1_sigmoid_law(
    capacity_bits: np.ndarray | float,
    dataset_size: np.ndarray | float,
    *,
    c1: float,
    c2: float,
    c3: float,
) -> np.ndarray:
    """Extrapolate F1 = 1/2 * (1 + c1 * sigmoid(c2 * (capacity_bits / dataset_size + c3))).

    The functional form of the membership-F1 scaling law of Morris et al. The constants have no defaults on
    purpose: the printed fit is not self-consistent (docs/science.md section 6), so the caller supplies constants it
    has checked against its own data and must present the output as an extrapolation.

    Args:
        capacity_bits (np.ndarray | float): the model's capacity in bits, broadcast to [m].
        dataset_size (np.ndarray | float): the training set's size (samples or tokens), broadcast to [m].
        c1 (float): the law's scale.
        c2 (float): the law's slope.
        c3 (float): the law's offset.
    Returns:
        np.ndarray: [m] predicted membership F1.
    """
    ratio = np.asarray(capacity_bits, dtype=np.float64) / np.asarray(dataset_size, dtype=np.float64)
    z = c2 * (ratio + c3)
    return 0.5 * (1.0 + c1 / (1.0 + np.exp(-z)))


def capacity_view(
    samples: pd.DataFrame,
    *,
    adapter_params: int | None,
    model_params: int | None,
    capacity_bits_per_param: float = DEFAULT_BITS_PER_PARAM,
    scaling_law: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Set each run's training set against the model's capacity estimate.

    The training set's information is the sum of H(x | ref) over its members (the bits a perfect memorizer would
    have to store beyond the reference); membership is the same under every quantizer, so each (run, sample)
    counts once.

    Args:
        samples (pd.DataFrame): the frame of `per_sample_memorization`.
        adapter_params (int | None): the adapter's parameters.
        model_params (int | None): the model's parameters.
        capacity_bits_per_param (float): bits per parameter of capacity.
        scaling_law (Mapping[str, Any] | None): the constants of `membership_f1_sigmoid_law`, or None.
    Returns:
        dict[str, Any]: bits_per_param, the capacities, per-run information and capacity ratios, a note, and the
        extrapolation when a scaling law is given.
    Raises:
        UserError: on a malformed scaling law or one without a parameter count.
    """
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
    """Read the command-line form of a scaling law.

    Args:
        text (str): "c1=..,c2=..,c3=..[,dataset_size=samples|tokens]".
    Returns:
        dict[str, Any]: the constants as floats, dataset_size as text.
    Raises:
        UserError: when a part is not key=value.
    """
    law: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise UserError(f"scaling law {text!r}: expected c1=..,c2=..,c3=..[,dataset_size=samples].")
        key, value = key.strip(), value.strip()
        law[key] = value if key == "dataset_size" else float(value)
    return law
