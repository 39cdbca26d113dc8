"""The baseline MIS: feed-forward discriminators on [x, y, quantized parameters, loss] rows, MIS = 2 - 2 acc."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from llmaudit.common.runtime import torch_threads
from llmaudit.validate.synthetic.classifier import per_sample_losses, quantized_params
from llmaudit.validate.synthetic.config import SyntheticConfig
from llmaudit.validate.synthetic.data import derive_seed, seeded_generator


@dataclass(frozen=True)
class DiscriminatorSettings:
    """How the MIS discriminators are trained (`train_discriminators`): an [x, y, theta, loss] -> hidden -> 1
    MLP per quantizer, `epochs` passes of mini-batches of `batch_size` rows with Adam at `lr`."""

    hidden: int
    epochs: int
    lr: float
    batch_size: int
    dtype: str
    """"float32" (the batched, written-out trainer) or "bfloat16" (the autograd trainer under autocast)."""
    seed: int
    threads: int = 0
    """Intra-op threads of the batched trainer (0: unchanged)."""

    @classmethod
    def from_config(cls, cfg: SyntheticConfig, seed: int) -> DiscriminatorSettings:
        """The synthetic protocol's discriminator settings (cfg.disc_*) with the given seed."""
        return cls(
            hidden=cfg.disc_hidden,
            epochs=cfg.disc_epochs,
            lr=cfg.disc_lr,
            batch_size=cfg.disc_batch_size,
            dtype=cfg.disc_dtype,
            seed=seed,
        )


def mis_features(
    name: str,
    w: torch.Tensor,
    b: torch.Tensor,
    x_in: torch.Tensor,
    y_in: torch.Tensor,
    x_out: torch.Tensor,
    y_out: torch.Tensor,
    *,
    quantize_bias: bool,
) -> dict[str, torch.Tensor]:
    """Rows of the MIS baseline for final parameters w [R, C, d], b [R, C] (docs/science.md section 5).

    Per run r: n members (x_in[r]) and n fresh non-members (x_out[r]). Returns x [R, 2n, d],
    y [R, 2n], theta [R, C*d + C] (flattened quantized weights then bias), loss [R, 2n] (of the
    quantized model), member [R, 2n] (1 = member). Row features: [x, y, theta, loss] = d + 1 + C(d+1) + 1."""
    wq, bq = quantized_params(name, w, b, quantize_bias)
    x = torch.cat([x_in, x_out], 1)
    y = torch.cat([y_in, y_out], 1)
    loss = per_sample_losses(wq, bq, x, y)
    member = torch.cat([torch.ones_like(y_in), torch.zeros_like(y_out)], 1).float()
    return {"x": x, "y": y.float(), "theta": torch.cat([wq.flatten(1), bq], 1), "loss": loss, "member": member}


def _disc_prepare(
    feats: list[dict[str, torch.Tensor]],
    train_runs: torch.Tensor,
    test_runs: torch.Tensor,
) -> dict[str, Any]:
    """Standardised discriminator inputs (statistics of the training rows), shared by the batched
    trainer and the per-quantizer reference. Rows are kept factorised: xy [R, m, d+1] (shared by the
    quantizers), theta_s [Q, R, P] (one per run), loss_s [Q, R, m], member [R, m]."""
    Q = len(feats)
    x = feats[0]["x"]  # shared by all quantizers (same rows)
    R, m, d = x.shape

    def flat_rows(t: torch.Tensor, runs: torch.Tensor) -> torch.Tensor:
        return t[runs].reshape(len(runs) * m, *t.shape[2:])

    xtr = flat_rows(x, train_runs)
    ytr = flat_rows(feats[0]["y"], train_runs)[:, None]
    xy_tr = torch.cat([xtr, ytr], 1)  # [N, d + 1] shared
    mu_xy, sd_xy = xy_tr.mean(0), xy_tr.std(0).clamp_min(1e-6)
    theta = torch.stack([f["theta"] for f in feats])  # [Q, R, P]
    loss = torch.stack([f["loss"] for f in feats])  # [Q, R, m]
    mu_th = theta[:, train_runs].mean(1, keepdim=True)
    sd_th = theta[:, train_runs].std(1, keepdim=True).clamp_min(1e-6)
    lt = loss[:, train_runs].reshape(Q, -1)
    return {
        "Q": Q,
        "R": R,
        "m": m,
        "d": d,
        "P": theta.shape[-1],
        "xy": (torch.cat([x, feats[0]["y"][..., None]], -1) - mu_xy) / sd_xy,
        "theta_s": (theta - mu_th) / sd_th,
        "loss_s": (loss - lt.mean(1)[:, None, None]) / lt.std(1).clamp_min(1e-6)[:, None, None],
        "member": feats[0]["member"],
    }


def _disc_init(Q: int, d: int, P: int, hidden: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    """Initial parameters of Q discriminators (uniform +-1/sqrt(fan_in), as nn.Linear), drawn from g
    in a fixed order. w_xy [d+1, Q*hidden] (column q*hidden + j = unit j of discriminator q)."""
    fan_in = d + 1 + P + 1
    bound = 1.0 / math.sqrt(fan_in)
    return {
        "w_xy": (torch.rand(d + 1, Q * hidden, generator=g) * 2 - 1) * bound,
        "w_th": (torch.rand(Q, P, hidden, generator=g) * 2 - 1) * bound,
        "w_l": (torch.rand(Q, hidden, generator=g) * 2 - 1) * bound,
        "b1": (torch.rand(Q, hidden, generator=g) * 2 - 1) * bound,
        "w2": (torch.rand(Q, hidden, generator=g) * 2 - 1) / math.sqrt(hidden),
        "b2": (torch.rand(Q, generator=g) * 2 - 1) / math.sqrt(hidden),
    }


def _flat_adam(
    init: dict[str, torch.Tensor], lr: float
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.optim.Optimizer]:
    """All parameters of all discriminators in ONE flat buffer, their gradients in another: returns
    views prm (parameters) and grd (gradients, written by the backward pass) shaped as `init`, and one
    Adam over the buffer (the fused kernel where torch has one), which updates everything at once."""
    names = list(init)
    sizes = [init[k].numel() for k in names]
    flat = torch.cat([init[k].reshape(-1) for k in names]).requires_grad_(True)
    gflat = torch.zeros_like(flat, requires_grad=False)
    with torch.no_grad():
        prm = dict(zip(names, (t.view(init[k].shape) for t, k in zip(flat.split(sizes), names))))
        grd = dict(zip(names, (t.view(init[k].shape) for t, k in zip(gflat.split(sizes), names))))
    flat.grad = gflat
    try:
        opt = torch.optim.Adam([flat], lr=lr, fused=True)
    except (RuntimeError, ValueError):
        opt = torch.optim.Adam([flat], lr=lr)
    return prm, grd, opt


def _batched_train_rows(pre: dict[str, Any], train_runs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The training rows in the batched trainer's layout: run_of_row [N] (index into th [Q, Rtr, P]),
    xy [N, d+1], loss [N, Q], target [N]."""
    Q, m, d = pre["Q"], pre["m"], pre["d"]
    n_tr = len(train_runs) * m
    loss_tr = pre["loss_s"][:, train_runs].reshape(Q, n_tr)
    return {
        "run_of_row": torch.arange(len(train_runs)).repeat_interleave(m),
        "th": pre["theta_s"][:, train_runs].contiguous(),
        "xy": pre["xy"][train_runs].reshape(n_tr, d + 1),
        "loss": loss_tr.T.contiguous(),
        "target": pre["member"][train_runs].reshape(n_tr),
    }


def _batched_forward(
    prm: dict[str, torch.Tensor],
    run_of_row: torch.Tensor,
    xy_rows: torch.Tensor,
    loss_rows: torch.Tensor,
    th_runs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Forward pass of the Q discriminators on B rows (loss_rows [B, Q], th_runs [Q, R', P] indexed by
    run_of_row [B]). Returns logits [Q, B] and, for the backward pass, the ReLU activations a [B, Q, H],
    the theta rows of the batch's runs th_u [Q, R'', P], each row's index into them and their number.

    Activations are laid out [B, Q, H] (row-major over the Q*hidden columns of w_xy), so the
    shared-input products are plain [B, d+1] x [d+1, Q*H] matmuls without transposed copies."""
    Q, _, hidden = prm["w_th"].shape
    uniq, inv = torch.unique(run_of_row, return_inverse=True)
    th_u = th_runs[:, uniq]  # [Q, R', P]
    h_th = torch.bmm(th_u, prm["w_th"]).transpose(0, 1).reshape(-1, Q * hidden)  # [R', Q*H]
    h = torch.addmm(h_th.index_select(0, inv), xy_rows, prm["w_xy"]).view(-1, Q, hidden)  # [B, Q, H]
    h.addcmul_(loss_rows[..., None], prm["w_l"]).add_(prm["b1"])
    a = h.clamp_min_(0)  # relu in place: a > 0 <=> h > 0
    logits = torch.bmm(a.transpose(0, 1), prm["w2"][..., None]).squeeze(-1).add_(prm["b2"][:, None])  # [Q, B]
    return logits, a, th_u, inv, uniq.numel()


def _batched_fit(
    prm: dict[str, torch.Tensor],
    grd: dict[str, torch.Tensor],
    opt: torch.optim.Optimizer,
    rows: dict[str, torch.Tensor],
    perms: Sequence[torch.Tensor],
    batch_size: int,
) -> None:
    """Mini-batch training of the Q discriminators (in place, under no_grad): the written-out backward
    pass of mean BCE per quantizer into grd, then one Adam step over the flat buffer per batch."""
    Q, _, hidden = prm["w_th"].shape
    n_tr = len(rows["target"])
    for perm in perms:
        for s in range(0, n_tr, batch_size):
            idx = perm[s : s + batch_size]
            B = idx.numel()
            xy_b, loss_b, t_b = rows["xy"][idx], rows["loss"][idx], rows["target"][idx]
            logits, a, th_u, inv, nu = _batched_forward(prm, rows["run_of_row"][idx], xy_b, loss_b, rows["th"])
            # d(sum_q mean_b BCE_q)/d logit = (sigmoid(logit) - target) / B, per quantizer
            gl = (torch.sigmoid(logits) - t_b).div_(B)  # [Q, B]
            a_t = a.transpose(0, 1)  # [Q, B, H] view
            torch.bmm(gl[:, None, :], a_t, out=grd["w2"][:, None, :])
            torch.sum(gl, 1, out=grd["b2"])
            dh = (a > 0).to(a.dtype).mul_(gl.T[..., None]).mul_(prm["w2"])  # [B, Q, H]
            torch.sum(dh, 0, out=grd["b1"])
            torch.bmm(loss_b.T[:, None, :], dh.transpose(0, 1), out=grd["w_l"][:, None, :])
            torch.mm(xy_b.T, dh.view(B, Q * hidden), out=grd["w_xy"])
            dh_u = torch.zeros(nu, Q, hidden).index_add_(0, inv, dh)
            torch.bmm(th_u.transpose(1, 2), dh_u.transpose(0, 1), out=grd["w_th"])
            opt.step()  # elementwise: exact per discriminator


def _batched_score(
    prm: dict[str, torch.Tensor], pre: dict[str, Any], rows: dict[str, torch.Tensor], test_runs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """correct [Q, len(test_runs)] (fraction of correctly classified test rows per run, threshold 0.5)
    and train_acc [Q] (over the training rows, in chunks of 8192 rows)."""
    Q, m, d = pre["Q"], pre["m"], pre["d"]
    te = test_runs
    n_te = len(te) * m
    logits = _batched_forward(
        prm,
        torch.arange(len(te)).repeat_interleave(m),
        pre["xy"][te].reshape(n_te, d + 1),
        pre["loss_s"][:, te].reshape(Q, n_te).T,
        pre["theta_s"][:, te],
    )[0]
    correct = ((logits > 0).float() == pre["member"][te].reshape(n_te)).float().reshape(Q, len(te), m).mean(-1)
    run_of_row, xy, loss, th, target = rows["run_of_row"], rows["xy"], rows["loss"], rows["th"], rows["target"]
    train_acc = torch.cat(
        [
            (
                (
                    _batched_forward(prm, run_of_row[s : s + 8192], xy[s : s + 8192], loss[s : s + 8192], th)[0] > 0
                ).float()
                == target[s : s + 8192]
            ).float()
            for s in range(0, len(target), 8192)
        ],
        1,
    ).mean(-1)
    return correct, train_acc


def train_discriminators(
    feats: list[dict[str, torch.Tensor]],
    train_runs: torch.Tensor,
    test_runs: torch.Tensor,
    settings: DiscriminatorSettings,
    *,
    return_state: bool = False,
) -> dict[str, Any]:
    """Train one [x, y, theta, loss] -> hidden -> 1 MLP per entry of `feats` (one per quantizer),
    all at once as batched tensors, on the rows of `train_runs`; score the rows of `test_runs`.

    Per quantizer this is exactly the tests' reference network (an nn.Linear-ReLU-nn.Linear MLP on
    the full 388-wide rows, mean BCE, torch.optim.Adam, same init and mini-batch order): the
    discriminators share nothing but the mini-batch row order. The forward and backward passes are
    written out (no autograd) over a leading quantizer dimension, and Adam's update (elementwise, so
    stacking is exact) runs once over one flat buffer holding all parameters. The first layer's
    theta block is applied once per run of the mini-batch and gathered per row (theta is constant
    within a run); its gradient is summed per run before the product with theta.
    Features are standardised with the training rows' mean and std.
    Returns correct [Q, len(test_runs)] (fraction of correctly classified test rows per run) and
    train_acc [Q]; with `return_state` also the final parameters and the row permutations."""
    if settings.dtype != "float32":
        # The written-out backward is float32; keep the autograd path for the bfloat16 setting.
        return _train_discriminators_autograd(feats, train_runs, test_runs, settings)
    pre = _disc_prepare(feats, train_runs, test_runs)
    Q, m, d, P = pre["Q"], pre["m"], pre["d"], pre["P"]
    g = seeded_generator(settings.seed, "disc")
    init = _disc_init(Q, d, P, settings.hidden, g)
    n_tr = len(train_runs) * m
    perms = [torch.randperm(n_tr, generator=g) for _ in range(settings.epochs)]  # same draws as one per epoch
    prm, grd, opt = _flat_adam(init, settings.lr)
    rows = _batched_train_rows(pre, train_runs)
    with torch_threads(settings.threads), torch.no_grad():
        _batched_fit(prm, grd, opt, rows, perms, settings.batch_size)
        correct, train_acc = _batched_score(prm, pre, rows, test_runs)
    out: dict[str, Any] = {"correct": correct.numpy(), "train_acc": train_acc.numpy()}
    if return_state:
        out["params"] = {k: v.clone() for k, v in prm.items()}
        out["init"] = init
        out["perms"] = perms
        out["prepared"] = pre
    return out


def _autograd_forward(
    params: dict[str, torch.Tensor],
    use_bf16: bool,
    run_of_row: torch.Tensor,
    xy_rows: torch.Tensor,
    loss_rows: torch.Tensor,
    th_runs: torch.Tensor,
) -> torch.Tensor:
    """Forward pass of the autograd trainer: run_of_row [B] indexes th_runs [Q, R', P]; xy_rows [B, d+1];
    loss_rows [Q, B] -> logits [Q, B]. The two first-layer matmuls run under bfloat16 autocast if asked."""
    Q, _, hidden = params["w_th"].shape
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
        h_xy = (xy_rows @ params["w_xy"]).reshape(-1, Q, hidden).transpose(0, 1)  # [Q, B, H]
        # theta is constant within a run: project each run of the batch once, then gather per row.
        uniq, inv = torch.unique(run_of_row, return_inverse=True)
        h_th = torch.bmm(th_runs[:, uniq], params["w_th"])  # [Q, R', H]
    h = h_xy.float() + h_th.float()[:, inv] + loss_rows[..., None] * params["w_l"][:, None] + params["b1"][:, None]
    return (torch.relu(h) * params["w2"][:, None]).sum(-1) + params["b2"][:, None]


def _autograd_score(
    params: dict[str, torch.Tensor],
    use_bf16: bool,
    pre: dict[str, Any],
    rows: dict[str, torch.Tensor],
    test_runs: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """correct [Q, len(test_runs)] and train_acc [Q] of the autograd trainer's discriminators."""
    Q, m, d = pre["Q"], pre["m"], pre["d"]
    with torch.no_grad():
        th_te = pre["theta_s"][:, test_runs]
        n_te = len(test_runs) * m
        logits = _autograd_forward(
            params,
            use_bf16,
            torch.arange(len(test_runs)).repeat_interleave(m),
            pre["xy"][test_runs].reshape(n_te, d + 1),
            pre["loss_s"][:, test_runs].reshape(Q, n_te),
            th_te,
        )
        correct = (
            ((logits > 0).float() == pre["member"][test_runs].reshape(n_te))
            .float()
            .reshape(Q, len(test_runs), m)
            .mean(-1)
        )
        train_logits = _autograd_forward(params, use_bf16, rows["run_of_row"], rows["xy"], rows["loss"], rows["th"])
        train_acc = ((train_logits > 0).float() == rows["target"]).float().mean(-1)
    return correct, train_acc


def _train_discriminators_autograd(
    feats: list[dict[str, torch.Tensor]],
    train_runs: torch.Tensor,
    test_runs: torch.Tensor,
    settings: DiscriminatorSettings,
) -> dict[str, np.ndarray]:
    """Previous autograd implementation (torch.optim.Adam over the stacked parameters), kept for
    disc_dtype=bfloat16 (autocast). Same init and row order as `train_discriminators`.

    Features are standardised with the training rows' mean and std. The first layer's theta block is
    applied once per run and gathered per row (theta is constant within a run): mathematically the
    same network as applying the full 388-wide layer to every row, without the redundant work.
    Returns correct [Q, len(test_runs)] (fraction of correctly classified test rows per run) and
    train_acc [Q]."""
    g = seeded_generator(settings.seed, "disc")
    pre = _disc_prepare(feats, train_runs, test_runs)
    Q, m, d, P = pre["Q"], pre["m"], pre["d"], pre["P"]
    params = _disc_init(Q, d, P, settings.hidden, g)
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.Adam(params.values(), lr=settings.lr)
    use_bf16 = settings.dtype == "bfloat16"
    n_tr = len(train_runs) * m
    rows = {
        "run_of_row": torch.arange(len(train_runs)).repeat_interleave(m),
        "th": pre["theta_s"][:, train_runs],
        "xy": pre["xy"][train_runs].reshape(n_tr, d + 1),
        "loss": pre["loss_s"][:, train_runs].reshape(Q, n_tr),  # [Q, N]
        "target": pre["member"][train_runs].reshape(n_tr),
    }
    for _ in range(settings.epochs):
        perm = torch.randperm(n_tr, generator=g)
        for s in range(0, n_tr, settings.batch_size):
            idx = perm[s : s + settings.batch_size]
            logits = _autograd_forward(
                params, use_bf16, rows["run_of_row"][idx], rows["xy"][idx], rows["loss"][:, idx], rows["th"]
            )
            bce = F.binary_cross_entropy_with_logits(logits, rows["target"][idx].expand(Q, -1), reduction="mean") * Q
            opt.zero_grad(set_to_none=True)
            bce.backward()
            opt.step()
    correct, train_acc = _autograd_score(params, use_bf16, pre, rows, test_runs)
    return {"correct": correct.numpy(), "train_acc": train_acc.numpy()}


def split_runs(n_runs: int, train_fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n_runs, generator=generator)
    n_tr = min(max(1, int(round(train_fraction * n_runs))), n_runs - 1)
    return perm[:n_tr].sort().values, perm[n_tr:].sort().values


def mis_estimate(
    names: Sequence[str],
    w: torch.Tensor,
    b: torch.Tensor,
    data: dict[str, torch.Tensor],
    runs: torch.Tensor,
    cfg: SyntheticConfig,
    seed_key: tuple,
) -> dict[str, Any]:
    """Baseline MIS (2 - 2 x test accuracy) per quantizer from the final parameters of `runs`."""
    feats = [
        mis_features(
            q,
            w[runs],
            b[runs],
            data["x_train"][runs],
            data["y_train"][runs],
            data["x_out"][runs],
            data["y_out"][runs],
            quantize_bias=cfg.quantize_bias,
        )
        for q in names
    ]
    tr, te = split_runs(len(runs), cfg.disc_train_fraction, seeded_generator(cfg.seed, *seed_key, "split"))
    settings = DiscriminatorSettings.from_config(cfg, derive_seed(cfg.seed, *seed_key))
    out = train_discriminators(feats, tr, te, settings)
    acc = out["correct"].mean(1)
    return {
        "mis": 2 - 2 * acc,
        "test_acc": acc,
        "train_acc": out["train_acc"],
        "correct_per_run": out["correct"],
        "n_train_runs": len(tr),
        "n_test_runs": len(te),
    }
