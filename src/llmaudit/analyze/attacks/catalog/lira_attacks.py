"""LiRA (Carlini 2022), offline and online, each run in turn the target and the other runs its references
(docs/science.md section 4)."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.lira import (
    in_reference_counts,
    leave_one_out,
    lira_offline,
    lira_online,
    lira_statistic,
    out_reference_counts,
)
from llmaudit.analyze.attacks.registry import AttackSpec, AttackUnavailable, DefinitionSettings


def _statistic(ctx: AttackContext) -> np.ndarray:
    return ctx.cached("lira_statistic", lambda: lira_statistic(ctx.target.loss, ctx.settings.statistic))


def offline(ctx: AttackContext) -> np.ndarray:
    """Score LiRA offline: each run the target, the other runs where a sample was out its references.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    """
    s = ctx.settings
    return leave_one_out(lira_offline, _statistic(ctx), ctx.target.keep, ctx.fpc_value, variance=s.lira_variance)


def online(ctx: AttackContext) -> np.ndarray:
    """Score LiRA online from the in- and out-references of each sample.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    Raises:
        AttackUnavailable: when the median sample has fewer than 2 in- or 2 out-references.
    """
    keep = ctx.target.keep
    n_in, n_out = in_reference_counts(keep), out_reference_counts(keep)
    if np.median(n_in) < 2 or np.median(n_out) < 2:
        raise AttackUnavailable(
            f"too few reference models: median {np.median(n_in):g} in- and "
            f"{np.median(n_out):g} out-references per sample (needs >= 2 each)"
        )
    s = ctx.settings
    return leave_one_out(lira_online, _statistic(ctx), keep, ctx.fpc_value, variance=s.lira_variance)


def _lira(d: DefinitionSettings) -> str:
    return f"stat={d.statistic},var={d.lira_variance},fpc={d.fpc_text}"


SPECS: list[AttackSpec] = []

SPECS.append(
    AttackSpec(
        "lira_offline",
        2,
        offline,
        lambda d: f"{_lira(d)},balanced_refs,min_out=2",
        "LiRA offline (Carlini 2022): the statistic standardized by its mean and sd under the runs where the sample "
        "was out",
        references=("runs",),
    )
)
SPECS.append(
    AttackSpec(
        "lira_online",
        2,
        online,
        lambda d: f"{_lira(d)},balanced_refs,min_in=2,min_out=2",
        "LiRA online (Carlini 2022): log N(t; mu_in, sd_in) - log N(t; mu_out, sd_out) over the other runs",
        references=("runs",),
    )
)
