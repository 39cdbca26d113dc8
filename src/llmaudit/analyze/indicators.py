"""Candidate attack-free indicators beside the published r_Q (docs/science.md section 8).

Every candidate is a PURE numpy function of ONE training run's per-sample losses (two labelled controls:
of its parameters) returning ONE number per run, oriented so that

    HIGHER = MORE SECURE  (predicts a HIGHER MIS / a LOWER attack AUROC).

No candidate runs an attack or trains a shadow model: each uses only what a model owner has, the training
trajectory's checkpoints, the training samples and held-out samples, per quantizer. The formulas and
hyper-parameters were fixed (pre-registered) before any candidate was compared with the baseline MIS or
with a real model's attacks; they are ported here unchanged and each carries a version string. Changing a
formula or a hyper-parameter means a new version, never an edit of an old one.

The formulas, their notation and hyper-parameters are in `llmaudit.analyze.indicator_formulas`
(re-exported here, so `llmaudit.analyze.indicators.gap_std_final` keeps working).

The published r_Q is `llmaudit.analyze.indicator.r_q` (docs/science.md section 2), called run by run:
`rq_published` gives exactly its numbers. `CANDIDATES` is the registry (name -> `Candidate`);
`evaluate_candidates` evaluates several on one set of inputs (sharing one r_Q computation per input),
`candidates_from_table` scores them from a loss table (`llmaudit.store.losstable`).

Aggregation over runs (not part of the functions): per quantizer, the mean over the runs with a finite
value and a percentile bootstrap interval over those runs; non-finite runs are counted, never dropped
silently.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.analyze.indicator_formulas import (
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
from llmaudit.common.stats import bootstrap_mean_interval, finite_mean
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN

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
    """Every candidate in `names` (default: all) on one set of inputs: {name: values [...]}.

    inputs: arrays named as in `Candidate.inputs` (all with the same leading batch shape). Candidates of
    the r_Q family share one `r_q_runs` per input array; the result equals calling each function (tested)."""
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


# ---- from a loss table -------------------------------------------------------------------------------------

REASON_PARAMETERS = "needs the model parameters (a data-free control): computable on the synthetic protocol only"
REASON_NAN = "the formula is undefined for this run (nan), e.g. r_Q with fewer than 2 distinct points or d_FP <= 0"


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
    """Every candidate for every (run, quantizer) of a loss table, aggregated per quantizer.

    Mapping (fixed with the pre-registration): held-out = the rows of split "val" along the run's trajectory
    (checkpoints ascending, the last = the released model); training samples = the rows of split "pool" with
    member = True for that run, at every checkpoint where such rows exist; full precision = the
    `reference_quantizer` (default: the table's full-precision quantizer, `full_precision_reference`) of
    the same run. Rows of the base model (run = -1) are skipped; a checkpoint that misses a sample is
    dropped (counted). A candidate that needs what the table lacks is nan with the reason, never
    approximated: in llmaudit's run stores the pool is scored at each run's final checkpoint only, so the
    candidates that need training-sample losses at every checkpoint (rq_train, gap_std_traj) are nan there,
    and the parameter controls are nan in every table.

    Per quantizer and candidate: mean over the runs with a finite value, percentile bootstrap interval of
    that mean over runs (`n_boot`, `seed`), and the counts of finite and non-finite runs. Returns a
    JSON-ready dict: protocol, reference_quantizer, runs, quantizers, candidates (description, computable,
    reason, per_quantizer) and per_run (values and reasons)."""
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


VALIDATION_FILE = Path(__file__).with_name("indicator_validation.json")


def validation_registry() -> dict[str, Any]:
    """The recorded validation of every candidate (status passed / failed / not validated, with the
    numbers behind it), shipped with llmaudit and written from `llmaudit validate indicators`."""
    return json.loads(VALIDATION_FILE.read_text(encoding="utf-8"))


def validation_of(name: str) -> dict[str, Any]:
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
    "candidates_from_table",
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
