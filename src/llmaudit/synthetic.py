"""Synthetic validation of the indicator r_Q against the baseline MIS (SCIENCE.md section 5).

`llmaudit validate synthetic [RECIPE] [key=value ...] --out DIR` runs `validate_synthetic_command`.

Pipeline per data set (k_modes x sigma):
1. `make_mixture` / `sample_mixture`: Gaussian mixture in R^dim, labels alternating over clusters.
2. `train_batched`: all R runs of single-layer (linear dim -> 2) classifiers trained at once as
   batched tensors with Adam; one checkpoint per epoch. `train_per_run` is the straightforward
   reference loop (nn.Linear + torch.optim.Adam), used by the tests and the benchmark.
3. r_Q per run and quantizer: quantize every checkpoint, per-sample losses on the validation set,
   `r_q_batched` (Algorithm 2, equal to `llmaudit.indicator.r_q` row by row), mean over runs.
   `r_q_all_variants` computes the published estimator and the variants of one quantizer from one
   quantization of the trajectory and one loss pass per input set (`r_q_from_points` per estimator
   is the reference).
4. Baseline MIS: `train_discriminators` fits one 388 -> 256 -> 1 feed-forward discriminator per
   quantizer on [x, y, flattened quantized parameters, loss] rows of 80% of the runs; MIS = 2 - 2 acc
   on the rows of the remaining runs. All quantizers' discriminators train at once as stacked
   tensors (written-out forward/backward, one Adam over one flat parameter buffer);
   `train_discriminator_reference` trains one alone (nn.Linear + autograd + torch.optim.Adam) and is
   the reference the tests compare against.
5. Spearman rho between the two rankings, the stability study, and clearly labelled r_Q VARIANTS
   (never replacing the published estimator) that probe the sign of that correlation.
"""

from __future__ import annotations

import math
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable, Literal, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from scipy import stats

from llmaudit.io import atomic_write_bytes, atomic_write_json, atomic_write_text

# --------------------------------------------------------------------------------------------------
# Quantizers (SCIENCE.md section 3), applied per tensor to a batch of R tensors
# --------------------------------------------------------------------------------------------------

QUANTIZER_NAMES = (
    "sign", "ternary-33", "ternary-50", "ternary-90", "uniform-2", "uniform-3", "uniform-4", "uniform-5",
)
"""The 8 simple quantizers of the synthetic validation, in the order of the tables."""


def quantize_batched(name: str, w: torch.Tensor) -> torch.Tensor:
    """Quantize R independent tensors at once. w: [R, *tensor] -> same shape (scale/threshold per r)."""
    from llmaudit.quantize import simple

    if name == "sign":
        return simple.sign_quantize(w, batch_dims=1)
    kind, _, arg = name.partition("-")
    if kind == "ternary" and arg in ("33", "50", "90"):
        return simple.ternary_quantize(w, int(arg) / 100.0, batch_dims=1)
    if kind == "uniform" and arg in ("2", "3", "4", "5"):
        return simple.uniform_quantize(w, int(arg), batch_dims=1)
    raise ValueError(f"unknown quantizer {name!r}; allowed: {list(QUANTIZER_NAMES)}")


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------

VARIANT_NAMES = ("converged", "train-loss", "perturbed", "reciprocal", "unquantized-bias")
"""r_Q variants investigated beside the published estimator (see `SyntheticConfig.variants`)."""


class SyntheticConfigError(ValueError):
    """A recipe or override is invalid; the message names the key, the value and what is allowed."""


class SyntheticConfig(BaseModel):
    """Everything that defines the synthetic validation. YAML keys equal these field names."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)

    # data
    k_modes: list[int] = Field(default_factory=lambda: [6, 8, 16])
    """Numbers of mixture components (one data set per k_modes x sigma)."""
    sigmas: list[float] = Field(default_factory=lambda: [1.5, 2.0, 3.0])
    """Standard deviations of the isotropic mixture components."""
    dim: int = Field(128, ge=2)
    """Input dimension (the paper: R^128)."""
    n_train: int = Field(128, ge=2)
    """Training samples per run (= members); as many fresh non-members are drawn for the MIS baseline."""
    n_val: int = Field(1000, ge=2)
    """Fresh validation points (one set per data set, shared by the runs) on which r_Q is computed."""
    n_runs: int = Field(300, ge=5)
    """Independent training runs per data set (the paper: k = 300)."""
    seed: int = 0
    """Master seed; every random draw is derived from it, the data set index and a purpose tag."""
    # classifier training
    lr: float = Field(1e-4, gt=0)
    """Adam learning rate of the classifiers (the paper: 1e-4)."""
    epochs: int = Field(30, ge=2)
    """Training epochs; one trajectory checkpoint after each (the paper: 30)."""
    batch_size: int = Field(1, ge=1)
    """Mini-batch size of the classifier training (not stated in the paper; must divide n_train)."""
    # quantization and r_Q
    quantizers: list[str] = Field(default_factory=lambda: list(QUANTIZER_NAMES))
    """Quantizers to compare (subset of the 8 simple ones)."""
    quantize_bias: bool = True
    """Quantize the bias vector too (per tensor, same rule). True keeps the quantized parameter set
    finite, as the theory assumes; False leaves the bias in full precision."""
    rq_first_epoch: int = Field(1, ge=0)
    """First epoch whose checkpoint enters r_Q (0 = the initialisation; published: 1..epochs)."""
    rq_loss_split: Literal["val", "train"] = "val"
    """Samples on which r_Q's per-sample losses are computed: the validation set (Algorithm 2) or the
    run's own training set."""
    rq_ddof: int = Field(1, ge=0, le=1)
    """Variance convention of sigma_k^2 (1 = unbiased, as llmaudit.indicator.r_q)."""
    # baseline MIS discriminator
    disc_hidden: int = Field(256, ge=1)
    """Hidden width of the MIS discriminator (388 -> hidden -> 1, ReLU)."""
    disc_epochs: int = Field(8, ge=1)
    """Training epochs of the discriminator."""
    disc_lr: float = Field(1e-3, gt=0)
    """Adam learning rate of the discriminator."""
    disc_batch_size: int = Field(256, ge=1)
    """Mini-batch size of the discriminator."""
    disc_train_fraction: float = Field(0.8, gt=0, lt=1)
    """Fraction of the runs whose rows train the discriminator; the other runs' rows test it."""
    disc_dtype: Literal["float32", "bfloat16"] = "float32"
    """Matmul precision of the discriminator (bfloat16 autocast measured 4x SLOWER on our 2-core CPU)."""
    # comparison, stability and variants
    stability_k_runs: Optional[list[int]] = None
    """Subsample sizes of the stability study (each in 2..n_runs); null = 5, 10, 15, 30, 50, 100, 150
    and n_runs, those <= n_runs."""
    stability_resamples: int = Field(20, ge=1)
    """Random subsamples per size for the r_Q stability curve (cheap)."""
    stability_mis_resamples: int = Field(1, ge=0)
    """Random subsamples per size for the MIS stability curve (each retrains the discriminators; 0 = skip)."""
    n_boot: int = Field(1000, ge=10)
    """Bootstrap resamples for confidence intervals and the spread of Spearman's rho."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the intervals."""
    variants: list[str] = Field(default_factory=lambda: list(VARIANT_NAMES))
    """Labelled r_Q variants computed beside the published estimator (never replacing it)."""
    converged_from_epoch: int = Field(21, ge=0)
    """Variant "converged": only checkpoints from this epoch on enter r_Q."""
    perturb_scale: float = Field(0.1, gt=0)
    """Variant "perturbed": noise std, relative to the RMS of each final parameter tensor."""
    perturb_points: int = Field(30, ge=2)
    """Variant "perturbed": number of perturbed copies of the final parameters (plus the final point)."""
    plots: bool = True
    """Write the PNG plots."""
    threads: int = Field(0, ge=0)
    """torch intra-op threads (0 = leave torch's default)."""

    @field_validator("quantizers")
    @classmethod
    def _known_quantizers(cls, v: list[str]) -> list[str]:
        bad = [q for q in v if q not in QUANTIZER_NAMES]
        if bad:
            raise ValueError(f"unknown quantizer(s) {bad}; allowed: {list(QUANTIZER_NAMES)}")
        if len(set(v)) != len(v) or len(v) < 2:
            raise ValueError("need at least 2 distinct quantizers to compare rankings")
        return v

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if x not in VARIANT_NAMES]
        if bad:
            raise ValueError(f"unknown variant(s) {bad}; allowed: {list(VARIANT_NAMES)}")
        return v

    @field_validator("k_modes")
    @classmethod
    def _k_modes_ok(cls, v: list[int]) -> list[int]:
        if not v or any(k < 2 for k in v):
            raise ValueError("k_modes must be a non-empty list of integers >= 2 (both labels must occur)")
        return v

    @field_validator("sigmas")
    @classmethod
    def _sigmas_ok(cls, v: list[float]) -> list[float]:
        if not v or any(not s > 0 for s in v):
            raise ValueError("sigmas must be a non-empty list of positive numbers")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "SyntheticConfig":
        if self.n_train % self.batch_size:
            raise ValueError(f"batch_size={self.batch_size} must divide n_train={self.n_train}")
        if self.rq_first_epoch > self.epochs - 1:
            raise ValueError(f"rq_first_epoch={self.rq_first_epoch} leaves fewer than 2 checkpoints (epochs={self.epochs})")
        if self.converged_from_epoch > self.epochs - 1:
            raise ValueError(f"converged_from_epoch={self.converged_from_epoch} must be <= epochs - 1 = {self.epochs - 1}")
        if self.stability_k_runs is None:
            grid = [k for k in (5, 10, 15, 30, 50, 100, 150) if k < self.n_runs] + [self.n_runs]
            object.__setattr__(self, "stability_k_runs", grid)
        bad = [k for k in self.stability_k_runs if not 2 <= k <= self.n_runs]
        if bad:
            raise ValueError(f"stability_k_runs {bad} outside 2..n_runs={self.n_runs}")
        return self


def _format_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid synthetic-validation config {source}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown key; allowed keys: {sorted(SyntheticConfig.model_fields)}"
        lines.append(f"  {key} = {err.get('input')!r}: {msg}")
    return "\n".join(lines)


def load_config(recipe: Path | str | None = None, overrides: Sequence[str] = ()) -> SyntheticConfig:
    """Defaults <- recipe YAML (keys = field names) <- `key=value` overrides (values parsed as YAML).

    Recipe lookup and override parsing are llmaudit.config's, shared with the audit recipes."""
    from llmaudit.config import RecipeError, apply_overrides, read_recipe_yaml, resolve_recipe_path

    raw: dict[str, Any] = {}
    source = "(defaults)"
    try:
        if recipe is not None:
            path = resolve_recipe_path(recipe)
            raw = read_recipe_yaml(path)
            source = str(path)
        raw = apply_overrides(raw, list(overrides))
    except RecipeError as exc:
        raise SyntheticConfigError(str(exc)) from None
    try:
        return SyntheticConfig.model_validate(raw)
    except ValidationError as exc:
        raise SyntheticConfigError(_format_error(exc, source)) from None


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from a tuple of ints/strings (strings hashed stably, not with Python's hash())."""
    ints = [k if isinstance(k, int) else int.from_bytes(str(k).encode()[:16].ljust(16, b"\0"), "little")
            for k in keys]
    return int(np.random.SeedSequence(ints).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def _gen(*keys: int | str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*keys))


def make_mixture(k_modes: int, dim: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Cluster centres ~ N(0, I_dim): [k_modes, dim]; labels alternate over clusters (0, 1, 0, ...)."""
    centres = torch.randn(k_modes, dim, generator=generator)
    labels = torch.arange(k_modes) % 2
    return centres, labels


def sample_mixture(
    centres: torch.Tensor, labels: torch.Tensor, sigma: float, shape: tuple[int, ...], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """i.i.d. draws: cluster uniform, x = centre + sigma * N(0, I). Returns x [*shape, dim], y [*shape] (int64)."""
    cluster = torch.randint(0, centres.shape[0], shape, generator=generator)
    noise = torch.randn(*shape, centres.shape[1], generator=generator)
    return centres[cluster] + sigma * noise, labels[cluster]


def make_dataset(cfg: SyntheticConfig, ds_index: int, k_modes: int, sigma: float, n_runs: int | None = None) -> dict[str, torch.Tensor]:
    """All samples of one data set, deterministic in (cfg.seed, ds_index).

    x_train/y_train [R, n, dim]/[R, n] (members), x_out/y_out (fresh non-members, same shape),
    x_val/y_val [n_val, dim]/[n_val], order [R, epochs, n] (mini-batch order of each run)."""
    R = cfg.n_runs if n_runs is None else n_runs
    centres, labels = make_mixture(k_modes, cfg.dim, _gen(cfg.seed, ds_index, "centres"))
    x_train, y_train = sample_mixture(centres, labels, sigma, (R, cfg.n_train), _gen(cfg.seed, ds_index, "train"))
    x_out, y_out = sample_mixture(centres, labels, sigma, (R, cfg.n_train), _gen(cfg.seed, ds_index, "out"))
    x_val, y_val = sample_mixture(centres, labels, sigma, (cfg.n_val,), _gen(cfg.seed, ds_index, "val"))
    order = torch.argsort(torch.rand(R, cfg.epochs, cfg.n_train, generator=_gen(cfg.seed, ds_index, "order")), dim=-1)
    return {"x_train": x_train, "y_train": y_train, "x_out": x_out, "y_out": y_out,
            "x_val": x_val, "y_val": y_val, "order": order, "centres": centres}


# --------------------------------------------------------------------------------------------------
# Classifier training: batched and per-run reference
# --------------------------------------------------------------------------------------------------


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


class _threads:
    """Temporarily set torch's intra-op threads (tiny batched ops run fastest on one thread)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __enter__(self) -> None:
        self.old = torch.get_num_threads()
        if self.n > 0:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc: object) -> None:
        torch.set_num_threads(self.old)


def train_batched(
    x: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, order: torch.Tensor,
    *, lr: float, batch_size: int, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
    threads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train R linear classifiers at once with Adam on mean cross-entropy, one checkpoint per epoch.

    x [R, n, d], y [R, n], w0 [R, C, d], b0 [R, C], order [R, E, n] (sample order per epoch).
    Returns the trajectory W [E + 1, R, C, d], b [E + 1, R, C] (index 0 = initialisation).

    Weight and bias are packed as theta [R, C, d + 1] against inputs [x, 1]. The gradient of the
    mean cross-entropy is written out, (softmax - onehot)^T [x, 1] / B, and Adam is torch.optim.Adam's
    update rule (no weight decay, no amsgrad) applied elementwise: per run this is exactly R
    independent nn.Linear + Adam trainings (`train_per_run`), without autograd's per-step overhead."""
    R, n, d = x.shape
    E = order.shape[1]
    b1, b2 = betas
    with _threads(threads), torch.no_grad():
        xa = torch.cat([x, torch.ones(R, n, 1, dtype=x.dtype)], -1)               # [R, n, d + 1]
        theta = torch.cat([w0, b0[..., None]], -1).clone()                        # [R, C, d + 1]
        m = torch.zeros_like(theta)
        v = torch.zeros_like(theta)
        traj = [theta.clone()]
        run_idx = torch.arange(R)[:, None]
        step = 0
        for e in range(E):
            perm = order[:, e]
            for s in range(0, n, batch_size):
                idx = perm[:, s:s + batch_size]                                   # [R, B]
                xb, yb = xa[run_idx, idx], y[run_idx, idx]                       # [R, B, d+1], [R, B]
                logits = torch.bmm(xb, theta.transpose(1, 2))                    # [R, B, C]
                g = torch.softmax(logits, -1)
                g.scatter_add_(-1, yb[..., None], torch.full_like(g[..., :1], -1.0))
                grad = torch.bmm(g.transpose(1, 2), xb).div_(idx.shape[1])       # [R, C, d+1]
                step += 1
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                bc1 = 1 - b1 ** step
                bc2 = 1 - b2 ** step
                denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                theta.addcdiv_(m, denom, value=-lr / bc1)
            traj.append(theta.clone())
        t = torch.stack(traj)
    return t[..., :d].contiguous(), t[..., d].contiguous()


def train_per_run(
    x: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, order: torch.Tensor,
    *, lr: float, batch_size: int,
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
                idx = order[r, e, s:s + batch_size]
                loss = F.cross_entropy(model(x[r, idx]), y[r, idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            tw.append(model.weight.detach().clone())
            tb.append(model.bias.detach().clone())
        out_w.append(torch.stack(tw))
        out_b.append(torch.stack(tb))
    return torch.stack(out_w, 1), torch.stack(out_b, 1)


# --------------------------------------------------------------------------------------------------
# r_Q, batched over runs
# --------------------------------------------------------------------------------------------------


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


def r_q_batched(losses: torch.Tensor | np.ndarray, *, ddof: int = 1) -> np.ndarray:
    """Algorithm 2 (SCIENCE.md section 2) for R runs at once; equals `llmaudit.indicator.r_q` per run.

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
    m = L.mean(-1)                                                       # [R, K]
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
    k1 = m_masked.argmin(-1)                                             # lowest-loss point
    L1 = L[torch.arange(R), k1]                                          # [R, n]
    sigma2 = (L - L1[:, None, :]).var(-1, correction=ddof)               # [R, K]
    delta = m - m.gather(1, k1[:, None])
    d2 = delta ** 2
    ratio = torch.where(d2 > 0, sigma2 / torch.where(d2 > 0, d2, torch.ones_like(d2)), torch.full_like(d2, math.inf))
    valid = keep.clone()
    valid[torch.arange(R), k1] = False
    worst = torch.where(valid, ratio, torch.full_like(ratio, -math.inf)).max(-1).values
    r = torch.where(worst > 0, 0.5 / worst, torch.full_like(worst, math.inf))
    r = torch.where(torch.isinf(worst) & (worst > 0), torch.zeros_like(r), r)
    r = torch.where(n_points < 2, torch.full_like(r, math.nan), r)
    return r.numpy(), n_points.numpy()


def _quantized_params(name: str, w: torch.Tensor, b: torch.Tensor, quantize_bias: bool) -> tuple[torch.Tensor, torch.Tensor]:
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
        z = (wq.reshape(K * R * C, d) @ x.T).view(K, R, C, -1).add_(bq[..., None])         # [K, R, C, n]
        return -torch.log_softmax(z, 2).gather(2, y.view(1, 1, 1, -1).expand(K, R, 1, -1)).squeeze(2).transpose(0, 1)
    n = x.shape[1]
    z = torch.bmm(x, wq.permute(1, 3, 0, 2).reshape(R, d, K * C)).view(R, n, K, C)         # [R, n, K, C]
    z = z + bq.transpose(0, 1)[:, None]
    loss = -torch.log_softmax(z, -1).gather(-1, y.view(R, n, 1, 1).expand(R, n, K, 1)).squeeze(-1)
    return loss.permute(0, 2, 1)                                                            # [R, K, n]


def r_q_from_points(
    name: str, w: torch.Tensor, b: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *,
    quantize_bias: bool, ddof: int, return_points: bool = False,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """r_Q per run from K parameter points per run. w [K, R, C, d], b [K, R, C]; x [n, d] (shared)
    or [R, n, d] (per run). Returns [R]."""
    K, R = w.shape[:2]
    wq, bq = _quantized_params(name, w.reshape(K * R, *w.shape[2:]), b.reshape(K * R, -1), quantize_bias)
    losses = point_losses(wq.view(w.shape), bq.view(b.shape), x, y)
    r, n_points = r_q_batched_details(losses, ddof=ddof)
    return (r, n_points) if return_points else r


def r_q_all_variants(
    name: str, traj_w: torch.Tensor, traj_b: torch.Tensor, x_rq: torch.Tensor, y_rq: torch.Tensor,
    x_train: torch.Tensor, y_train: torch.Tensor, pert: tuple[torch.Tensor, torch.Tensor] | None,
    cfg: SyntheticConfig, variants: Sequence[str],
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
    if x_rq.dim() == 2:
        z_w = (wq.reshape(K * R * C, d) @ x_rq.T).view(K, R, C, -1)                        # [K, R, C, n]
        yy = y_rq.view(1, 1, 1, -1).expand(K, R, 1, -1)

        def losses(bias: torch.Tensor) -> torch.Tensor:
            z = z_w + bias[..., None]
            return -torch.log_softmax(z, 2).gather(2, yy).squeeze(2).transpose(0, 1)       # [R, K, n]
    else:
        def losses(bias: torch.Tensor) -> torch.Tensor:
            return point_losses(wq, bias, x_rq, y_rq)
    L = losses(b_pub)
    out["published"], pts = r_q_batched_details(L[:, ep], ddof=cfg.rq_ddof)
    if "converged" in variants:
        out["converged"] = r_q_batched_details(L[:, cs], ddof=cfg.rq_ddof)[0]
    del L
    if "unquantized-bias" in variants:
        out["unquantized-bias"] = r_q_batched_details(losses(b_alt)[:, ep], ddof=cfg.rq_ddof)[0]
    if "train-loss" in variants:
        out["train-loss"] = r_q_batched_details(point_losses(wq[ep], b_pub[ep], x_train, y_train), ddof=cfg.rq_ddof)[0]
    if "perturbed" in variants and pert is not None:
        out["perturbed"] = r_q_from_points(name, pert[0], pert[1], x_rq, y_rq, quantize_bias=cfg.quantize_bias, ddof=cfg.rq_ddof)
    return out, pts


# --------------------------------------------------------------------------------------------------
# Baseline MIS: one discriminator per quantizer, trained jointly as batched tensors
# --------------------------------------------------------------------------------------------------


def mis_features(
    name: str, w: torch.Tensor, b: torch.Tensor, x_in: torch.Tensor, y_in: torch.Tensor,
    x_out: torch.Tensor, y_out: torch.Tensor, *, quantize_bias: bool,
) -> dict[str, torch.Tensor]:
    """Rows of the MIS baseline for final parameters w [R, C, d], b [R, C] (SCIENCE.md section 5).

    Per run r: n members (x_in[r]) and n fresh non-members (x_out[r]). Returns x [R, 2n, d],
    y [R, 2n], theta [R, C*d + C] (flattened quantized weights then bias), loss [R, 2n] (of the
    quantized model), member [R, 2n] (1 = member). Row features: [x, y, theta, loss] = d + 1 + C(d+1) + 1."""
    wq, bq = _quantized_params(name, w, b, quantize_bias)
    x = torch.cat([x_in, x_out], 1)
    y = torch.cat([y_in, y_out], 1)
    loss = per_sample_losses(wq, bq, x, y)
    member = torch.cat([torch.ones_like(y_in), torch.zeros_like(y_out)], 1).float()
    return {"x": x, "y": y.float(), "theta": torch.cat([wq.flatten(1), bq], 1), "loss": loss, "member": member}


def _disc_prepare(
    feats: list[dict[str, torch.Tensor]], train_runs: torch.Tensor, test_runs: torch.Tensor,
) -> dict[str, Any]:
    """Standardised discriminator inputs (statistics of the training rows), shared by the batched
    trainer and the per-quantizer reference. Rows are kept factorised: xy [R, m, d+1] (shared by the
    quantizers), theta_s [Q, R, P] (one per run), loss_s [Q, R, m], member [R, m]."""
    Q = len(feats)
    x = feats[0]["x"]                                     # shared by all quantizers (same rows)
    R, m, d = x.shape

    def flat_rows(t: torch.Tensor, runs: torch.Tensor) -> torch.Tensor:
        return t[runs].reshape(len(runs) * m, *t.shape[2:])

    xtr = flat_rows(x, train_runs)
    ytr = flat_rows(feats[0]["y"], train_runs)[:, None]
    xy_tr = torch.cat([xtr, ytr], 1)                      # [N, d + 1] shared
    mu_xy, sd_xy = xy_tr.mean(0), xy_tr.std(0).clamp_min(1e-6)
    theta = torch.stack([f["theta"] for f in feats])      # [Q, R, P]
    loss = torch.stack([f["loss"] for f in feats])        # [Q, R, m]
    mu_th = theta[:, train_runs].mean(1, keepdim=True)
    sd_th = theta[:, train_runs].std(1, keepdim=True).clamp_min(1e-6)
    lt = loss[:, train_runs].reshape(Q, -1)
    return {"Q": Q, "R": R, "m": m, "d": d, "P": theta.shape[-1],
            "xy": (torch.cat([x, feats[0]["y"][..., None]], -1) - mu_xy) / sd_xy,
            "theta_s": (theta - mu_th) / sd_th,
            "loss_s": (loss - lt.mean(1)[:, None, None]) / lt.std(1).clamp_min(1e-6)[:, None, None],
            "member": feats[0]["member"]}


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


def train_discriminators(
    feats: list[dict[str, torch.Tensor]], train_runs: torch.Tensor, test_runs: torch.Tensor, *,
    hidden: int, epochs: int, lr: float, batch_size: int, dtype: str, seed: int,
    threads: int = 0, return_state: bool = False,
) -> dict[str, Any]:
    """Train one [x, y, theta, loss] -> hidden -> 1 MLP per entry of `feats` (one per quantizer),
    all at once as batched tensors, on the rows of `train_runs`; score the rows of `test_runs`.

    Per quantizer this is exactly `train_discriminator_reference` (an nn.Linear-ReLU-nn.Linear MLP on
    the full 388-wide rows, mean BCE, torch.optim.Adam, same init and mini-batch order): the
    discriminators share nothing but the mini-batch row order. The forward and backward passes are
    written out (no autograd) over a leading quantizer dimension, and Adam's update (elementwise, so
    stacking is exact) runs once over one flat buffer holding all parameters. The first layer's
    theta block is applied once per run of the mini-batch and gathered per row (theta is constant
    within a run); its gradient is summed per run before the product with theta.
    Features are standardised with the training rows' mean and std.
    Returns correct [Q, len(test_runs)] (fraction of correctly classified test rows per run) and
    train_acc [Q]; with `return_state` also the final parameters and the row permutations."""
    if dtype != "float32":
        # The written-out backward is float32; keep the autograd path for the bfloat16 setting.
        return _train_discriminators_autograd(feats, train_runs, test_runs, hidden=hidden, epochs=epochs, lr=lr,
                                              batch_size=batch_size, dtype=dtype, seed=seed)
    pre = _disc_prepare(feats, train_runs, test_runs)
    Q, m, d, P = pre["Q"], pre["m"], pre["d"], pre["P"]
    g = _gen(seed, "disc")
    init = _disc_init(Q, d, P, hidden, g)
    n_tr = len(train_runs) * m
    perms = [torch.randperm(n_tr, generator=g) for _ in range(epochs)]   # same draws as one per epoch
    names = list(init)
    sizes = [init[k].numel() for k in names]
    # all parameters of all discriminators live in ONE flat buffer (prm: views into it), their
    # gradients in another: one Adam (fused kernel where torch has one) updates everything at once.
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

    row_run = torch.arange(len(train_runs)).repeat_interleave(m)
    th_tr = pre["theta_s"][:, train_runs].contiguous()                  # [Q, Rtr, P]
    xy_trs = pre["xy"][train_runs].reshape(n_tr, d + 1)
    loss_tr = pre["loss_s"][:, train_runs].reshape(Q, n_tr)
    target_tr = pre["member"][train_runs].reshape(n_tr)

    # Activations are laid out [B, Q, H] (row-major over the Q*hidden columns of w_xy), so the
    # shared-input products are plain [B, d+1] x [d+1, Q*H] matmuls without transposed copies.
    def forward(run_of_row: torch.Tensor, xy_rows: torch.Tensor, loss_rows: torch.Tensor, th_runs: torch.Tensor):
        # loss_rows [B, Q]
        uniq, inv = torch.unique(run_of_row, return_inverse=True)
        th_u = th_runs[:, uniq]                                          # [Q, R', P]
        h_th = torch.bmm(th_u, prm["w_th"]).transpose(0, 1).reshape(-1, Q * hidden)   # [R', Q*H]
        h = torch.addmm(h_th.index_select(0, inv), xy_rows, prm["w_xy"]).view(-1, Q, hidden)   # [B, Q, H]
        h.addcmul_(loss_rows[..., None], prm["w_l"]).add_(prm["b1"])
        a = h.clamp_min_(0)                                              # relu in place: a > 0 <=> h > 0
        logits = torch.bmm(a.transpose(0, 1), prm["w2"][..., None]).squeeze(-1).add_(prm["b2"][:, None])  # [Q, B]
        return logits, a, th_u, inv, uniq.numel()

    loss_tr_t = loss_tr.T.contiguous()                                   # [n_tr, Q]
    with _threads(threads), torch.no_grad():
        for e in range(epochs):
            perm = perms[e]
            for s in range(0, n_tr, batch_size):
                idx = perm[s:s + batch_size]
                B = idx.numel()
                xy_b, loss_b, t_b = xy_trs[idx], loss_tr_t[idx], target_tr[idx]
                logits, a, th_u, inv, nu = forward(row_run[idx], xy_b, loss_b, th_tr)
                # d(sum_q mean_b BCE_q)/d logit = (sigmoid(logit) - target) / B, per quantizer
                gl = (torch.sigmoid(logits) - t_b).div_(B)                  # [Q, B]
                a_t = a.transpose(0, 1)                                     # [Q, B, H] view
                torch.bmm(gl[:, None, :], a_t, out=grd["w2"][:, None, :])
                torch.sum(gl, 1, out=grd["b2"])
                dh = (a > 0).to(a.dtype).mul_(gl.T[..., None]).mul_(prm["w2"])   # [B, Q, H]
                torch.sum(dh, 0, out=grd["b1"])
                torch.bmm(loss_b.T[:, None, :], dh.transpose(0, 1), out=grd["w_l"][:, None, :])
                torch.mm(xy_b.T, dh.view(B, Q * hidden), out=grd["w_xy"])
                dh_u = torch.zeros(nu, Q, hidden).index_add_(0, inv, dh)
                torch.bmm(th_u.transpose(1, 2), dh_u.transpose(0, 1), out=grd["w_th"])
                opt.step()                                                  # elementwise: exact per discriminator
        te = test_runs
        n_te = len(te) * m
        logits = forward(torch.arange(len(te)).repeat_interleave(m), pre["xy"][te].reshape(n_te, d + 1),
                         pre["loss_s"][:, te].reshape(Q, n_te).T, pre["theta_s"][:, te])[0]
        correct = ((logits > 0).float() == pre["member"][te].reshape(n_te)).float().reshape(Q, len(te), m).mean(-1)
        train_acc = torch.cat([((forward(row_run[s:s + 8192], xy_trs[s:s + 8192], loss_tr_t[s:s + 8192], th_tr)[0] > 0).float()
                                == target_tr[s:s + 8192]).float() for s in range(0, n_tr, 8192)], 1).mean(-1)
    out: dict[str, Any] = {"correct": correct.numpy(), "train_acc": train_acc.numpy()}
    if return_state:
        out["params"] = {k: v.clone() for k, v in prm.items()}
        out["init"] = init
        out["perms"] = perms
        out["prepared"] = pre
    return out


def train_discriminator_reference(
    pre: dict[str, Any], q: int, init: dict[str, torch.Tensor], perms: Sequence[torch.Tensor],
    train_runs: torch.Tensor, test_runs: torch.Tensor, *, hidden: int, lr: float, batch_size: int,
) -> dict[str, Any]:
    """Reference for ONE discriminator (quantizer index q of `train_discriminators`): the plain
    Linear(388, hidden) - ReLU - Linear(hidden, 1) network on materialised 388-wide rows
    [x, y, theta, loss], mean BCE, torch.optim.Adam, autograd; the same initial parameters (slice q
    of the batched init) and the same row order per epoch. Returns its parameters in the batched
    layout (slice q) and correct / train_acc."""
    m, d, P = pre["m"], pre["d"], pre["P"]

    def rows(runs: torch.Tensor) -> torch.Tensor:
        n = len(runs) * m
        th = pre["theta_s"][q, runs][:, None, :].expand(-1, m, -1).reshape(n, P)
        return torch.cat([pre["xy"][runs].reshape(n, d + 1), th, pre["loss_s"][q, runs].reshape(n, 1)], 1)

    l1, l2 = torch.nn.Linear(d + 1 + P + 1, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        l1.weight.copy_(torch.cat([init["w_xy"][:, q * hidden:(q + 1) * hidden], init["w_th"][q], init["w_l"][q][None]]).T)
        l1.bias.copy_(init["b1"][q])
        l2.weight.copy_(init["w2"][q][None])
        l2.bias.copy_(init["b2"][q][None])
    net = torch.nn.Sequential(l1, torch.nn.ReLU(), l2)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    x_tr, t_tr = rows(train_runs), pre["member"][train_runs].reshape(-1)
    for perm in perms:
        for s in range(0, len(perm), batch_size):
            idx = perm[s:s + batch_size]
            loss = F.binary_cross_entropy_with_logits(net(x_tr[idx]).squeeze(-1), t_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        te_logits = net(rows(test_runs)).squeeze(-1)
        correct = ((te_logits > 0).float() == pre["member"][test_runs].reshape(-1)).float().reshape(len(test_runs), m).mean(-1)
        train_acc = ((net(x_tr).squeeze(-1) > 0).float() == t_tr).float().mean()
        w1 = l1.weight.T
        params = {"w_xy": w1[:d + 1], "w_th": w1[d + 1:d + 1 + P], "w_l": w1[-1], "b1": l1.bias.clone(),
                  "w2": l2.weight[0].clone(), "b2": l2.bias[0].clone()}
    return {"params": params, "correct": correct.numpy(), "train_acc": float(train_acc)}


def _train_discriminators_autograd(
    feats: list[dict[str, torch.Tensor]], train_runs: torch.Tensor, test_runs: torch.Tensor, *,
    hidden: int, epochs: int, lr: float, batch_size: int, dtype: str, seed: int,
) -> dict[str, np.ndarray]:
    """Previous autograd implementation (torch.optim.Adam over the stacked parameters), kept for
    disc_dtype=bfloat16 (autocast). Same init and row order as `train_discriminators`.

    Features are standardised with the training rows' mean and std. The first layer's theta block is
    applied once per run and gathered per row (theta is constant within a run): mathematically the
    same network as applying the full 388-wide layer to every row, without the redundant work.
    Returns correct [Q, len(test_runs)] (fraction of correctly classified test rows per run) and
    train_acc [Q]."""
    g = _gen(seed, "disc")
    pre = _disc_prepare(feats, train_runs, test_runs)
    Q, R, m, d, P = pre["Q"], pre["R"], pre["m"], pre["d"], pre["P"]
    theta_s, loss_s, xy_all, member = pre["theta_s"], pre["loss_s"], pre["xy"], pre["member"]
    params = _disc_init(Q, d, P, hidden, g)
    for p in params.values():
        p.requires_grad_(True)
    opt = torch.optim.Adam(params.values(), lr=lr)
    use_bf16 = dtype == "bfloat16"

    def forward(run_of_row: torch.Tensor, xy_rows: torch.Tensor, loss_rows: torch.Tensor, th_runs: torch.Tensor) -> torch.Tensor:
        # run_of_row [B] indexes th_runs [Q, R', P]; xy_rows [B, d+1]; loss_rows [Q, B] -> logits [Q, B]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            h_xy = (xy_rows @ params["w_xy"]).reshape(-1, Q, hidden).transpose(0, 1)   # [Q, B, H]
            # theta is constant within a run: project each run of the batch once, then gather per row.
            uniq, inv = torch.unique(run_of_row, return_inverse=True)
            h_th = torch.bmm(th_runs[:, uniq], params["w_th"])                         # [Q, R', H]
        h = h_xy.float() + h_th.float()[:, inv] + loss_rows[..., None] * params["w_l"][:, None] + params["b1"][:, None]
        return (torch.relu(h) * params["w2"][:, None]).sum(-1) + params["b2"][:, None]

    n_tr = len(train_runs) * m
    row_run = torch.arange(len(train_runs)).repeat_interleave(m)
    row_pos = torch.arange(m).repeat(len(train_runs))
    th_tr = theta_s[:, train_runs]
    xy_trs = xy_all[train_runs].reshape(n_tr, d + 1)
    loss_tr = loss_s[:, train_runs].reshape(Q, n_tr)
    target_tr = member[train_runs].reshape(n_tr)
    for _ in range(epochs):
        perm = torch.randperm(n_tr, generator=g)
        for s in range(0, n_tr, batch_size):
            idx = perm[s:s + batch_size]
            logits = forward(row_run[idx], xy_trs[idx], loss_tr[:, idx], th_tr)
            bce = F.binary_cross_entropy_with_logits(logits, target_tr[idx].expand(Q, -1), reduction="mean") * Q
            opt.zero_grad(set_to_none=True)
            bce.backward()
            opt.step()
    with torch.no_grad():
        th_te = theta_s[:, test_runs]
        n_te = len(test_runs) * m
        logits = forward(torch.arange(len(test_runs)).repeat_interleave(m), xy_all[test_runs].reshape(n_te, d + 1),
                         loss_s[:, test_runs].reshape(Q, n_te), th_te)
        correct = ((logits > 0).float() == member[test_runs].reshape(n_te)).float().reshape(Q, len(test_runs), m).mean(-1)
        train_logits = forward(row_run, xy_trs, loss_tr, th_tr)
        train_acc = ((train_logits > 0).float() == target_tr).float().mean(-1)
    return {"correct": correct.numpy(), "train_acc": train_acc.numpy()}


def split_runs(n_runs: int, train_fraction: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n_runs, generator=generator)
    n_tr = min(max(1, int(round(train_fraction * n_runs))), n_runs - 1)
    return perm[:n_tr].sort().values, perm[n_tr:].sort().values


def mis_estimate(
    names: Sequence[str], w: torch.Tensor, b: torch.Tensor, data: dict[str, torch.Tensor], runs: torch.Tensor,
    cfg: SyntheticConfig, seed_key: tuple,
) -> dict[str, Any]:
    """Baseline MIS (2 - 2 x test accuracy) per quantizer from the final parameters of `runs`."""
    feats = [mis_features(q, w[runs], b[runs], data["x_train"][runs], data["y_train"][runs],
                          data["x_out"][runs], data["y_out"][runs], quantize_bias=cfg.quantize_bias) for q in names]
    tr, te = split_runs(len(runs), cfg.disc_train_fraction, _gen(cfg.seed, *seed_key, "split"))
    out = train_discriminators(feats, tr, te, hidden=cfg.disc_hidden, epochs=cfg.disc_epochs, lr=cfg.disc_lr,
                               batch_size=cfg.disc_batch_size, dtype=cfg.disc_dtype, seed=derive_seed(cfg.seed, *seed_key))
    acc = out["correct"].mean(1)
    return {"mis": 2 - 2 * acc, "test_acc": acc, "train_acc": out["train_acc"], "correct_per_run": out["correct"],
            "n_train_runs": len(tr), "n_test_runs": len(te)}


# --------------------------------------------------------------------------------------------------
# Comparison helpers
# --------------------------------------------------------------------------------------------------


def _finite_mean(a: np.ndarray, axis: int = -1) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    ok = np.isfinite(a)
    with np.errstate(invalid="ignore"):
        return np.where(ok.any(axis), np.where(ok, a, 0).sum(axis) / np.maximum(ok.sum(axis), 1), np.nan)


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3 or np.ptp(a[ok]) == 0 or np.ptp(b[ok]) == 0:
        return math.nan
    return float(stats.spearmanr(a[ok], b[ok]).statistic)


def ranks_secure_first(values: Sequence[float]) -> list[float]:
    """Rank 1 = most secure = highest value; ties averaged."""
    v = np.asarray(values, float)
    return stats.rankdata(-np.where(np.isnan(v), -np.inf, v), method="average").tolist()


def boot_spearman(per_run: np.ndarray, correct: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Spearman(r_Q means, MIS) under a bootstrap over runs: r_Q runs resampled [Q, R] and, for MIS,
    the discriminator's test runs resampled [Q, R_test] (discriminator not retrained). Returns [n_boot]."""
    R, Rt = per_run.shape[1], correct.shape[1]
    rq = np.empty((n_boot, per_run.shape[0]))
    mis = np.empty((n_boot, correct.shape[0]))
    for i in range(n_boot):                       # the same draws, in the same order, as one at a time
        rq[i] = _finite_mean(per_run[:, rng.integers(0, R, R)])
        mis[i] = 2 - 2 * correct[:, rng.integers(0, Rt, Rt)].mean(1)
    return spearman_rows(rq, mis)


def spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`spearman` of each row pair of a, b [N, Q] (ties averaged): Pearson's r of the average ranks,
    vectorised for the rows that are all finite and not constant, `spearman` itself for the others."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    out = np.full(len(a), math.nan)
    ok = np.isfinite(a).all(1) & np.isfinite(b).all(1)
    ok &= (np.ptp(np.where(ok[:, None], a, 0), 1) > 0) & (np.ptp(np.where(ok[:, None], b, 0), 1) > 0) & (a.shape[1] >= 3)
    if ok.any():
        ra = stats.rankdata(a[ok], axis=1)
        rb = stats.rankdata(b[ok], axis=1)
        ra -= ra.mean(1, keepdims=True)
        rb -= rb.mean(1, keepdims=True)
        r = (ra * rb).sum(1) / np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))
        out[ok] = np.clip(r, -1.0, 1.0)
    for i in np.flatnonzero(~ok):
        out[i] = spearman(a[i], b[i])
    return out


def _ci(samples: np.ndarray, confidence: float) -> list[float]:
    s = np.asarray(samples, float)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return [math.nan, math.nan]
    a = (1 - confidence) / 2
    return [float(np.quantile(s, a)), float(np.quantile(s, 1 - a))]


# --------------------------------------------------------------------------------------------------
# One data set
# --------------------------------------------------------------------------------------------------


def run_dataset(cfg: SyntheticConfig, ds_index: int, k_modes: int, sigma: float, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the runs of one data set and compute r_Q (published + variants), MIS and stability."""
    t0 = time.perf_counter()
    names = list(cfg.quantizers)
    data = make_dataset(cfg, ds_index, k_modes, sigma)
    R = cfg.n_runs
    seeds = [derive_seed(cfg.seed, ds_index, "init", r) for r in range(R)]
    w0, b0 = init_linear(seeds, cfg.dim)
    traj_w, traj_b = train_batched(data["x_train"], data["y_train"], w0, b0, data["order"], lr=cfg.lr, batch_size=cfg.batch_size)
    t_train = time.perf_counter() - t0
    w_fin, b_fin = traj_w[-1], traj_b[-1]
    with torch.no_grad():
        acc_val = (per_sample_losses(w_fin, b_fin, data["x_val"], data["y_val"]) < math.log(2)).float().mean().item()
        train_loss = per_sample_losses(w_fin, b_fin, data["x_train"], data["y_train"]).mean().item()
        val_loss = per_sample_losses(w_fin, b_fin, data["x_val"], data["y_val"]).mean().item()

    # r_Q: the published estimator and the labelled variants
    t1 = time.perf_counter()
    ep = slice(cfg.rq_first_epoch, None)
    x_rq, y_rq = (data["x_val"], data["y_val"]) if cfg.rq_loss_split == "val" else (data["x_train"], data["y_train"])
    per_run: dict[str, dict[str, np.ndarray]] = {"published": {}}
    variants = list(cfg.variants)
    for v in variants:
        if v != "reciprocal":
            per_run[v] = {}
    pert = None
    if "perturbed" in variants:
        g = _gen(cfg.seed, ds_index, "perturb")
        rms_w = w_fin.pow(2).mean((-1, -2), keepdim=True).sqrt()
        rms_b = b_fin.pow(2).mean(-1, keepdim=True).sqrt()
        P = cfg.perturb_points
        pert = (torch.cat([w_fin[None], w_fin + cfg.perturb_scale * rms_w * torch.randn(P, *w_fin.shape, generator=g)]),
                torch.cat([b_fin[None], b_fin + cfg.perturb_scale * rms_b * torch.randn(P, *b_fin.shape, generator=g)]))
    n_points = {}
    with torch.no_grad():
        for q in names:
            est, pts = r_q_all_variants(q, traj_w, traj_b, x_rq, y_rq, data["x_train"], data["y_train"], pert, cfg, variants)
            n_points[q] = float(pts.mean())
            for v, r in est.items():
                per_run[v][q] = r
    if "reciprocal" in variants:
        # max_k sigma_k^2 / delta_k^2 = 1 / (2 r_Q) per run (llmaudit.indicator.r_q_reciprocal); a RISK score.
        with np.errstate(divide="ignore"):
            per_run["reciprocal"] = {q: np.where(v == 0, np.inf, 0.5 / v) for q, v in per_run["published"].items()}
    t_rq = time.perf_counter() - t1

    # Baseline MIS on all runs
    t2 = time.perf_counter()
    mis = mis_estimate(names, w_fin, b_fin, data, torch.arange(R), cfg, (ds_index, "mis", R))
    t_mis = time.perf_counter() - t2

    # Aggregates and comparison
    from llmaudit.indicator import aggregate_r_q

    rng = np.random.default_rng(derive_seed(cfg.seed, ds_index, "boot"))
    table = {}
    for i, q in enumerate(names):
        agg = aggregate_r_q(per_run["published"][q], n_boot=cfg.n_boot, confidence=cfg.confidence, seed=derive_seed(cfg.seed, ds_index, q))
        boot_acc = np.array([mis["correct_per_run"][i][rng.integers(0, mis["n_test_runs"], mis["n_test_runs"])].mean() for _ in range(cfg.n_boot)])
        table[q] = {"r_q": agg, "mis": float(mis["mis"][i]), "mis_ci": sorted(_ci(2 - 2 * boot_acc, cfg.confidence)),
                    "disc_test_acc": float(mis["test_acc"][i]), "disc_train_acc": float(mis["train_acc"][i]),
                    "mean_distinct_points": n_points[q]}
    rq_mean = np.array([table[q]["r_q"]["mean"] for q in names])
    mis_v = np.array([table[q]["mis"] for q in names])
    for q, rr, mr in zip(names, ranks_secure_first(rq_mean), ranks_secure_first(mis_v)):
        table[q]["rank_r_q"], table[q]["rank_mis"] = rr, mr
    rq_mat = {v: np.stack([per_run[v][q] for q in names]) for v in per_run}
    comparison = {}
    for v, mat in rq_mat.items():
        means = _finite_mean(mat)
        boots = boot_spearman(mat, mis["correct_per_run"], cfg.n_boot, rng)
        comparison[v] = {"spearman": spearman(means, mis_v), "boot_mean": float(np.nanmean(boots)),
                         "boot_std": float(np.nanstd(boots)), "boot_ci": _ci(boots, cfg.confidence),
                         "mean_by_quantizer": dict(zip(names, means.tolist())),
                         "n_undefined_runs": {q: int(np.isnan(per_run[v][q]).sum()) for q in names},
                         "_boots": boots}

    # Stability study
    t3 = time.perf_counter()
    from llmaudit.indicator import ranking_stability

    stab_rq = ranking_stability({q: per_run["published"][q] for q in names}, cfg.stability_k_runs,
                                n_resamples=cfg.stability_resamples, seed=derive_seed(cfg.seed, ds_index, "stab"))
    stab_mis = []
    if cfg.stability_mis_resamples > 0:
        gsub = _gen(cfg.seed, ds_index, "stab-mis")
        for k in cfg.stability_k_runs:
            rhos = []
            n_rep = 1 if k == R else cfg.stability_mis_resamples
            for rep in range(n_rep):
                runs = torch.randperm(R, generator=gsub)[:k].sort().values
                sub = mis_estimate(names, w_fin, b_fin, data, runs, cfg, (ds_index, "stab", k, rep))
                rhos.append(spearman(sub["mis"], mis_v))
            stab_mis.append({"k_runs": k, "n_resamples": n_rep, "rhos": rhos, "mean_rho": float(np.nanmean(rhos)) if np.isfinite(rhos).any() else math.nan})
    t_stab = time.perf_counter() - t3

    elapsed = time.perf_counter() - t0
    log(f"[{ds_index + 1}] k_modes={k_modes} sigma={sigma}: spearman(r_Q, MIS) = {comparison['published']['spearman']:+.2f}"
        f"  (train {t_train:.1f}s, r_Q {t_rq:.1f}s, MIS {t_mis:.1f}s, stability {t_stab:.1f}s)")
    return {
        "k_modes": k_modes, "sigma": sigma, "name": f"k{k_modes}-s{sigma:g}",
        "classifier": {"val_acc_full_precision": acc_val, "train_loss_final": train_loss, "val_loss_final": val_loss},
        "table": table, "comparison": comparison,
        "stability": {"r_q": stab_rq, "mis": stab_mis},
        "r_q_per_run": {v: {q: per_run[v][q].tolist() for q in names} for v in per_run},
        "mis_correct_per_test_run": {q: mis["correct_per_run"][i].tolist() for i, q in enumerate(names)},
        "timing_s": {"train": t_train, "r_q": t_rq, "mis": t_mis, "stability": t_stab, "total": elapsed},
    }


# --------------------------------------------------------------------------------------------------
# The whole protocol, reports and plots
# --------------------------------------------------------------------------------------------------

VARIANT_DOC = {
    "published": "Algorithm 2 on the trajectory: quantized checkpoints of epochs rq_first_epoch..epochs, "
                 "per-sample losses on rq_loss_split, identical points merged, mean over runs.",
    "converged": "VARIANT: only checkpoints from converged_from_epoch on (late phase of the trajectory).",
    "train-loss": "VARIANT: per-sample losses on the run's own training samples instead of the validation set.",
    "perturbed": "VARIANT: points Q(theta_final + eps), eps ~ N(0, (perturb_scale * RMS(tensor))^2), "
                 "perturb_points copies plus the final point, instead of the trajectory.",
    "reciprocal": "VARIANT (sign convention): max_k sigma_k^2 / delta_k^2 = 1 / (2 r_Q) per run, mean over "
                  "finite runs. A RISK score: positive Spearman with MIS means the reversed ranking tracks MIS.",
    "unquantized-bias": "VARIANT: the published estimator with the bias quantization switched "
                        "(quantize_bias negated).",
}


def protocol_block(cfg: SyntheticConfig) -> dict[str, Any]:
    """Every choice the paper leaves open, written down."""
    return {
        "data": f"per data set: {cfg.dim}-dim Gaussian mixture, centres ~ N(0, I), labels alternate over "
                "clusters (cluster c has label c mod 2), cluster drawn uniformly, x = centre + sigma * N(0, I)",
        "runs": f"{cfg.n_runs} runs per data set; each run has {cfg.n_train} fresh training samples (members), "
                f"{cfg.n_train} fresh non-members, its own init seed and mini-batch order; one validation set of "
                f"{cfg.n_val} fresh points per data set shared by the runs",
        "classifier": f"linear {cfg.dim} -> 2 (weight + bias), PyTorch default nn.Linear init, cross-entropy, Adam lr={cfg.lr} "
                      f"(betas 0.9/0.999, eps 1e-8), batch {cfg.batch_size}, {cfg.epochs} epochs, reshuffled every epoch",
        "trajectory": f"one checkpoint after each epoch; checkpoints of epochs {cfg.rq_first_epoch}..{cfg.epochs} enter r_Q "
                      "(epoch 0 = the initialisation)",
        "quantization": "per tensor: the 2 x dim weight matrix is one tensor; "
                        + ("the bias vector (2 entries) is quantized as a separate tensor with the same rule"
                           if cfg.quantize_bias else "the bias stays in full precision"),
        "r_q": f"Algorithm 2 on per-sample cross-entropy losses on the {cfg.rq_loss_split} samples; quantized checkpoints with "
               f"identical per-sample losses merged; sigma^2 with ddof={cfg.rq_ddof}; r_Q per run, mean over the runs with "
               "finite r_Q (undefined runs counted, see n_undefined), CI: bootstrap over runs (llmaudit.indicator.aggregate_r_q)",
        "mis": f"final (epoch {cfg.epochs}) parameters quantized; rows [x ({cfg.dim}), y (1), quantized weight ({2 * cfg.dim}), "
               f"bias (2), loss of the quantized model (1)] = {cfg.dim + 1 + 2 * cfg.dim + 2 + 1} features, member label; "
               f"runs split {cfg.disc_train_fraction:.0%} / {1 - cfg.disc_train_fraction:.0%} (all rows of a run on one side); "
               "features standardised with the training rows' statistics; discriminator "
               f"{cfg.dim + 2 * cfg.dim + 4} -> {cfg.disc_hidden} -> 1 ReLU MLP, BCE, Adam lr={cfg.disc_lr}, batch {cfg.disc_batch_size}, "
               f"{cfg.disc_epochs} epochs, {cfg.disc_dtype} matmuls; MIS = 2 - 2 x test accuracy (threshold 0.5); "
               "CI: bootstrap over test runs (discriminator not retrained)",
        "comparison": "Spearman rho between the quantizers' mean r_Q and their MIS per data set (scipy, ties averaged); "
                      "spread: bootstrap over runs (r_Q runs and MIS test runs resampled, discriminator fixed)",
        "stability": f"r_Q: subsamples of k runs without replacement ({cfg.stability_resamples} per size), Spearman of the "
                     f"subsample ranking with the {cfg.n_runs}-run ranking; MIS: discriminator retrained on each subsample "
                     f"({cfg.stability_mis_resamples} per size), Spearman with the {cfg.n_runs}-run MIS",
        "variants": {v: VARIANT_DOC[v] for v in ["published", *cfg.variants]},
    }


def run_synthetic(
    cfg: SyntheticConfig, log: Callable[[str], None] = print, on_dataset: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """The full protocol over the k_modes x sigmas grid. Returns the result dict (see `write_outputs`).
    `on_dataset` is called with each finished data set's result (e.g. to save partial results)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    datasets = []
    grid = [(k, s) for k in cfg.k_modes for s in cfg.sigmas]
    for i, (k, s) in enumerate(grid):
        datasets.append(run_dataset(cfg, i, k, s, log=log))
        if on_dataset is not None:
            on_dataset(datasets[-1])
    wall = time.perf_counter() - t0
    summary = {}
    for v in datasets[0]["comparison"]:
        per_ds = [d["comparison"][v]["spearman"] for d in datasets]
        boots = np.nanmean(np.stack([d["comparison"][v]["_boots"] for d in datasets]), axis=0)
        summary[v] = {"mean_spearman": float(np.nanmean(per_ds)), "per_dataset": dict(zip([d["name"] for d in datasets], per_ds)),
                      "min": float(np.nanmin(per_ds)), "max": float(np.nanmax(per_ds)),
                      "boot_std_of_mean": float(np.nanstd(boots)), "boot_ci_of_mean": _ci(boots, cfg.confidence)}
    for d in datasets:
        for v in d["comparison"]:
            d["comparison"][v].pop("_boots")
    stab = {"k_runs": list(cfg.stability_k_runs)}
    stab["r_q_mean_rho"] = [float(np.nanmean([d["stability"]["r_q"]["by_size"][j]["mean_rho"] for d in datasets]))
                            for j in range(len(cfg.stability_k_runs))]
    if cfg.stability_mis_resamples > 0:
        stab["mis_mean_rho"] = [float(np.nanmean([d["stability"]["mis"][j]["mean_rho"] for d in datasets]))
                                for j in range(len(cfg.stability_k_runs))]
    import importlib.metadata as md

    return {
        "config": cfg.model_dump(mode="json"),
        "protocol": protocol_block(cfg),
        "summary": summary,
        "stability_summary": stab,
        "datasets": datasets,
        "wall_time_s": wall,
        "environment": {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": np.__version__,
                        "llmaudit": md.version("llmaudit"), "platform": platform.platform(),
                        "torch_threads": torch.get_num_threads()},
        "reported": {"mean_spearman": 0.86, "stability_r_q_15_runs": ">= 0.9", "stability_mis": "about 150 runs for 0.9"},
    }


def _fmt(x: float) -> str:
    if x is None or not np.isfinite(x):
        return str(x)
    return f"{x:.3g}"


def markdown_report(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = ["# Synthetic validation of r_Q against the baseline MIS", "",
             f"{len(res['datasets'])} data sets x {cfg['n_runs']} runs, batch size {cfg['batch_size']}, lr {cfg['lr']}, "
             f"{cfg['epochs']} epochs; wall time {res['wall_time_s']:.0f} s. Rank 1 = most secure (highest r_Q / MIS).", "",
             "## Spearman(r_Q, MIS) per data set", "",
             "| estimator | mean rho | bootstrap std of mean | CI of mean | " + " | ".join(d["name"] for d in res["datasets"]) + " |",
             "|---|---|---|---|" + "---|" * len(res["datasets"])]
    for v, s in res["summary"].items():
        lines.append(f"| {v} | {s['mean_spearman']:+.2f} | {s['boot_std_of_mean']:.2f} | "
                     f"[{s['boot_ci_of_mean'][0]:+.2f}, {s['boot_ci_of_mean'][1]:+.2f}] | "
                     + " | ".join(f"{x:+.2f}" for x in s["per_dataset"].values()) + " |")
    lines += ["", "'published' is the estimator of the paper; the others are labelled VARIANTS (see protocol.variants). "
              "'reciprocal' is a risk score: its positive correlation means r_Q's ranking reversed tracks MIS.", "",
              "## Stability (mean Spearman of a k-run ranking with the full ranking, averaged over data sets)", "",
              "| k_runs | " + " | ".join(str(k) for k in res["stability_summary"]["k_runs"]) + " |",
              "|---|" + "---|" * len(res["stability_summary"]["k_runs"]),
              "| r_Q | " + " | ".join(f"{x:.2f}" for x in res["stability_summary"]["r_q_mean_rho"]) + " |"]
    if "mis_mean_rho" in res["stability_summary"]:
        lines.append("| MIS | " + " | ".join(f"{x:.2f}" for x in res["stability_summary"]["mis_mean_rho"]) + " |")
    for d in res["datasets"]:
        lines += ["", f"## {d['name']} (k_modes={d['k_modes']}, sigma={d['sigma']}): Spearman {d['comparison']['published']['spearman']:+.2f}, "
                  f"full-precision val acc {d['classifier']['val_acc_full_precision']:.3f}", "",
                  "| quantizer | r_Q mean | r_Q CI | undefined runs | MIS | MIS CI | rank r_Q | rank MIS | distinct points/run |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for q, t in d["table"].items():
            a = t["r_q"]
            lines.append(f"| {q} | {_fmt(a['mean'])} | [{_fmt(a['ci_low'])}, {_fmt(a['ci_high'])}] | {a['n_undefined']} | "
                         f"{t['mis']:.3f} | [{t['mis_ci'][0]:.3f}, {t['mis_ci'][1]:.3f}] | {t['rank_r_q']:g} | {t['rank_mis']:g} | "
                         f"{t['mean_distinct_points']:.1f} |")
    return "\n".join(lines) + "\n"


def write_plots(res: dict[str, Any], out: Path) -> list[Path]:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    ds = res["datasets"]
    ncol = min(3, len(ds))
    nrow = math.ceil(len(ds) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4 * ncol, 3.4 * nrow), squeeze=False)
    for ax, d in zip(axes.flat, ds):
        for q, t in d["table"].items():
            ax.errorbar(t["r_q"]["mean"], t["mis"], yerr=[[t["mis"] - t["mis_ci"][0]], [t["mis_ci"][1] - t["mis"]]],
                        xerr=[[max(t["r_q"]["mean"] - t["r_q"]["ci_low"], 0)], [max(t["r_q"]["ci_high"] - t["r_q"]["mean"], 0)]],
                        fmt="o", ms=4, capsize=2)
            ax.annotate(q, (t["r_q"]["mean"], t["mis"]), fontsize=7)
        ax.set_xscale("log")
        ax.set_title(f"{d['name']}  rho={d['comparison']['published']['spearman']:+.2f}", fontsize=9)
        ax.set_xlabel("r_Q (mean over runs)")
        ax.set_ylabel("baseline MIS")
    for ax in list(axes.flat)[len(ds):]:
        ax.axis("off")
    fig.tight_layout()
    for name, f in (("rq_vs_mis.png", fig),):
        buf = io.BytesIO()
        f.savefig(buf, format="png", dpi=110)
        paths.append(atomic_write_bytes(out / name, buf.getvalue()))
    plt.close(fig)

    st = res["stability_summary"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(st["k_runs"], st["r_q_mean_rho"], "o-", label="r_Q")
    if "mis_mean_rho" in st:
        ax.plot(st["k_runs"], st["mis_mean_rho"], "s-", label="baseline MIS")
    ax.axhline(0.9, color="grey", ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("runs in subsample")
    ax.set_ylabel("Spearman with full ranking")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    paths.append(atomic_write_bytes(out / "stability.png", buf.getvalue()))
    plt.close(fig)
    return paths


def write_outputs(res: dict[str, Any], out: Path, plots: bool = True) -> dict[str, Path]:
    out = Path(out)
    paths = {"json": atomic_write_json(out / "results.json", res),
             "markdown": atomic_write_text(out / "results.md", markdown_report(res)),
             "config": atomic_write_text(out / "config.yaml", yaml.safe_dump(res["config"], sort_keys=False))}
    if plots:
        for p in write_plots(res, out):
            paths[p.stem] = p
    return paths


def validate_synthetic_command(recipe: Path | None, overrides: list[str], out: Path | None = None) -> dict:
    """`llmaudit validate synthetic [RECIPE] [key=value ...] --out DIR`: run the protocol, write
    results.json, results.md, config.yaml and the plots under `out` (default ./synthetic-validation/).
    Returns the result dict."""
    cfg = load_config(recipe, overrides)
    out = Path(out) if out is not None else Path.cwd() / "synthetic-validation"
    print(f"synthetic validation: {len(cfg.k_modes) * len(cfg.sigmas)} data sets x {cfg.n_runs} runs, "
          f"{len(cfg.quantizers)} quantizers -> {out}", flush=True)
    def save_partial(ds: dict[str, Any]) -> None:
        # each finished data set is kept, so an interrupted run still leaves its numbers
        atomic_write_json(out / "partial" / f"{ds['name']}.json",
                          {**ds, "comparison": {v: {k: x for k, x in c.items() if k != "_boots"} for v, c in ds["comparison"].items()}})

    res = run_synthetic(cfg, log=lambda s: print(s, flush=True), on_dataset=save_partial)
    paths = write_outputs(res, out, plots=cfg.plots)
    s = res["summary"]["published"]
    print(f"mean Spearman(r_Q, MIS) = {s['mean_spearman']:+.2f} (bootstrap std {s['boot_std_of_mean']:.2f}); "
          f"wall time {res['wall_time_s']:.0f} s; wrote {', '.join(str(p) for p in paths.values())}", flush=True)
    return res
