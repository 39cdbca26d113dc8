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
    """[M, Z] probabilities of the validation texts at each run's final checkpoint (texts scored by every run), and
    [M, N] of the pool samples; AttackUnavailable with one run or without such texts."""
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
    """Offline a for `target`: tuned by attacking the paired run (target + 1, cyclically) with the runs that
    are neither (`tune_offline_a`); the target's own scores never enter."""
    M = p.shape[0]
    paired = (target + 1) % M
    rest = np.array([r for r in range(M) if r not in (target, paired)], dtype=int)
    a, _ = tune_offline_a(p[paired], p[rest], ~keep[rest], keep[paired], z[paired], z[rest])
    return a


def offline(ctx: AttackContext) -> np.ndarray:
    """Offline: the other runs' OUT models (as many for a member of the target as for a non-member) with the tuned
    a; the coefficients chosen are recorded as "rmia_offline_a"."""
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
    """Online: the IN and OUT references' means (every reference is OUT for a population text)."""
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
