"""Candidate attack-free indicators beside the published r_Q (docs/science.md section 8).

Every candidate is a PURE numpy function of ONE training run's per-sample losses (two labelled controls:
of its parameters) returning ONE number per run, oriented so that

    HIGHER = MORE SECURE  (predicts a HIGHER MIS / a LOWER attack AUROC).

No candidate runs an attack or trains a shadow model: each uses only what a model owner has, the training
trajectory's checkpoints, the training samples and held-out samples, per quantizer. The formulas and
hyper-parameters were fixed (pre-registered) before any candidate was compared with the baseline MIS or
with a real model's attacks; they are ported here unchanged and each carries a version string. Changing a
formula or a hyper-parameter means a new version, never an edit of an old one.

The formulas, their notation and hyper-parameters are in `llmaudit.analyze.candidate_formulas`
(re-exported here, so `llmaudit.analyze.candidates.gap_std_final` works).

The published r_Q is `llmaudit.analyze.rq.r_q` (docs/science.md section 2), called run by run:
`rq_published` gives exactly its numbers. `CANDIDATES` is the registry (name -> `Candidate`);
`evaluate_candidates` evaluates several on one set of inputs (sharing one r_Q computation per input);
`llmaudit.analyze.candidates_table.candidates_from_table` scores them from a loss table
(`llmaudit.store.losstable`); `validation_registry` reads their shipped validation status.

Aggregation over runs (not part of the functions): per quantizer, the mean over the runs with a finite
value and a percentile bootstrap interval over those runs; non-finite runs are counted, never dropped
silently.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmaudit.analyze.candidate_formulas import (
    DDOF,
    MARGIN_LOSS_CLIP,
    QFLIP_LAST,
    TV_GRID,
    YEOM01_THRESHOLD,
    YEOM_CE_BOUND,
    auc_loss,
    from_r_q_half_reciprocal,
    from_r_q_identity,
    from_r_q_neg_half_reciprocal,
    from_r_q_negate,
    gap_std_final,
    gap_std_ratio_fp,
    gap_std_traj,
    gauss_tv,
    heldout_loss_control,
    ks_loss,
    qdistortion_angle,
    qflip_late,
    r_q_runs,
    rq_negated,
    rq_published,
    rq_reciprocal_flip,
    rq_reciprocal_neg,
    rq_train,
    std_gap,
    tv_gauss_margin,
    yeom_01,
    yeom_ce_clip,
)

ORIENTATION = "higher = more secure"

FAMILY_TRAJECTORY = "trajectory-only"
FAMILY_GAP = "member vs held-out"
FAMILY_CONTROL = "control (no data)"
FAMILY_DAMAGE = "control (held-out loss)"
FAMILIES = (FAMILY_TRAJECTORY, FAMILY_GAP, FAMILY_CONTROL, FAMILY_DAMAGE)
CONTROL_FAMILIES = (FAMILY_CONTROL, FAMILY_DAMAGE)
"""Controls are measured beside the candidates to show what the validation can tell apart; never eligible."""

PREREGISTRATION = {
    "fixed_at": "2026-11-30T16:39:14Z",
    "before": "any candidate was computed on the synthetic runs, compared with the baseline MIS, or run on a "
    "real-model store",
    "prototype_sha256": "7c86697a43fe9a16f4be6084ee744d41840950a4f51bf517d04a637e69e67f2d",
    "note": "formulas, hyper-parameters, names and versions ported unchanged from the pre-registered prototype",
}


# ---- registry -----------------------------------------------------------------------------------------

CHECKPOINTS_TRAJECTORY = "trajectory"
CHECKPOINTS_FINAL = "final"
CHECKPOINTS_PARAMETERS = "parameters"


@dataclass(frozen=True)
class Candidate:
    """One registered candidate: what it is, what it needs and how to compute it."""

    name: str
    version: str
    """name/N; a new formula or hyper-parameter is a new N, never an edit."""
    function: Callable[..., np.ndarray]
    """The pure function; called with keyword arguments named by `inputs`."""
    inputs: tuple[str, ...]
    """Argument names: val, train, val_fp, train_fp (losses) or theta_q_final, theta_final, theta_q_traj."""
    checkpoints: str
    """"trajectory" (every checkpoint of each input), "final" (the last row only) or "parameters" (control)."""
    formula: str
    family: str
    """"trajectory-only", "member vs held-out" or "control (no data)"."""
    orientation: str = ORIENTATION
    from_r_q: Callable[[np.ndarray], np.ndarray] | None = None
    """For the r_Q family: the candidate equals from_r_q(r_q_runs(inputs[0])), which lets
    `evaluate_candidates` compute r_Q once per input."""

    def describe(self) -> dict[str, Any]:
        """Describe the candidate for results and reports.

        Returns:
            dict[str, Any]: name, version, family, inputs, checkpoints, formula and orientation.
        """
        return {
            "name": self.name,
            "version": self.version,
            "family": self.family,
            "inputs": list(self.inputs),
            "checkpoints": self.checkpoints,
            "formula": self.formula,
            "orientation": self.orientation,
        }


_T, _F, _P = CHECKPOINTS_TRAJECTORY, CHECKPOINTS_FINAL, CHECKPOINTS_PARAMETERS

CANDIDATES: dict[str, Candidate] = {
    c.name: c
    for c in [
        Candidate(
            "rq_published",
            "rq_published/1",
            rq_published,
            ("val",),
            _T,
            "r_Q = 1/2 / max_k sigma2_k/delta_k^2 (Alg. 2, val losses, merged points, ddof 1)",
            FAMILY_TRAJECTORY,
            from_r_q=from_r_q_identity,
        ),
        Candidate(
            "rq_reciprocal_neg",
            "rq_reciprocal_neg/1",
            rq_reciprocal_neg,
            ("val",),
            _T,
            "-1/(2 r_Q) = -max_k sigma2_k/delta_k^2",
            FAMILY_TRAJECTORY,
            from_r_q=from_r_q_neg_half_reciprocal,
        ),
        Candidate(
            "rq_reciprocal_flip",
            "rq_reciprocal_flip/1",
            rq_reciprocal_flip,
            ("val",),
            _T,
            "+1/(2 r_Q) = +max_k sigma2_k/delta_k^2 (sign-corrected)",
            FAMILY_TRAJECTORY,
            from_r_q=from_r_q_half_reciprocal,
        ),
        Candidate(
            "rq_negated",
            "rq_negated/1",
            rq_negated,
            ("val",),
            _T,
            "-r_Q (sign-corrected)",
            FAMILY_TRAJECTORY,
            from_r_q=from_r_q_negate,
        ),
        Candidate(
            "rq_train",
            "rq_train/1",
            rq_train,
            ("train",),
            _T,
            "r_Q on training-sample losses",
            FAMILY_TRAJECTORY,
            from_r_q=from_r_q_identity,
        ),
        Candidate(
            "gap_std_final",
            "gap_std_final/1",
            gap_std_final,
            ("val", "train"),
            _F,
            "-(mean L_val - mean L_tr)/s_pooled at the final checkpoint",
            FAMILY_GAP,
        ),
        Candidate(
            "gap_std_ratio_fp",
            "gap_std_ratio_fp/1",
            gap_std_ratio_fp,
            ("val", "train", "val_fp", "train_fp"),
            _F,
            "-d_Q/d_FP at the final checkpoint (nan if d_FP <= 0)",
            FAMILY_GAP,
        ),
        Candidate(
            "gap_std_traj",
            "gap_std_traj/1",
            gap_std_traj,
            ("val", "train"),
            _T,
            "-(1/K) sum_k d_k over all K checkpoints",
            FAMILY_GAP,
        ),
        Candidate(
            "yeom_01",
            "yeom_01/1",
            yeom_01,
            ("val", "train"),
            _F,
            "1 - (err_val - err_tr), err = mean 1[L > ln 2], final checkpoint",
            FAMILY_GAP,
        ),
        Candidate(
            "yeom_ce_clip",
            "yeom_ce_clip/1",
            yeom_ce_clip,
            ("val", "train"),
            _F,
            "1 - (mean min(L_val,B) - mean min(L_tr,B))/B, B = ln 100, final checkpoint",
            FAMILY_GAP,
        ),
        Candidate(
            "ks_loss",
            "ks_loss/1",
            ks_loss,
            ("val", "train"),
            _F,
            "1 - sup_t |F_tr(t) - F_val(t)| of final-checkpoint losses",
            FAMILY_GAP,
        ),
        Candidate(
            "auc_loss",
            "auc_loss/1",
            auc_loss,
            ("val", "train"),
            _F,
            "2 - 2 P(L_val > L_tr) (ties 1/2), final checkpoint",
            FAMILY_GAP,
        ),
        Candidate(
            "tv_gauss_margin",
            "tv_gauss_margin/1",
            tv_gauss_margin,
            ("val", "train"),
            _F,
            "1 - TV(N(mu_tr,s_tr^2), N(mu_val,s_val^2)) of phi = -log(expm1(L)), final checkpoint",
            FAMILY_GAP,
        ),
        Candidate(
            "qdistortion_angle",
            "qdistortion_angle/1",
            qdistortion_angle,
            ("theta_q_final", "theta_final"),
            _P,
            "1 - cos(Q(theta_T), theta_T)  [CONTROL, data-free]",
            FAMILY_CONTROL,
        ),
        Candidate(
            "qflip_late",
            "qflip_late/1",
            qflip_late,
            ("theta_q_traj",),
            _P,
            "-mean_{last 10 pairs} frac(Q(theta_k) != Q(theta_k-1))  [CONTROL, trajectory-only]",
            FAMILY_CONTROL,
        ),
        Candidate(
            "heldout_loss_control",
            "heldout_loss_control/1",
            heldout_loss_control,
            ("val",),
            _F,
            "mean L_val at the final checkpoint  [CONTROL, damage; added after the real-model run]",
            FAMILY_DAMAGE,
        ),
    ]
}
"""The pre-registered candidates, in the order of the tables (docs/science.md section 8)."""


def evaluate_candidates(inputs: Mapping[str, Any], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Evaluate candidates on one set of inputs.

    Candidates of the r_Q family share one `r_q_runs` per input array; the result equals calling each function.

    Args:
        inputs (Mapping[str, Any]): arrays named as in `Candidate.inputs`, all with the same leading batch shape.
        names (Iterable[str] | None): the candidates (default: all of `CANDIDATES`).
    Returns:
        dict[str, np.ndarray]: {name: values [...]}, higher = more secure.
    """
    names = list(CANDIDATES) if names is None else list(names)
    r_q_cache: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    for name in names:
        c = CANDIDATES[name]
        if c.from_r_q is not None:
            key = c.inputs[0]
            if key not in r_q_cache:
                r_q_cache[key] = r_q_runs(inputs[key])
            out[name] = c.from_r_q(r_q_cache[key])
        else:
            out[name] = np.asarray(c.function(**{a: inputs[a] for a in c.inputs}), dtype=np.float64)
    return out


REASON_PARAMETERS = "needs the model parameters (a data-free control): computable on the synthetic protocol only"
REASON_NAN = "the formula is undefined for this run (nan), e.g. r_Q with fewer than 2 distinct points or d_FP <= 0"
"""Why a candidate is nan for a run (`llmaudit.analyze.candidates_table`)."""

VALIDATION_FILE = Path(__file__).with_name("indicator_validation.json")


def validation_registry() -> dict[str, Any]:
    """Read the recorded validation of every candidate, shipped with llmaudit.

    The file is written by `llmaudit validate indicators`.

    Returns:
        dict[str, Any]: the status of each candidate (passed / failed / not validated) with the numbers behind it.
    """
    return json.loads(VALIDATION_FILE.read_text(encoding="utf-8"))


def validation_of(name: str) -> dict[str, Any]:
    """Read the recorded validation of one candidate.

    Args:
        name (str): the candidate's name.
    Returns:
        dict[str, Any]: its entry, or {"status": "not validated", "why": ...} when none is recorded.
    """
    entry = validation_registry()["candidates"].get(name)
    return entry or {"status": "not validated", "why": "no recorded validation"}


__all__ = [
    "CANDIDATES",
    "CONTROL_FAMILIES",
    "Candidate",
    "FAMILIES",
    "ORIENTATION",
    "PREREGISTRATION",
    "REASON_NAN",
    "REASON_PARAMETERS",
    "VALIDATION_FILE",
    "evaluate_candidates",
    "validation_of",
    "validation_registry",
    "DDOF",
    "YEOM01_THRESHOLD",
    "YEOM_CE_BOUND",
    "MARGIN_LOSS_CLIP",
    "TV_GRID",
    "QFLIP_LAST",
    "r_q_runs",
    "rq_published",
    "rq_reciprocal_neg",
    "rq_reciprocal_flip",
    "rq_negated",
    "rq_train",
    "std_gap",
    "gap_std_final",
    "gap_std_ratio_fp",
    "gap_std_traj",
    "yeom_01",
    "yeom_ce_clip",
    "ks_loss",
    "auc_loss",
    "gauss_tv",
    "tv_gauss_margin",
    "qdistortion_angle",
    "qflip_late",
    "heldout_loss_control",
]
