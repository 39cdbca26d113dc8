"""RMIA (Zarifzadeh 2024), offline and online, each run in turn the target and the other runs its references, the
validation texts (never trained on) its population (docs/science.md section 4)."""

from __future__ import annotations

import numpy as np

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.lira import balanced_references
from llmaudit.analyze.attacks.matrices import pivot
from llmaudit.analyze.attacks.registry import AttackSpec, AttackUnavailable
from llmaudit.analyze.attacks.rmia import (
    offline_marginal,
    online_marginal,
    rmia_score,
    text_probability,
    tune_offline_a,
)


def population(ctx: AttackContext) -> np.ndarray:
    """Compute the probabilities of the population texts and check RMIA can run.

    The population is the validation texts scored by every run at its final checkpoint.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, Z] probabilities p = exp(-L) of the Z population texts under each run.
    Raises:
        AttackUnavailable: with one run, or without such texts.
    """
    t = ctx.target
    if t.runs.size < 2:
        raise AttackUnavailable("one fine-tuning run: RMIA's references are the other runs")
    df = ctx.df
    val = df[(df["quantizer"] == ctx.quantizer) & (df["split"] == "val") & (df["run"].isin(t.runs))]
    val = val[val["checkpoint"] == val["run"].map(t.final)]
    per_run = val.groupby("sample_id")["run"].nunique()
    texts = sorted(per_run.index[per_run == t.runs.size])
    if val.empty or not texts:
        raise AttackUnavailable(
            "no population texts: RMIA needs the 'val' split (never trained on) at the runs' final checkpoints"
        )
    return text_probability(pivot(val[val["sample_id"].isin(texts)], "loss", t.runs, texts).astype(np.float64))


def tuned_a(p: np.ndarray, keep: np.ndarray, z: np.ndarray, target: int) -> float:
    """Tune RMIA's offline coefficient a for one target run.

    The coefficient is tuned by attacking the paired run (target + 1, cyclically) with the runs that are neither
    (`tune_offline_a`); the target's own scores never enter.

    Args:
        p (np.ndarray): [M, N] probabilities of the pool samples under each run.
        keep (np.ndarray): [M, N] bool, True where the run trained on the sample.
        z (np.ndarray): [M, Z] probabilities of the population texts.
        target (int): the index of the target run.
    Returns:
        float: the coefficient a.
    """
    M = p.shape[0]
    paired = (target + 1) % M
    rest = np.array([r for r in range(M) if r not in (target, paired)], dtype=int)
    a, _ = tune_offline_a(p[paired], p[rest], ~keep[rest], keep[paired], z[paired], z[rest])
    return a


def offline(ctx: AttackContext) -> np.ndarray:
    """Score RMIA offline: the other runs' out-models as references, with the tuned coefficient a.

    The coefficients chosen are recorded in `ctx.info["rmia_offline_a"]`.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    Raises:
        AttackUnavailable: as `population`.
    """
    z = ctx.cached("rmia_population", lambda: population(ctx))
    t = ctx.target
    p = text_probability(t.loss)
    out, chosen = np.full(p.shape, np.nan), []
    for m in range(t.runs.size):
        others = np.arange(t.runs.size) != m
        out_refs = balanced_references(t.keep, m)[0][others]
        a = tuned_a(p, t.keep, z, m)
        chosen.append(a)
        marg_x = offline_marginal(p[others], out_refs, a)
        marg_z = offline_marginal(z[others], np.ones(z[others].shape, bool), a)
        out[m] = rmia_score(p[m], marg_x, z[m], marg_z)
    ctx.info["rmia_offline_a"] = chosen
    return out


def online(ctx: AttackContext) -> np.ndarray:
    """Score RMIA online: p(x) the mean of the in- and the out-references' means.

    Every reference is out for a population text.

    Args:
        ctx (AttackContext): the quantizer's attack inputs.
    Returns:
        np.ndarray: [M, N] scores, higher = more likely a member.
    Raises:
        AttackUnavailable: as `population`.
    """
    z = ctx.cached("rmia_population", lambda: population(ctx))
    t = ctx.target
    p = text_probability(t.loss)
    out = np.full(p.shape, np.nan)
    for m in range(t.runs.size):
        others = np.arange(t.runs.size) != m
        out_refs, in_refs = (refs[others] for refs in balanced_references(t.keep, m))
        marg_x = online_marginal(p[others], in_refs, out_refs)
        out[m] = rmia_score(p[m], marg_x, z[m], z[others].mean(0))
    return out


SPECS: list[AttackSpec] = []

SPECS.append(
    AttackSpec(
        "rmia",
        2,
        offline,
        "offline,p=exp(-L),refs=other-runs-out,balanced,a=tuned-on-paired-run,gamma=1,z=val",
        "RMIA offline (Zarifzadeh 2024): the share of population texts z with [p(x|theta)/p(x)] / [p(z|theta)/p(z)] "
        "> 1, p(x) from the other runs where x was out, scaled by a coefficient tuned on a paired run",
        references=("runs", "population"),
    )
)
SPECS.append(
    AttackSpec(
        "rmia_online",
        2,
        online,
        "online,p=exp(-L),refs=other-runs-in+out,balanced,gamma=1,z=val",
        "RMIA online (Zarifzadeh 2024): the same with p(x) the mean of the IN and the OUT references' means",
        references=("runs", "population"),
    )
)
