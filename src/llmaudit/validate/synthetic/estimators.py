"""r_Q of many runs at once (Algorithm 2 row by row) and the labelled variants of the synthetic study."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from llmaudit.validate.synthetic.classifier import point_losses, quantize_batched, quantized_params
from llmaudit.validate.synthetic.config import SyntheticConfig


def r_q_batched(losses: torch.Tensor | np.ndarray, *, ddof: int = 1) -> np.ndarray:
    """Algorithm 2 (docs/science.md section 2) for R runs at once; equals `llmaudit.indicator.r_q` per run.

    losses: [R, K, n] per-sample losses of K quantized checkpoints of each run. Returns r_Q [R]
    (nan: fewer than 2 distinct points; 0.0: a distinct point with the same mean as the lowest; +inf: every
    sigma2 = 0). See `r_q_batched_details` for the number of distinct points per run."""
    return r_q_batched_details(losses, ddof=ddof)[0]


def r_q_batched_details(losses: torch.Tensor | np.ndarray, *, ddof: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """`r_q_batched` plus the number of distinct quantized points per run: (r_Q [R], n_points [R]).

    Rows with identical per-sample losses are merged (exact equality, as `llmaudit.indicator.r_q`
    with atol=0): identical rows have identical means, so full rows are compared only for pairs of
    equal means."""
    L = torch.as_tensor(losses, dtype=torch.float64)
    R, K, n = L.shape
    m = L.mean(-1)  # [R, K]
    # a non-finite loss makes its row mean non-finite: the full check runs only then
    if not torch.isfinite(m).all() and not torch.isfinite(L).all():
        raise ValueError("non-finite losses: a diverged quantized model cannot be scored")
    # Identical rows have identical means; test full equality only on equal-mean pairs (k2 < k).
    cand = (m[:, :, None] == m[:, None, :]) & torch.ones(K, K, dtype=torch.bool).tril(-1)
    dup = torch.zeros(R, K, dtype=torch.bool)
    rr, kk, jj = cand.nonzero(as_tuple=True)
    for s in range(0, rr.numel(), 20000):
        sl = slice(s, s + 20000)
        same = (L[rr[sl], kk[sl]] == L[rr[sl], jj[sl]]).all(-1)
        dup[rr[sl][same], kk[sl][same]] = True
    keep = ~dup
    n_points = keep.sum(-1)
    m_masked = torch.where(keep, m, torch.full_like(m, math.inf))
    k1 = m_masked.argmin(-1)  # lowest-loss point
    L1 = L[torch.arange(R), k1]  # [R, n]
    sigma2 = (L - L1[:, None, :]).var(-1, correction=ddof)  # [R, K]
    delta = m - m.gather(1, k1[:, None])
    d2 = delta**2
    ratio = torch.where(d2 > 0, sigma2 / torch.where(d2 > 0, d2, torch.ones_like(d2)), torch.full_like(d2, math.inf))
    valid = keep.clone()
    valid[torch.arange(R), k1] = False
    worst = torch.where(valid, ratio, torch.full_like(ratio, -math.inf)).max(-1).values
    r = torch.where(worst > 0, 0.5 / worst, torch.full_like(worst, math.inf))
    r = torch.where(torch.isinf(worst) & (worst > 0), torch.zeros_like(r), r)
    r = torch.where(n_points < 2, torch.full_like(r, math.nan), r)
    return r.numpy(), n_points.numpy()


def r_q_from_points(
    name: str,
    w: torch.Tensor,
    b: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    quantize_bias: bool,
    ddof: int,
    return_points: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """r_Q per run from K parameter points per run. w [K, R, C, d], b [K, R, C]; x [n, d] (shared)
    or [R, n, d] (per run). Returns [R]."""
    K, R = w.shape[:2]
    wq, bq = quantized_params(name, w.reshape(K * R, *w.shape[2:]), b.reshape(K * R, -1), quantize_bias)
    losses = point_losses(wq.view(w.shape), bq.view(b.shape), x, y)
    r, n_points = r_q_batched_details(losses, ddof=ddof)
    return (r, n_points) if return_points else r


@dataclass(frozen=True)
class VariantInputs:
    """The samples `r_q_all_variants` scores: x_rq [n, d] (shared) or [R, n, d] (per run) with labels y_rq
    for r_Q, each run's training samples x_train [R, n_train, d], y_train (the "train-loss" variant), and
    the perturbed points (w [K', R, C, d], b [K', R, C]) of the "perturbed" variant (None: not computed)."""

    x_rq: torch.Tensor
    y_rq: torch.Tensor
    x_train: torch.Tensor
    y_train: torch.Tensor
    pert: tuple[torch.Tensor, torch.Tensor] | None = None


def _loss_fn(wq: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """bias [K, R, C] -> per-sample losses [R, K, n] of the quantized weights wq [K, R, C, d] with that bias;
    for shared inputs x [n, d] the weight products are computed once and reused for every bias."""
    if x.dim() != 2:
        return lambda bias: point_losses(wq, bias, x, y)
    K, R, C, d = wq.shape
    z_w = (wq.reshape(K * R * C, d) @ x.T).view(K, R, C, -1)  # [K, R, C, n]
    yy = y.view(1, 1, 1, -1).expand(K, R, 1, -1)

    def losses(bias: torch.Tensor) -> torch.Tensor:
        z = z_w + bias[..., None]
        return -torch.log_softmax(z, 2).gather(2, yy).squeeze(2).transpose(0, 1)  # [R, K, n]

    return losses


def r_q_all_variants(
    name: str,
    traj_w: torch.Tensor,
    traj_b: torch.Tensor,
    inputs: VariantInputs,
    cfg: SyntheticConfig,
    variants: Sequence[str],
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """r_Q per run of one quantizer: the published estimator and the requested variants, from ONE
    quantization of the trajectory and ONE loss evaluation per input set (the published and
    "converged" estimators slice the same per-checkpoint losses; "unquantized-bias" reuses the
    quantized weight products). Equal to the separate `r_q_from_points` calls up to float rounding.
    Returns ({estimator: r_Q [R]}, distinct points per run of the published estimator)."""
    E1, R, C, d = traj_w.shape
    e0 = min(cfg.rq_first_epoch, cfg.converged_from_epoch if "converged" in variants else cfg.rq_first_epoch)
    w, b = traj_w[e0:], traj_b[e0:]
    K = w.shape[0]
    wq = quantize_batched(name, w.reshape(K * R, C, d)).view(K, R, C, d)
    b_q = quantize_batched(name, b.reshape(K * R, C)).view(K, R, C)
    b_pub, b_alt = (b_q, b) if cfg.quantize_bias else (b, b_q)
    ep, cs = slice(cfg.rq_first_epoch - e0, None), slice(cfg.converged_from_epoch - e0, None)
    out: dict[str, np.ndarray] = {}
    losses = _loss_fn(wq, inputs.x_rq, inputs.y_rq)
    L = losses(b_pub)
    out["published"], pts = r_q_batched_details(L[:, ep], ddof=cfg.rq_ddof)
    if "converged" in variants:
        out["converged"] = r_q_batched_details(L[:, cs], ddof=cfg.rq_ddof)[0]
    del L
    if "unquantized-bias" in variants:
        out["unquantized-bias"] = r_q_batched_details(losses(b_alt)[:, ep], ddof=cfg.rq_ddof)[0]
    if "train-loss" in variants:
        train_losses = point_losses(wq[ep], b_pub[ep], inputs.x_train, inputs.y_train)
        out["train-loss"] = r_q_batched_details(train_losses, ddof=cfg.rq_ddof)[0]
    if "perturbed" in variants and inputs.pert is not None:
        pw, pb = inputs.pert
        out["perturbed"] = r_q_from_points(
            name, pw, pb, inputs.x_rq, inputs.y_rq, quantize_bias=cfg.quantize_bias, ddof=cfg.rq_ddof
        )
    return out, pts
