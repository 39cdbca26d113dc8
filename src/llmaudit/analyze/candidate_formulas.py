"""The candidate attack-free indicators as pure numpy functions, with their pre-registered
hyper-parameters (docs/science.md section 8); the registry that names, versions and evaluates them is
`llmaudit.analyze.candidates`.

Every function takes ONE training run's per-sample losses (two labelled controls: its parameters) and
returns ONE number per run, oriented so that HIGHER = MORE SECURE.

Notation (losses in nats; every function accepts optional leading batch dimensions, [..., K, n] -> [...],
so it scores R runs at once; one run is the case without a batch dimension):

    val            [..., K, n_val]    losses of the K quantized checkpoints on held-out samples
    train          [..., K, n_train]  losses of the same checkpoints on the run's own training samples
    val_fp, train_fp                  the same for the full-precision (unquantized) checkpoints
    theta_q_final, theta_final [..., P]  flattened final parameters, quantized / unquantized (controls)
    theta_q_traj   [..., K, P]        quantized parameters along the trajectory (control)
    Rows are in trajectory order; the LAST row is the final (released) model, written T.
    d_k = (mean_j L_val[k, j] - mean_j L_train[k, j]) / s_pooled[k]     standardized gap (Cohen's d),
          s_pooled^2 = ((n_val - 1) s_val^2 + (n_train - 1) s_train^2) / (n_val + n_train - 2)

The published r_Q is `llmaudit.analyze.rq.r_q` (docs/science.md section 2), called run by run:
`rq_published` gives exactly its numbers.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.stats import rankdata

from llmaudit.analyze.rq import r_q as published_r_q

# ---- pre-registered hyper-parameters (docs/science.md section 8) -----------------------------------
DDOF = 1
"""Variance / standard-deviation convention everywhere."""
YEOM01_THRESHOLD = math.log(2.0)
"""0-1 loss of yeom_01: an error iff loss > ln 2 (probability of the true label below 1/2)."""
YEOM_CE_BOUND = math.log(100.0)
"""Bound B of yeom_ce_clip: cross-entropy clipped at ln 100 (probability floor 0.01)."""
MARGIN_LOSS_CLIP = (1e-6, 30.0)
"""Loss clip before the logit scaling phi = -log(expm1(L)) of tv_gauss_margin."""
TV_GRID = 4001
"""Grid points of the numerical Gaussian total variation."""
QFLIP_LAST = 10
"""qflip_late: the last 10 consecutive checkpoint pairs."""


def _f64(a: Any) -> np.ndarray:
    arr = np.asarray(a, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError("non-finite losses: a diverged quantized model cannot be scored")
    return arr


# ---- r_Q family ---------------------------------------------------------------------------------------


def r_q_runs(val: Any, *, ddof: int = DDOF) -> np.ndarray:
    """Compute the published r_Q (Algorithm 2, docs/science.md section 2) of each run.

    `llmaudit.analyze.rq.r_q` is applied run by run, so the numbers are exactly the published estimator's:
    identical rows merged (exact equality); 0.0 when a distinct point has the lowest mean, +inf when every sigma2
    is 0, NaN with fewer than 2 distinct points.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
        ddof (int): the variance convention.
    Returns:
        np.ndarray: [...] r_Q of each run.
    Raises:
        ValueError: on non-finite losses or fewer than 2 dimensions.
    """
    arr = _f64(val)
    if arr.ndim < 2:
        raise ValueError(f"losses must be [..., K checkpoints, n samples]; got shape {arr.shape}.")
    flat = arr.reshape(-1, *arr.shape[-2:])
    out = np.array([published_r_q(x, ddof=ddof) for x in flat], dtype=np.float64)
    return out.reshape(arr.shape[:-2])


def from_r_q_identity(r: np.ndarray) -> np.ndarray:
    """Orient r_Q as published (large r_Q = secure).

    Args:
        r (np.ndarray): r_Q per run.
    Returns:
        np.ndarray: r as float64.
    """
    return np.asarray(r, dtype=np.float64)


def from_r_q_negate(r: np.ndarray) -> np.ndarray:
    """Orient r_Q as the sign-corrected hypothesis, linear form: -r_Q.

    Args:
        r (np.ndarray): r_Q per run.
    Returns:
        np.ndarray: -r.
    """
    return -np.asarray(r, dtype=np.float64)


def from_r_q_neg_half_reciprocal(r: np.ndarray) -> np.ndarray:
    """Map r_Q to -1/(2 r_Q), the negated reciprocal.

    Args:
        r (np.ndarray): r_Q per run.
    Returns:
        np.ndarray: -0.5 / r; r = 0 gives -inf (non-finite, counted), NaN stays NaN.
    """
    r = np.asarray(r, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(np.isnan(r), np.nan, -0.5 / r)  # r = 0 -> -inf (non-finite, counted)


def from_r_q_half_reciprocal(r: np.ndarray) -> np.ndarray:
    """Map r_Q to +1/(2 r_Q), the reciprocal read as security.

    Args:
        r (np.ndarray): r_Q per run.
    Returns:
        np.ndarray: 0.5 / r; r = 0 gives +inf (non-finite, counted), NaN stays NaN.
    """
    r = np.asarray(r, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.where(np.isnan(r), np.nan, 0.5 / r)  # r = 0 -> +inf (non-finite, counted)


def rq_published(val: Any) -> np.ndarray:
    """Score r_Q on the held-out losses of the quantized checkpoints, published orientation.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure; equal to `llmaudit.analyze.rq.r_q` per run.
    """
    return from_r_q_identity(r_q_runs(val))


def rq_reciprocal_neg(val: Any) -> np.ndarray:
    """Score -1/(2 r_Q) = -max_k sigma2_k / delta_k^2, the negated reciprocal.

    Same orientation as the theory (large r_Q = secure) but a different average over runs than r_Q.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure; r_Q = 0 gives
        -inf (non-finite, counted), undefined r_Q NaN.
    """
    return from_r_q_neg_half_reciprocal(r_q_runs(val))


def rq_reciprocal_flip(val: Any) -> np.ndarray:
    """Score +1/(2 r_Q) = max_k sigma2_k / delta_k^2 read as security (small r_Q = secure).

    The sign-corrected hypothesis, reciprocal form.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure; r_Q = 0 gives
        +inf (non-finite, counted), undefined r_Q NaN.
    """
    return from_r_q_half_reciprocal(r_q_runs(val))


def rq_negated(val: Any) -> np.ndarray:
    """Score -r_Q: the sign-corrected hypothesis, linear form (its mean ranking is the published one reversed).

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    return from_r_q_negate(r_q_runs(val))


def rq_train(train: Any) -> np.ndarray:
    """Score r_Q on the run's training-sample losses instead of held-out ones; published orientation.

    Args:
        train (np.ndarray): [..., K, n_train] training-sample losses at every checkpoint, in nats.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    return from_r_q_identity(r_q_runs(train))


# ---- member vs held-out family ------------------------------------------------------------------------


def std_gap(val: Any, train: Any, *, ddof: int = DDOF) -> np.ndarray:
    """Compute the standardized gap d = (mean L_val - mean L_train) / pooled sd, per checkpoint.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints, in nats.
        ddof (int): the variance convention.
    Returns:
        np.ndarray: [..., K] d per checkpoint; with pooled sd 0, d = 0 if the means are equal, else +-inf.
    """
    v, t = _f64(val), _f64(train)
    nv, nt = v.shape[-1], t.shape[-1]
    pooled = np.sqrt(((nv - ddof) * v.var(-1, ddof=ddof) + (nt - ddof) * t.var(-1, ddof=ddof)) / (nv + nt - 2 * ddof))
    diff = v.mean(-1) - t.mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(
            pooled > 0,
            diff / np.where(pooled > 0, pooled, 1.0),
            np.where(diff == 0, 0.0, np.sign(diff) * np.inf),
        )


def gap_std_final(val: Any, train: Any) -> np.ndarray:
    """Score -d_T: minus Cohen's d of held-out vs training losses of the released (final) model.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    val, train = _f64(val), _f64(train)
    return -std_gap(val[..., -1:, :], train[..., -1:, :])[..., 0]


def gap_std_ratio_fp(val: Any, train: Any, val_fp: Any, train_fp: Any) -> np.ndarray:
    """Score -(d_T(Q) / d_T(FP)): the quantized final model's gap relative to the full-precision one's.

    The DIFFERENCE d_Q - d_FP is rank-equivalent to gap_std_final on a grid where all quantizers share the runs,
    so it is not a separate candidate.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
        val_fp (np.ndarray): [..., K, n_val] the same for the full-precision checkpoints.
        train_fp (np.ndarray): [..., K, n_train] the same for the full-precision checkpoints.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure; NaN when d_T(FP) <= 0 (no
        full-precision gap to scale by).
    """
    val, train, val_fp, train_fp = (_f64(a) for a in (val, train, val_fp, train_fp))
    dq = std_gap(val[..., -1:, :], train[..., -1:, :])[..., 0]
    df = std_gap(val_fp[..., -1:, :], train_fp[..., -1:, :])[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(df > 0, -dq / np.where(df > 0, df, 1.0), np.nan)


def gap_std_traj(val: Any, train: Any) -> np.ndarray:
    """Score -(1/K) sum_k d_k: the standardized gap averaged over all K checkpoints given.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints, in nats.
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints, in nats, at every
            checkpoint.
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    return -std_gap(val, train).mean(-1)


def yeom_01(val: Any, train: Any) -> np.ndarray:
    """Score 1 - (err_val - err_train) at the final checkpoint, err = mean 1[L > ln 2].

    [Yeom2018], Thm 2 with the 0-1 loss, B = 1: the bounded-loss adversary's advantage equals the generalisation
    gap.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    v, t = _f64(val)[..., -1, :], _f64(train)[..., -1, :]
    return 1.0 - ((v > YEOM01_THRESHOLD).mean(-1) - (t > YEOM01_THRESHOLD).mean(-1))


def yeom_ce_clip(val: Any, train: Any) -> np.ndarray:
    """Score 1 - (mean min(L_val, B) - mean min(L_train, B)) / B at the final checkpoint, B = ln 100.

    [Yeom2018], Thm 2 with cross-entropy clipped to [0, B].

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    v, t = _f64(val)[..., -1, :], _f64(train)[..., -1, :]
    b = YEOM_CE_BOUND
    return 1.0 - (np.minimum(v, b).mean(-1) - np.minimum(t, b).mean(-1)) / b


def ks_loss(val: Any, train: Any) -> np.ndarray:
    """Score 1 - KS(L_train, L_val) at the final checkpoint, KS = max_t |F_train(t) - F_val(t)| (ties exact).

    KS is the best balanced-accuracy advantage of a single loss threshold (in sample), so 1 - KS is the MIS of the
    best loss-threshold attack (MIS = 2 - 2 acc).

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    v, t = _f64(val)[..., -1, :], _f64(train)[..., -1, :]
    nv, nt = v.shape[-1], t.shape[-1]
    allv = np.concatenate([t, v], -1)
    lab = np.concatenate([np.ones_like(t), np.zeros_like(v)], -1)
    o = np.argsort(allv, -1, kind="stable")
    s = np.take_along_axis(allv, o, -1)
    lab = np.take_along_axis(lab, o, -1)
    ft = np.cumsum(lab, -1) / nt
    fv = np.cumsum(1 - lab, -1) / nv
    # the empirical CDFs are compared only at the end of each group of tied values
    last = np.concatenate([s[..., 1:] != s[..., :-1], np.ones_like(s[..., :1], dtype=bool)], -1)
    return 1.0 - np.where(last, np.abs(ft - fv), 0.0).max(-1)


def auc_loss(val: Any, train: Any) -> np.ndarray:
    """Score 2 - 2 AUC at the final checkpoint, AUC = P(L_val > L_train) + P(L_val = L_train) / 2.

    The AUC (Mann-Whitney) is the in-sample AUROC of the LOSS attack's score [Yeom2018] between the run's members
    and held-out samples.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    v, t = _f64(val)[..., -1, :], _f64(train)[..., -1, :]
    nv, nt = v.shape[-1], t.shape[-1]
    ranks = rankdata(np.concatenate([t, v], -1), axis=-1)  # ties averaged
    auc = (ranks[..., nt:].sum(-1) - nv * (nv + 1) / 2) / (nv * nt)
    return 2.0 - 2.0 * auc


def _margin(losses: np.ndarray) -> np.ndarray:
    """Logit-scaled confidence phi = log(p / (1 - p)), p = exp(-L) (LiRA's statistic), from the loss."""
    clipped = np.clip(losses, *MARGIN_LOSS_CLIP)
    return -np.log(np.expm1(clipped))


def gauss_tv(m1: Any, s1: Any, m2: Any, s2: Any, grid: int = TV_GRID) -> np.ndarray:
    """Compute the total variation between N(m1, s1^2) and N(m2, s2^2), elementwise (broadcast).

    By the trapezoid rule on [min mu - 10 s_max, max mu + 10 s_max] (absolute error about 1e-6).

    Args:
        m1 (np.ndarray): means of the first law.
        s1 (np.ndarray): standard deviations of the first law (> 0).
        m2 (np.ndarray): means of the second law.
        s2 (np.ndarray): standard deviations of the second law (> 0).
        grid (int): grid points of the rule.
    Returns:
        np.ndarray: the total variations, in [0, 1], broadcast shape.
    """
    m1, s1, m2, s2 = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (m1, s1, m2, s2)))
    smax = np.maximum(s1, s2)
    lo = np.minimum(m1, m2) - 10 * smax
    hi = np.maximum(m1, m2) + 10 * smax
    u = np.linspace(0.0, 1.0, grid)
    x = lo[..., None] + (hi - lo)[..., None] * u

    def pdf(m: np.ndarray, s: np.ndarray) -> np.ndarray:
        return np.exp(-0.5 * ((x - m[..., None]) / s[..., None]) ** 2) / (s[..., None] * math.sqrt(2 * math.pi))

    return np.clip(0.5 * np.trapezoid(np.abs(pdf(m1, s1) - pdf(m2, s2)), x, axis=-1), 0.0, 1.0)


def tv_gauss_margin(val: Any, train: Any) -> np.ndarray:
    """Score 1 - TV(N(mu_train, s_train^2), N(mu_val, s_val^2)) of phi = -log(expm1(L)) at the final checkpoint.

    phi is the logit-scaled confidence (L clipped to [1e-6, 30]); the score is a parametric (Gaussian, LiRA-style)
    estimate of the best attack on phi, a population version of the privacy risk score of [Song2021] averaged into
    an MIS. sd ddof 1 with floor 1e-6 (1 + |mu|).

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
        train (np.ndarray): [..., K, n_train] training-sample losses of the same checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one score per run, higher = more secure.
    """
    v, t = _margin(_f64(val)[..., -1, :]), _margin(_f64(train)[..., -1, :])
    mv, mt = v.mean(-1), t.mean(-1)
    sv = np.maximum(v.std(-1, ddof=DDOF), 1e-6 * (1 + np.abs(mv)))
    st = np.maximum(t.std(-1, ddof=DDOF), 1e-6 * (1 + np.abs(mt)))
    return 1.0 - gauss_tv(mt, st, mv, sv)


# ---- data-free controls (need parameters) ---------------------------------------------------------------


def qdistortion_angle(theta_q_final: Any, theta_final: Any) -> np.ndarray:
    """Score the control 1 - cos(Q(theta_T), theta_T) over all flattened parameters of the final model.

    Data-free: how much of the released parameter direction the quantizer destroys; uses no sample.

    Args:
        theta_q_final (np.ndarray): [..., P] flattened quantized final parameters.
        theta_final (np.ndarray): [..., P] flattened unquantized final parameters.
    Returns:
        np.ndarray: [...] one value per run.
    """
    a, b = np.asarray(theta_q_final, np.float64), np.asarray(theta_final, np.float64)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 - (a * b).sum(-1) / (na * nb)


def qflip_late(theta_q_traj: Any) -> np.ndarray:
    """Score the control: minus the mean share of parameters whose quantized value changes between checkpoints.

    Trajectory-only, no sample: over the last 10 consecutive checkpoint pairs (fewer than 11 checkpoints: all
    pairs).

    Args:
        theta_q_traj (np.ndarray): [..., K, P] quantized parameters along the trajectory.
    Returns:
        np.ndarray: [...] one value per run.
    """
    q = np.asarray(theta_q_traj)
    changed = (q[..., 1:, :] != q[..., :-1, :]).mean(-1)
    return -changed[..., -QFLIP_LAST:].mean(-1)


def heldout_loss_control(val: Any) -> np.ndarray:
    """Score the control: the mean held-out loss at the final checkpoint (how much the quantizer damages the model).

    Held-out losses only, no membership; not pre-registered. It asks whether a candidate tracks the attacks beyond
    damage: a quantizer that destroys the model also destroys every attack, so damage alone ranks quantizers by
    attack AUROC.

    Args:
        val (np.ndarray): [..., K, n_val] held-out losses of the quantized checkpoints (the last row is used).
    Returns:
        np.ndarray: [...] one value per run.
    """
    return _f64(val)[..., -1, :].mean(-1)
