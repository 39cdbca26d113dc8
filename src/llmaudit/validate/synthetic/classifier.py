"""The linear classifiers of the synthetic protocol: batched training of all runs at once (and the
per-run reference loop), quantization of their parameters and per-sample losses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from llmaudit.common.runtime import torch_threads
from llmaudit.quantize import simple
from llmaudit.validate.synthetic.config import QUANTIZER_NAMES


def quantize_batched(name: str, w: torch.Tensor) -> torch.Tensor:
    """Quantize R independent tensors at once. w: [R, *tensor] -> same shape (scale/threshold per r)."""

    if name == "sign":
        return simple.sign_quantize(w, batch_dims=1)
    kind, _, arg = name.partition("-")
    if kind == "ternary" and arg in ("33", "50", "90"):
        return simple.ternary_quantize(w, int(arg) / 100.0, batch_dims=1)
    if kind == "uniform" and arg in ("2", "3", "4", "5"):
        return simple.uniform_quantize(w, int(arg), batch_dims=1)
    raise ValueError(f"unknown quantizer {name!r}; allowed: {list(QUANTIZER_NAMES)}")


def init_linear(seeds: Sequence[int], dim: int, n_classes: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's default nn.Linear initialisation, one per seed. Returns W [R, C, dim], b [R, C]."""
    ws, bs = [], []
    with torch.random.fork_rng(devices=[]):
        for s in seeds:
            torch.manual_seed(int(s))
            lin = torch.nn.Linear(dim, n_classes)
            ws.append(lin.weight.detach().clone())
            bs.append(lin.bias.detach().clone())
    return torch.stack(ws), torch.stack(bs)


@dataclass(frozen=True)
class AdamSettings:
    """The Adam hyper-parameters besides the learning rate of `train_batched` (torch.optim.Adam's defaults)
    and the intra-op threads it runs on (tiny batched ops run fastest on one)."""

    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    threads: int = 1


def train_batched(
    x: torch.Tensor,
    y: torch.Tensor,
    w0: torch.Tensor,
    b0: torch.Tensor,
    order: torch.Tensor,
    *,
    lr: float,
    batch_size: int,
    adam: AdamSettings = AdamSettings(),
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train R linear classifiers at once with Adam on mean cross-entropy, one checkpoint per epoch.

    x [R, n, d], y [R, n], w0 [R, C, d], b0 [R, C], order [R, E, n] (sample order per epoch).
    Returns the trajectory W [E + 1, R, C, d], b [E + 1, R, C] (index 0 = initialisation).

    Weight and bias are packed as theta [R, C, d + 1] against inputs [x, 1]. The gradient of the
    mean cross-entropy is written out, (softmax - onehot)^T [x, 1] / B, and Adam is torch.optim.Adam's
    update rule (no weight decay, no amsgrad) applied elementwise: per run this is exactly R
    independent nn.Linear + Adam trainings (the tests' reference loop), without autograd's per-step overhead."""
    R, n, d = x.shape
    with torch_threads(adam.threads), torch.no_grad():
        xa = torch.cat([x, torch.ones(R, n, 1, dtype=x.dtype)], -1)  # [R, n, d + 1]
        theta = torch.cat([w0, b0[..., None]], -1).clone()  # [R, C, d + 1]
        state = {"m": torch.zeros_like(theta), "v": torch.zeros_like(theta), "step": 0}
        traj = [theta.clone()]
        run_idx = torch.arange(R)[:, None]
        for e in range(order.shape[1]):
            perm = order[:, e]
            for s in range(0, n, batch_size):
                idx = perm[:, s : s + batch_size]  # [R, B]
                grad = _mean_ce_grad(theta, xa[run_idx, idx], y[run_idx, idx])
                _adam_step(theta, grad, state, lr, adam)
            traj.append(theta.clone())
        t = torch.stack(traj)
    return t[..., :d].contiguous(), t[..., d].contiguous()


def _mean_ce_grad(theta: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Gradient [R, C, d+1] of the mean cross-entropy of R linear classifiers theta [R, C, d+1] on a
    mini-batch xb [R, B, d+1] (inputs with the constant 1), yb [R, B]: (softmax - onehot)^T xb / B."""
    logits = torch.bmm(xb, theta.transpose(1, 2))  # [R, B, C]
    g = torch.softmax(logits, -1)
    g.scatter_add_(-1, yb[..., None], torch.full_like(g[..., :1], -1.0))
    return torch.bmm(g.transpose(1, 2), xb).div_(yb.shape[1])  # [R, C, d+1]


def _adam_step(theta: torch.Tensor, grad: torch.Tensor, state: dict, lr: float, adam: AdamSettings) -> None:
    """torch.optim.Adam's update of theta in place (no weight decay, no amsgrad); state holds m, v and step."""
    b1, b2 = adam.betas
    m, v = state["m"], state["v"]
    state["step"] += 1
    step = state["step"]
    m.mul_(b1).add_(grad, alpha=1 - b1)
    v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
    bc1 = 1 - b1**step
    bc2 = 1 - b2**step
    denom = (v.sqrt() / math.sqrt(bc2)).add_(adam.eps)
    theta.addcdiv_(m, denom, value=-lr / bc1)


def per_sample_losses(w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of M linear models on samples. w [M, C, d], b [M, C]; x [n, d] shared or
    [M, n, d] per model; y likewise. Returns [M, n] (float32)."""
    if x.dim() == 2:
        M, C, d = w.shape
        logits = (w.reshape(M * C, d) @ x.T).reshape(M, C, -1).transpose(1, 2) + b[:, None, :]
        yy = y.expand(M, -1)
    else:
        logits = torch.baddbmm(b[:, None, :], x, w.transpose(1, 2))
        yy = y
    return -torch.log_softmax(logits, dim=-1).gather(-1, yy.unsqueeze(-1)).squeeze(-1)


def quantized_params(
    name: str, w: torch.Tensor, b: torch.Tensor, quantize_bias: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """w [M, C, d], b [M, C] -> quantized (per tensor: each weight matrix, each bias vector)."""
    return quantize_batched(name, w), (quantize_batched(name, b) if quantize_bias else b)


def point_losses(wq: torch.Tensor, bq: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-sample cross-entropy of K parameter points per run: wq [K, R, C, d], bq [K, R, C];
    x [n, d] / y [n] shared by the runs, or x [R, n, d] / y [R, n] per run. Returns [R, K, n].

    Same values as `per_sample_losses` on the flattened points (up to float rounding of the matmul),
    computed without repeating per-run inputs K times: one [K*R*C, d] x [d, n] product for shared
    inputs, one [n, d] x [d, K*C] product per run otherwise."""
    K, R, C, d = wq.shape
    if x.dim() == 2:
        z = (wq.reshape(K * R * C, d) @ x.T).view(K, R, C, -1).add_(bq[..., None])  # [K, R, C, n]
        return -torch.log_softmax(z, 2).gather(2, y.view(1, 1, 1, -1).expand(K, R, 1, -1)).squeeze(2).transpose(0, 1)
    n = x.shape[1]
    z = torch.bmm(x, wq.permute(1, 3, 0, 2).reshape(R, d, K * C)).view(R, n, K, C)  # [R, n, K, C]
    z = z + bq.transpose(0, 1)[:, None]
    loss = -torch.log_softmax(z, -1).gather(-1, y.view(R, n, 1, 1).expand(R, n, K, 1)).squeeze(-1)
    return loss.permute(0, 2, 1)  # [R, K, n]
