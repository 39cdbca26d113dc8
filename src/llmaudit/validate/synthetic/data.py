"""Gaussian-mixture data sets of the synthetic protocol, deterministic in (seed, data set)."""

from __future__ import annotations

import numpy as np
import torch

from llmaudit.validate.synthetic.config import SyntheticConfig


def derive_seed(*keys: int | str) -> int:
    """A 63-bit seed from a tuple of ints/strings (strings hashed stably, not with Python's hash())."""
    ints = [k if isinstance(k, int) else int.from_bytes(str(k).encode()[:16].ljust(16, b"\0"), "little") for k in keys]
    return int(np.random.SeedSequence(ints).generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def seeded_generator(*keys: int | str) -> torch.Generator:
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


def make_dataset(
    cfg: SyntheticConfig, ds_index: int, k_modes: int, sigma: float, n_runs: int | None = None
) -> dict[str, torch.Tensor]:
    """All samples of one data set, deterministic in (cfg.seed, ds_index).

    x_train/y_train [R, n, dim]/[R, n] (members), x_out/y_out (fresh non-members, same shape),
    x_val/y_val [n_val, dim]/[n_val], order [R, epochs, n] (mini-batch order of each run)."""
    R = cfg.n_runs if n_runs is None else n_runs
    centres, labels = make_mixture(k_modes, cfg.dim, seeded_generator(cfg.seed, ds_index, "centres"))
    x_train, y_train = sample_mixture(
        centres, labels, sigma, (R, cfg.n_train), seeded_generator(cfg.seed, ds_index, "train")
    )
    x_out, y_out = sample_mixture(centres, labels, sigma, (R, cfg.n_train), seeded_generator(cfg.seed, ds_index, "out"))
    x_val, y_val = sample_mixture(centres, labels, sigma, (cfg.n_val,), seeded_generator(cfg.seed, ds_index, "val"))
    order = torch.argsort(
        torch.rand(R, cfg.epochs, cfg.n_train, generator=seeded_generator(cfg.seed, ds_index, "order")), dim=-1
    )
    return {
        "x_train": x_train,
        "y_train": y_train,
        "x_out": x_out,
        "y_out": y_out,
        "x_val": x_val,
        "y_val": y_val,
        "order": order,
        "centres": centres,
    }
