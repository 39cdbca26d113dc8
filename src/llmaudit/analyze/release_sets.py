"""Release sets: several files of one fine-tune published together (bf16 plus GGUF types, several GGUF types),
judged as one release (docs/science.md section 14).

An attacker who holds every file of a set holds several observations of the same fine-tuned model, each through
its own quantization. For each attack of the suite the set gets three combined scores of a record, built from the
per-file scores z_1..z_k the release decision reads (`QuantizerEvidence.scores`). With several runs those are
per-sample calibrated scores meant to be N(0, 1) on non-members; a counting attack's (EZ-MIA, WBC) have heavier
tails, and the maximum over files would multiply the excess, so each file's scores are first put on the normal
scale of its own pooled non-member rows (`rank_normal`: the marginals of a Gaussian copula). With one run the raw
scores are standardised over each target's records instead (no membership read; that mode's thresholds are
empirical). Under non-membership the files' scores are then modelled as N(0, S), S their covariance on the
non-member rows (the identity without enough of them), and each combination is put back on the normal scale under
that model, so the decision's analytic threshold keeps its meaning:
- mean:<attack>   1'z / sqrt(1'S1), the files' mean standardised;
- joint:<attack>  w'z / sqrt(w'Sw), w >= 0 summing to 1 of least variance w'Sw: the likelihood ratio of a record
                  whose files are observations N(mu 1, S) of one model, a member shifting every file alike (the
                  generalised least-squares mean, weights kept non-negative so that two nearly identical files,
                  bf16 and Q8_0, are not played off against each other);
- max:<attack>    the strongest file for this record, t = max_f z_f / s_f (s_f^2 = S_ff), as the normal score of
                  its Sidak tail 1 - Phi(t)^k: exact for independent files and never below the true tail of the
                  maximum for positively correlated ones (Slepian's inequality; the files of one model are), so
                  the analytic threshold is conservative for it.
A combination of calibrated scores is not calibrated once more per sample: the second Student-t correction costs
most of a single file's power in simulation (docs/science.md section 14). Beside the combinations
the set keeps every file's own attacks (`<file>:<attack>`): an attacker holding the set may use any one file alone.

The set is judged by the release rule itself (`llmaudit.analyze.decision.decide.decide_one`: the strongest attack
chosen by cross-fitting, FAIL / PASS / INCONCLUSIVE; the empirical threshold of the pooled non-members still
guards FAIL wherever the Gaussian model is off), and compared with its best single file: the paired difference of
the cross-fitted strongest-attack TPRs, set minus the highest of its files' own, the maximum over the files retaken
in every resample (the same records, folds and resamples). The best single file named is the one with the highest
observed TPR; retaking the maximum in every resample biases the difference DOWN (the best of k noisy estimates
lies above the best file's true TPR), so "MORE" is conservative.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import optimize, special, stats

from llmaudit.analyze.decision.bounds import percentile_interval
from llmaudit.analyze.decision.decide import OwnDecision, QuantizerEvidence, decide_one
from llmaudit.analyze.decision.models import Estimate, QuantizerDecision
from llmaudit.analyze.decision.rule import DecisionSettings
from llmaudit.common.errors import did_you_mean
from llmaudit.config import RecipeError

COMBINATIONS = {
    "mean": "1'z / sqrt(1'S1): the mean of the files' scores, standardised under N(0, S) (S: the files' covariance "
    "on the non-member rows)",
    "joint": "w'z / sqrt(w'Sw), w >= 0 summing to 1 of least variance: the Gaussian likelihood ratio of a shift "
    "common to every file",
    "max": "the strongest file for the record, as the normal score of the Sidak tail of the maximum (exact for "
    "independent files, conservative for positively correlated ones)",
}


def set_name(files: Sequence[str]) -> str:
    """Name a release set in results: its files joined by '+'.

    Args:
        files (Sequence[str]): the set's quantizers.
    Returns:
        str: the name.
    """
    return "+".join(files)


def check_release_sets(sets: Sequence[Sequence[str]], scored: Sequence[str]) -> None:
    """Refuse a release set that names a quantizer the store has not scored (report.release_sets).

    Args:
        sets (Sequence[Sequence[str]]): the release sets, each a list of quantizers.
        scored (Sequence[str]): the quantizers the store scored.
    Raises:
        RecipeError: naming the set, the name, the closest scored quantizer and the scored ones.
    """
    for files in sets:
        for name in files:
            if name not in scored:
                raise RecipeError(
                    f"report.release_sets: {name!r} in {list(files)} is not a scored quantizer"
                    f"{did_you_mean(name, list(scored))}; scored: {', '.join(scored)}"
                )


def file_covariance(z: np.ndarray, nonmember: np.ndarray) -> np.ndarray:
    """Estimate the covariance (ddof 1) of the files' scores over the non-member cells.

    Args:
        z (np.ndarray): [k, M, N] the files' scores.
        nonmember (np.ndarray): [M, N] True on the non-member cells; only cells where every file is finite count.
    Returns:
        np.ndarray: [k, k] the covariance; the identity (the calibration's nominal N(0, 1), uncorrelated) with fewer
        than k + 2 such cells.
    """
    k = z.shape[0]
    ok = nonmember & np.isfinite(z).all(axis=0)
    if ok.sum() < k + 2:
        return np.eye(k)
    return np.atleast_2d(np.cov(z[:, ok]))


def joint_weights(cov: np.ndarray) -> np.ndarray:
    """Find the weights w >= 0 summing to 1 that minimise w' cov w (SLSQP; a ridge of 1e-9 x trace keeps it defined).

    Args:
        cov (np.ndarray): [k, k] the files' covariance.
    Returns:
        np.ndarray: [k] the weights.
    """
    k = cov.shape[0]
    if k == 1:
        return np.ones(1)
    cov = cov + 1e-9 * max(float(np.trace(cov)), 1e-12) * np.eye(k)
    result = optimize.minimize(
        lambda w: w @ cov @ w,
        np.full(k, 1.0 / k),
        jac=lambda w: 2 * cov @ w,
        bounds=[(0.0, 1.0)] * k,
        constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0}],
        method="SLSQP",
    )
    w = np.clip(result.x, 0.0, None)
    return w / w.sum()


def standardised(raw: np.ndarray) -> np.ndarray:
    """Standardise each target's scores over its finite records (no membership read).

    Args:
        raw (np.ndarray): [M, N] raw scores, NaN where not scored.
    Returns:
        np.ndarray: [M, N] scores minus their target's mean, over its sd (sd 0: not divided).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        mu = np.nanmean(raw, axis=1, keepdims=True)
        sd = np.nanstd(raw, axis=1, keepdims=True)
    return (raw - mu) / np.where(sd > 0, sd, 1.0)


def rank_normal(scores: np.ndarray, nonmember: np.ndarray) -> np.ndarray:
    """Put scores on the normal scale of their own non-member rows.

    Each value's mid-rank among the finite non-member values (ties share it) maps to Phi^-1 of its share, linearly
    between distinct values; beyond the lowest or highest non-member value the map continues with slope 1 / sd of
    the non-members (monotone, never capped). A file whose non-members are not N(0, 1) (a counting attack's
    calibrated scores have heavier tails) then is N(0, 1) on its non-members exactly, which the combinations assume.

    Args:
        scores (np.ndarray): [M, N] scores, NaN where not scored.
        nonmember (np.ndarray): [M, N] True on the non-member cells.
    Returns:
        np.ndarray: [M, N] the scores on the normal scale; as they are with fewer than 2 distinct non-member values.
    """
    values = scores[nonmember & np.isfinite(scores)]
    distinct, counts = np.unique(values, return_counts=True)
    if distinct.size < 2:
        return scores
    below = np.cumsum(counts) - counts
    normal = special.ndtri((below + counts / 2) / values.size)
    slope = 1.0 / max(float(values.std()), 1e-12)
    out = np.interp(scores, distinct, normal)
    out = np.where(scores > distinct[-1], normal[-1] + (scores - distinct[-1]) * slope, out)
    out = np.where(scores < distinct[0], normal[0] + (scores - distinct[0]) * slope, out)
    return np.where(np.isfinite(scores), out, np.nan)


def _norm_of(cov: np.ndarray, w: np.ndarray) -> float:
    return float(np.sqrt(max(float(w @ cov @ w), 1e-300)))


def sidak_log_tail(t: np.ndarray, k: int) -> np.ndarray:
    """Compute log(1 - Phi(t)^k), the tail of the largest of k independent standard normals, for every t.

    In logs of the normal tail where it is tiny (log k + log P[N(0, 1) > t] within 1e-13 there, no underflow far
    out), and at most log(1 - 1e-16) (a finite floor where every file lies far below 0).

    Args:
        t (np.ndarray): the maxima, any shape.
        k (int): the number of files.
    Returns:
        np.ndarray: the log tails, same shape.
    """
    log_sf = stats.norm.logsf(t)
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.log(-np.expm1(k * np.log1p(-np.exp(log_sf))))
    return np.minimum(np.where(log_sf < -30, np.log(k) + log_sf, exact), -1e-16)


def combined_scores(z: np.ndarray, keep: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Combine one attack's per-file scores into the set's mean, joint and max scores (module docstring).

    Args:
        z (np.ndarray): [k, M, N] the files' scores on the normal scale.
        keep (np.ndarray): [M, N] membership.
    Returns:
        tuple[dict[str, np.ndarray], np.ndarray]: ({combination: [M, N] on the normal scale, NaN where a file did
        not score the cell}, the joint weights [k]).
    """
    cov = file_covariance(z, ~keep)
    ones, w = np.ones(z.shape[0]), joint_weights(cov)
    sd = np.sqrt(np.clip(np.diag(cov), 1e-300, None))
    with np.errstate(invalid="ignore", divide="ignore"):
        strongest = -special.ndtri_exp(sidak_log_tail(np.max(z / sd[:, None, None], axis=0), z.shape[0]))
    combined = {
        "mean": np.tensordot(ones, z, axes=1) / _norm_of(cov, ones),
        "joint": np.tensordot(w, z, axes=1) / _norm_of(cov, w),
        "max": np.where(np.isfinite(z).all(axis=0), strongest, np.nan),
    }
    return combined, w


class SetNotComparable(ValueError):
    """The files of a release set were not attacked on the same target models in the same mode."""


def _common(evidence: Mapping[str, QuantizerEvidence], files: Sequence[str]) -> list[QuantizerEvidence]:
    """The files' evidence on the records every file scored (in the first file's order), checked to be comparable."""
    missing = [f for f in files if f not in evidence]
    if missing:
        raise ValueError(f"release set {list(files)}: no evidence of {missing}; known: {sorted(evidence)}")
    shared = set.intersection(*(set(evidence[f].sample_ids) for f in files))
    common = [x for x in evidence[files[0]].sample_ids if x in shared]
    out = [evidence[f].restricted(common) for f in files]
    if len({e.mode for e in out}) > 1 or any(not np.array_equal(e.keep, out[0].keep) for e in out):
        raise SetNotComparable(
            f"release set {list(files)}: the files were not attacked on the same target models and mode"
        )
    return out


def release_set_evidence(
    evidence: Mapping[str, QuantizerEvidence], files: Sequence[str]
) -> tuple[QuantizerEvidence, dict[str, dict[str, float]]]:
    """Build a release set's evidence: the combined scores of every attack all its files scored, and each file's own.

    The evidence is on the records every file scored (module docstring).

    Args:
        evidence (Mapping[str, QuantizerEvidence]): {quantizer: its evidence} (from the attack evaluation).
        files (Sequence[str]): the set's quantizers (at least two, none repeated).
    Returns:
        tuple[QuantizerEvidence, dict[str, dict[str, float]]]: the set's evidence and {attack: {file: joint weight}}.
    Raises:
        ValueError: fewer than two files, a file without evidence, files attacked on other targets or modes
            (`SetNotComparable`).
    """
    if len(set(files)) < 2 or len(set(files)) != len(files):
        raise ValueError(f"a release set needs at least two different files, none repeated; got {list(files)}")
    parts = _common(evidence, files)
    keep, mode = parts[0].keep, parts[0].mode
    attacks = [a for a in parts[0].scores if all(a in p.scores for p in parts)]
    scores: dict[str, np.ndarray] = {}
    weights: dict[str, dict[str, float]] = {}
    for a in attacks:
        per_file = rank_normal if mode == "calibrated" else lambda s, _: standardised(s)
        z = np.stack([per_file(p.scores[a].astype(np.float64), ~keep) for p in parts])
        combined, w = combined_scores(z.astype(np.float64), keep)
        weights[a] = {f: float(x) for f, x in zip(files, w)}
        scores |= {f"{kind}:{a}": c.astype(np.float32) for kind, c in combined.items()}
    for f, p in zip(files, parts):
        scores |= {f"{f}:{a}": s for a, s in p.scores.items()}
    unjudged = {f"{f}:{a}": why for f, p in zip(files, parts) for a, why in p.unjudged.items()}
    ev = QuantizerEvidence(set_name(files), mode, list(parts[0].sample_ids), keep, scores, unjudged)
    return ev, weights


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


SetDirection = Literal["MORE", "LESS", "CANNOT TELL", "NOT MEASURED"]


class ReleaseSetDecision(_Model):
    """A release set judged by the release rule, and compared with its best single file."""

    name: str
    files: list[str]
    decision: QuantizerDecision
    combinations: dict[str, str]
    joint_weights: dict[str, dict[str, float]]
    single_files: dict[str, Estimate]
    """Each file's cross-fitted strongest-attack TPR on the set's records (the set's resamples)."""
    best_single_file: str | None
    versus_best_single: Estimate
    """The set's strongest-attack TPR minus the highest of its files' (the maximum retaken in every resample)."""
    direction: SetDirection
    sentence: str


def _tpr(own: OwnDecision) -> Estimate:
    return own.decision.strongest.tpr if own.decision.strongest is not None else Estimate(value=None)


def _versus(set_own: OwnDecision, singles: dict[str, OwnDecision], s: DecisionSettings) -> tuple[Estimate, str | None]:
    """(set minus the best single file, paired, with its [alpha, 1 - alpha] percentile interval; the best file)."""
    observed = {f: o.resampled[0] for f, o in singles.items() if np.isfinite(o.resampled[0])}
    best = max(observed, key=observed.get) if observed else None  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample where no file has an estimate: NaN
        top = np.nanmax(np.stack([o.resampled for o in singles.values()]), axis=0)
    d = set_own.resampled - top
    lo, hi = percentile_interval(d[1:], s.alpha, 1 - s.alpha)
    finite = [float(x) if np.isfinite(x) else None for x in (d[0], lo, hi)]
    method = "paired percentile bootstrap; the best single file retaken in every resample (conservative for MORE)"
    return Estimate(value=finite[0], low=finite[1], high=finite[2], confidence=1 - 2 * s.alpha, method=method), best


def _sentence(files: Sequence[str], d: Estimate, direction: str, best: str | None) -> str:
    together = f"publishing {', '.join(files)} together"
    if direction == "NOT MEASURED":
        return f"{together}: not compared with its best single file (no strongest-attack estimate on both)"
    span = f"{d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}]"
    if direction == "MORE":
        return f"{together} leaks MORE than the strongest of them alone ({best}): {span}"
    if direction == "LESS":
        return f"{together} leaks LESS than the strongest of them alone ({best}): {span} (unexpected: check the data)"
    return f"{together}: the data cannot tell it from the strongest of them alone ({best}): {span}"


def decide_release_set(
    evidence: Mapping[str, QuantizerEvidence], files: Sequence[str], s: DecisionSettings
) -> ReleaseSetDecision:
    """Judge a release set by the release rule and compare it with its best single file.

    Each file is decided on the set's records for the comparison (`release_set_evidence`, `decide_one`).

    Args:
        evidence (Mapping[str, QuantizerEvidence]): {quantizer: its evidence}.
        files (Sequence[str]): the set's quantizers.
        s (DecisionSettings): the release rule's settings.
    Returns:
        ReleaseSetDecision: the set's decision, each file's strongest-attack TPR and the paired difference with the
        best single file.
    Raises:
        ValueError: as `release_set_evidence`, or settings out of range.
    """
    s.check()
    set_ev, weights = release_set_evidence(evidence, files)
    set_own = decide_one(set_ev, s)
    singles = {f: decide_one(evidence[f].restricted(set_ev.sample_ids), s) for f in files}
    d, best = _versus(set_own, singles, s)
    direction: SetDirection = "NOT MEASURED"
    if d.low is not None and d.high is not None and d.value is not None:
        direction = "MORE" if d.low > 0 else "LESS" if d.high < 0 else "CANNOT TELL"
    return ReleaseSetDecision(
        name=set_ev.quantizer,
        files=list(files),
        decision=set_own.decision,
        combinations=COMBINATIONS,
        joint_weights=weights,
        single_files={f: _tpr(o) for f, o in singles.items()},
        best_single_file=best,
        versus_best_single=d,
        direction=direction,
        sentence=_sentence(files, d, direction, best),
    )
