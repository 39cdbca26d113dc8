"""RMIA, the robust membership inference attack of Zarifzadeh et al. (ICML 2024), on per-text losses
(docs/science.md section 4).

For a target model theta, a text x and population texts z that no model trained on,

    LR(x, z) = [p(x | theta) / p(x)] / [p(z | theta) / p(z)]      score(x) = share of z with LR(x, z) > gamma

p(x | theta) = exp(-L(x)), the geometric-mean token probability of the text under theta, and p(x) its
marginal over reference models: online, the mean of the means over the references that trained on x and
those that did not; offline (OUT references only), (1 + a) / 2 * mean_out(x) + (1 - a) / 2, the linear
approximation of the reference implementation (privacytrustlab/ml_privacy_meter).
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score

A_GRID = tuple(round(0.1 * i, 1) for i in range(11))
"""The offline coefficients `tune_offline_a` tries, as the reference implementation does (0, 0.1, .., 1)."""

DEFAULT_A = 0.3
"""The reference implementation's default `offline_a`, used where no paired reference model can tune it."""

GAMMA = 1.0
"""The reference implementation's threshold on the pairwise likelihood ratio."""


def text_probability(loss) -> np.ndarray:
    """Compute p(x | theta) = exp(-L(x)), the geometric-mean token probability, in (0, 1].

    Args:
        loss (np.ndarray): mean token losses L in nats, any shape.
    Returns:
        np.ndarray: the probabilities, same shape.
    """
    return np.exp(-np.asarray(loss, dtype=np.float64))


def offline_marginal(p_refs, out_mask, a: float) -> np.ndarray:
    """Compute p(x) from OUT references only: (1 + a) / 2 * mean_out(x) + (1 - a) / 2.

    It is (p_out + p_in) / 2 with the unseen IN-probability taken as p_in = a * p_out + (1 - a): training moves p
    toward 1, not at all for a = 1 (p(x) = mean_out), all the way for a = 0 ((1 + mean_out) / 2).

    Args:
        p_refs (np.ndarray): [R, n] probabilities under R reference models.
        out_mask (np.ndarray): [R, n] bool, True where reference r did not train on text j.
        a (float): the offline coefficient, in [0, 1].
    Returns:
        np.ndarray: [n] marginals, NaN where a text has no OUT reference.
    Raises:
        ValueError: when a is outside [0, 1].
    """
    if not 0 <= a <= 1:
        raise ValueError(f"a must lie in [0, 1]; got {a}.")
    p_refs, out_mask = np.atleast_2d(np.asarray(p_refs, dtype=np.float64)), np.atleast_2d(np.asarray(out_mask, bool))
    n_out = out_mask.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_out = np.where(n_out > 0, np.where(out_mask, p_refs, 0.0).sum(0) / n_out, np.nan)
    return (1 + a) / 2 * mean_out + (1 - a) / 2


def online_marginal(p_refs, in_mask, out_mask=None) -> np.ndarray:
    """Compute p(x) from IN and OUT references: the mean of mean_in(x) and mean_out(x).

    The mean of the two means is a balanced marginal even when the counts differ.

    Args:
        p_refs (np.ndarray): [R, n] probabilities under R reference models.
        in_mask (np.ndarray): [R, n] bool, True where reference r trained on text j.
        out_mask (np.ndarray | None): [R, n] the OUT references (default: every reference that is not IN).
    Returns:
        np.ndarray: [n] marginals, NaN where a text has no IN or no OUT reference.
    """
    p_refs, in_mask = np.atleast_2d(np.asarray(p_refs, dtype=np.float64)), np.atleast_2d(np.asarray(in_mask, bool))
    out_mask = ~in_mask if out_mask is None else np.atleast_2d(np.asarray(out_mask, bool))
    n_in, n_out = in_mask.sum(0), out_mask.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_in = np.where(n_in > 0, np.where(in_mask, p_refs, 0.0).sum(0) / n_in, np.nan)
        mean_out = np.where(n_out > 0, np.where(out_mask, p_refs, 0.0).sum(0) / n_out, np.nan)
    return (mean_in + mean_out) / 2


def rmia_score(p_x, marginal_x, p_z, marginal_z, gamma: float = GAMMA) -> np.ndarray:
    """Score RMIA: the share of population texts z with LR(x, z) > gamma, computed in logs.

    With gamma = 1 and one population, the score is the rank of p(x | theta) / p(x) among the population's ratios:
    within one target it orders texts as the ratio itself, and the population makes the scores of different targets
    comparable (a per-target quantile).

    Args:
        p_x (np.ndarray): [n] the target's probability of each text.
        marginal_x (np.ndarray): [n] each text's marginal p(x).
        p_z (np.ndarray): [Z] the target's probability of each population text.
        marginal_z (np.ndarray): [Z] their marginals; texts with a NaN marginal are left out.
        gamma (float): the threshold on the likelihood ratio.
    Returns:
        np.ndarray: [n] scores in [0, 1], NaN where x's marginal is NaN.
    Raises:
        ValueError: when no population text has a finite likelihood ratio.
    """
    log_x = np.log(np.asarray(p_x, dtype=np.float64)) - np.log(np.asarray(marginal_x, dtype=np.float64))
    log_z = np.log(np.asarray(p_z, dtype=np.float64)) - np.log(np.asarray(marginal_z, dtype=np.float64))
    log_z = log_z[np.isfinite(log_z)]
    if log_z.size == 0:
        raise ValueError("RMIA needs at least one population text with a finite likelihood ratio.")
    # LR(x, z) > gamma  <=>  log_x - log_z > log(gamma): count the z below log_x - log(gamma)
    sorted_z = np.sort(log_z)
    below = np.searchsorted(sorted_z, log_x - np.log(gamma), side="left")
    return np.where(np.isfinite(log_x), below / log_z.size, np.nan)


def tune_offline_a(
    p_paired_x, p_refs_x, out_refs_x, paired_keep, p_paired_z, p_refs_z, grid: tuple[float, ...] = A_GRID
) -> tuple[float, float]:
    """Pick the offline coefficient a as the reference implementation does.

    A PAIRED reference model (whose training set the attacker knows) is attacked with the remaining references, and
    the a of the highest AUROC is kept (the first on ties).

    Args:
        p_paired_x (np.ndarray): [n] the paired model's probabilities of the texts.
        p_refs_x (np.ndarray): [R, n] the remaining references' probabilities.
        out_refs_x (np.ndarray): [R, n] bool, where each remaining reference is OUT.
        paired_keep (np.ndarray): [n] bool, the paired model's membership.
        p_paired_z (np.ndarray): [Z] the paired model's probabilities of the population texts.
        p_refs_z (np.ndarray): [R, Z] the remaining references' (population texts are OUT everywhere).
        grid (tuple[float, ...]): the coefficients tried.
    Returns:
        tuple[float, float]: (a, its AUROC); (DEFAULT_A, NaN) when the paired model cannot be attacked (no remaining
        reference, or one class only).
    """
    p_refs_x = np.atleast_2d(np.asarray(p_refs_x, dtype=np.float64))
    keep = np.asarray(paired_keep, bool)
    if p_refs_x.shape[0] == 0 or keep.all() or not keep.any():
        return DEFAULT_A, float("nan")
    best_a, best_auc = DEFAULT_A, -np.inf
    z_out = np.ones(np.shape(p_refs_z), bool)
    for a in grid:
        scores = rmia_score(
            p_paired_x, offline_marginal(p_refs_x, out_refs_x, a), p_paired_z, offline_marginal(p_refs_z, z_out, a)
        )
        usable = np.isfinite(scores)
        if not (keep[usable].any() and (~keep[usable]).any()):
            continue
        auc = roc_auc_score(keep[usable], scores[usable])
        if auc > best_auc:
            best_a, best_auc = a, auc
    return (best_a, float(best_auc)) if np.isfinite(best_auc) else (DEFAULT_A, float("nan"))
