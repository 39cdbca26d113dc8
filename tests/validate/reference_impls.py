"""Reference implementations the tests compare `llmaudit.validate.synthetic` with, and the baseline
benchmarks/bench_synthetic.py times; the protocol never runs them.

- `train_per_run`: one nn.Linear and one torch.optim.Adam per run, the loop `classifier.train_batched` computes
  for all runs at once.
- `train_discriminator_reference`: one plain nn.Linear - ReLU - nn.Linear network per quantizer on materialised
  rows, trained with autograd and torch.optim.Adam, the network `mis.train_discriminators` trains batched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from llmaudit.validate.synthetic.mis import DiscriminatorSettings


def train_per_run(
    x: torch.Tensor,
    y: torch.Tensor,
    w0: torch.Tensor,
    b0: torch.Tensor,
    order: torch.Tensor,
    *,
    lr: float,
    batch_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference loop: one nn.Linear and one torch.optim.Adam per run. Same inputs/outputs as
    `train_batched`."""
    R, n, d = x.shape
    E = order.shape[1]
    out_w, out_b = [], []
    for r in range(R):
        model = torch.nn.Linear(d, w0.shape[1])
        with torch.no_grad():
            model.weight.copy_(w0[r])
            model.bias.copy_(b0[r])
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        tw, tb = [w0[r].clone()], [b0[r].clone()]
        for e in range(E):
            for s in range(0, n, batch_size):
                idx = order[r, e, s : s + batch_size]
                loss = F.cross_entropy(model(x[r, idx]), y[r, idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            tw.append(model.weight.detach().clone())
            tb.append(model.bias.detach().clone())
        out_w.append(torch.stack(tw))
        out_b.append(torch.stack(tb))
    return torch.stack(out_w, 1), torch.stack(out_b, 1)


def _reference_rows(pre: dict[str, Any], q: int, runs: torch.Tensor) -> torch.Tensor:
    """Materialised rows [x, y, theta, loss] of quantizer q for `runs`: [len(runs) * m, d + 1 + P + 1]."""
    m, d, P = pre["m"], pre["d"], pre["P"]
    n = len(runs) * m
    th = pre["theta_s"][q, runs][:, None, :].expand(-1, m, -1).reshape(n, P)
    return torch.cat([pre["xy"][runs].reshape(n, d + 1), th, pre["loss_s"][q, runs].reshape(n, 1)], 1)


def _reference_net(
    pre: dict[str, Any], q: int, init: dict[str, torch.Tensor], hidden: int
) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """Linear(d + 1 + P + 1, hidden) and Linear(hidden, 1) holding slice q of the batched init."""
    d, P = pre["d"], pre["P"]
    l1, l2 = torch.nn.Linear(d + 1 + P + 1, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        l1.weight.copy_(
            torch.cat([init["w_xy"][:, q * hidden : (q + 1) * hidden], init["w_th"][q], init["w_l"][q][None]]).T
        )
        l1.bias.copy_(init["b1"][q])
        l2.weight.copy_(init["w2"][q][None])
        l2.bias.copy_(init["b2"][q][None])
    return l1, l2


def _reference_params(l1: torch.nn.Linear, l2: torch.nn.Linear, d: int, P: int) -> dict[str, torch.Tensor]:
    """The reference network's parameters in the batched layout (one discriminator's slice)."""
    w1 = l1.weight.T
    return {
        "w_xy": w1[: d + 1],
        "w_th": w1[d + 1 : d + 1 + P],
        "w_l": w1[-1],
        "b1": l1.bias.clone(),
        "w2": l2.weight[0].clone(),
        "b2": l2.bias[0].clone(),
    }


def train_discriminator_reference(
    pre: dict[str, Any],
    q: int,
    init: dict[str, torch.Tensor],
    perms: Sequence[torch.Tensor],
    train_runs: torch.Tensor,
    test_runs: torch.Tensor,
    settings: DiscriminatorSettings,
) -> dict[str, Any]:
    """Reference for ONE discriminator (quantizer index q of `train_discriminators`): the plain
    Linear(388, hidden) - ReLU - Linear(hidden, 1) network on materialised 388-wide rows
    [x, y, theta, loss], mean BCE, torch.optim.Adam, autograd; the same initial parameters (slice q
    of the batched init) and the same row order per epoch. Returns its parameters in the batched
    layout (slice q) and correct / train_acc. Of `settings` it reads hidden, lr and batch_size."""
    m, batch_size = pre["m"], settings.batch_size
    l1, l2 = _reference_net(pre, q, init, settings.hidden)
    net = torch.nn.Sequential(l1, torch.nn.ReLU(), l2)
    opt = torch.optim.Adam(net.parameters(), lr=settings.lr)
    x_tr, t_tr = _reference_rows(pre, q, train_runs), pre["member"][train_runs].reshape(-1)
    for perm in perms:
        for s in range(0, len(perm), batch_size):
            idx = perm[s : s + batch_size]
            loss = F.binary_cross_entropy_with_logits(net(x_tr[idx]).squeeze(-1), t_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        te_logits = net(_reference_rows(pre, q, test_runs)).squeeze(-1)
        correct = (
            ((te_logits > 0).float() == pre["member"][test_runs].reshape(-1))
            .float()
            .reshape(len(test_runs), m)
            .mean(-1)
        )
        train_acc = ((net(x_tr).squeeze(-1) > 0).float() == t_tr).float().mean()
        params = _reference_params(l1, l2, pre["d"], pre["P"])
    return {"params": params, "correct": correct.numpy(), "train_acc": float(train_acc)}
