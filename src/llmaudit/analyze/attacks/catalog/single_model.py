"""Attacks that read one text under the target model alone: LOSS, min-k%, Min-K%++ and zlib
(docs/science.md section 4)."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.registry import AttackSpec
from llmaudit.analyze.attacks.text import min_k_plus_plus_score, min_k_score


def loss(ctx: AttackContext) -> np.ndarray:
    """Score LOSS: -L(x), the mean token NLL negated.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    return -ctx.target.loss


def min_k(ctx: AttackContext) -> np.ndarray:
    """Score min-k%: the mean log p of the floor(k * T) least likely tokens (at least one).

    Args:
        ctx (AttackContext): the quantizer's attack inputs (k from `ctx.settings.k`).
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    return ctx.per_row(min_k_score(ctx.target.rows["token_losses"], ctx.settings.k))


def min_k_plus_plus(ctx: AttackContext) -> np.ndarray:
    """Score Min-K%++: min-k% of log p standardized by the vocabulary's mean and sd at each position.

    Args:
        ctx (AttackContext): the quantizer's attack inputs (k from `ctx.settings.k`).
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    rows = ctx.target.rows
    return ctx.per_row(
        min_k_plus_plus_score(rows["token_losses"], rows["token_vocab_mean"], rows["token_vocab_std"], ctx.settings.k)
    )


def zlib(ctx: AttackContext) -> np.ndarray:
    """Score zlib: -L(x) over the zlib-compressed length of the text in bytes.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    rows = ctx.target.rows
    return ctx.per_row(-rows["loss"].to_numpy(dtype=np.float64) / rows["zlib_bytes"].to_numpy(dtype=np.float64))


SPECS: list[AttackSpec] = []

SPECS.append(AttackSpec("loss", 1, loss, "-mean_nll", "LOSS (Yeom 2018): -L(x), the mean token NLL negated"))
SPECS.append(
    AttackSpec(
        "min_k",
        2,
        min_k,
        lambda d: f"k={d.k:g},floor(k*T)>=1,mean_logp_lowest",
        "min-k% (Shi 2024): mean log p of the floor(k*T) least likely tokens (at least one)",
    )
)
SPECS.append(
    AttackSpec(
        "min_k_plus_plus",
        2,
        min_k_plus_plus,
        lambda d: f"k={d.k:g},floor(k*T)>=1,(logp-mu_vocab)/sigma_vocab",
        "Min-K%++ (Zhang 2024): min-k% of log p standardized by the vocabulary's mean and sd at each position",
        columns=("token_vocab_mean", "token_vocab_std"),
    )
)
SPECS.append(
    AttackSpec(
        "zlib",
        1,
        zlib,
        "-mean_nll/zlib_bytes",
        "zlib (Carlini 2021): -L(x) over the zlib-compressed length of the text in bytes",
        columns=("zlib_bytes",),
    )
)
