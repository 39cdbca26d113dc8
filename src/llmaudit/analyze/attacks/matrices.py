"""[M runs, N samples] inputs of the attacks on one quantizer: each run's final checkpoint on the pool, the
base model's rows (the reference unit, and the quantization-matched one), and the score matrices of the
attacks that compare the target with a reference: EZ-MIA, WBC, ref_qbase and RMIA (docs/science.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmaudit.analyze.attacks.definitions import EZ_MIA_VARIANTS, RMIA_ATTACKS, WBC_VARIANTS
from llmaudit.analyze.attacks.lira import balanced_references
from llmaudit.analyze.attacks.rmia import (
    offline_marginal,
    online_marginal,
    rmia_score,
    text_probability,
    tune_offline_a,
)
from llmaudit.analyze.attacks.text import ref_score
from llmaudit.analyze.attacks.tokens import WBC_GRIDS, ez_mia_score, wbc_score
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError

PREDATES_TOP1 = (
    "EZ-MIA not measurable: table predates top-1 (no token_top1 column, as in loss tables of version 1); "
    "delete the unit files and `llmaudit score` them again to measure it"
)


def pivot(frame: pd.DataFrame, values: str, runs: np.ndarray, samples: list[str]) -> np.ndarray:
    wide = frame.pivot(index="run", columns="sample_id", values=values)
    return wide.reindex(index=runs, columns=samples).to_numpy()


def final_pool(df: pd.DataFrame, quantizer: str) -> tuple[pd.DataFrame, dict]:
    sub = df[(df["quantizer"] == quantizer) & (df["split"] == "pool") & (df["run"] != REFERENCE_RUN)]
    if sub.empty:
        raise LossTableError(f"quantizer {quantizer!r}: no 'pool' rows of fine-tuned runs to attack.")
    final = sub.groupby("run")["checkpoint"].max()
    rows = sub.merge(final.rename("final").reset_index(), on="run")
    rows = rows[rows["checkpoint"] == rows["final"]].drop(columns="final")
    return rows, {int(r): int(c) for r, c in final.items()}


@dataclass
class Target:
    """The pool rows of one quantizer's final checkpoints as [M runs, N samples] matrices."""

    rows: pd.DataFrame
    runs: np.ndarray
    samples: list[str]
    keep: np.ndarray
    loss: np.ndarray
    final: dict
    n_dropped: int


def target_matrices(df: pd.DataFrame, quantizer: str) -> Target:
    """Each run's final checkpoint on the pool; samples scored by every run (the others are dropped)."""
    rows, final = final_pool(df, quantizer)
    runs = np.array(sorted(final))
    if runs.size < 1:
        raise LossTableError(f"quantizer {quantizer!r}: no fine-tuned run to attack.")
    per_run = rows.groupby("sample_id")["run"].nunique()
    samples = sorted(per_run.index[per_run == runs.size])
    rows = rows[rows["sample_id"].isin(samples)]
    keep = pivot(rows, "member", runs, samples).astype(bool)
    loss = pivot(rows, "loss", runs, samples).astype(np.float64)
    return Target(rows, runs, samples, keep, loss, final, int((per_run < runs.size).sum()))


def base_quantizer(df: pd.DataFrame, reference: str | None) -> str | None:
    """The quantizer of the base-model rows that "base" means: the reference quantizer's when the base was
    scored under it, else the only one, else the first full-precision one; None without base rows or when
    the choice is ambiguous."""
    names = sorted(df.loc[(df["run"] == REFERENCE_RUN) & (df["split"] == "pool"), "quantizer"].unique())
    if reference in names:
        return reference
    if len(names) == 1:
        return str(names[0])
    return full_precision_reference(names)


def base_rows(df: pd.DataFrame, quantizer: str | None, samples: list[str]) -> pd.DataFrame | None:
    """The base model's pool rows under one quantizer (its last checkpoint), indexed by sample_id and
    reindexed to `samples` (NaN rows where a sample was not scored); None when there are none."""
    if quantizer is None:
        return None
    b = df[(df["run"] == REFERENCE_RUN) & (df["split"] == "pool") & (df["quantizer"] == quantizer)]
    if b.empty:
        return None
    b = b[b["checkpoint"] == b["checkpoint"].max()].set_index("sample_id")
    return b.reindex(samples)


def _row_pairs(rows: pd.DataFrame, base: pd.DataFrame) -> tuple[list, list, np.ndarray]:
    """(target token losses, base token losses, usable) per target row; a row is usable when the base scored
    its sample, on the same number of tokens (else LossTableError naming the sample)."""
    base_tokens = base["token_losses"]
    target, reference, usable = [], [], []
    for sample, tokens in zip(rows["sample_id"], rows["token_losses"]):
        ref = base_tokens.get(sample)
        ok = isinstance(ref, np.ndarray)
        if ok and ref.size != tokens.size:
            raise LossTableError(
                f"sample {sample!r}: a run scored {tokens.size} tokens but the base model {ref.size}; the base and "
                "the runs must be scored on the same tokens (same tokenizer and loss mask)."
            )
        target.append(tokens)
        reference.append(ref if ok else tokens)  # placeholder, masked below
        usable.append(ok)
    return target, reference, np.array(usable, bool)


def _has_top1(rows: pd.DataFrame) -> bool:
    return "token_top1" in rows.columns and all(isinstance(v, np.ndarray) for v in rows["token_top1"])


def _token_scores(rows: pd.DataFrame, base: pd.DataFrame, attacks: list[str]) -> dict[str, np.ndarray]:
    """Per target row, the scores of the EZ-MIA / WBC `attacks` against `base` (NaN where unusable)."""
    target, reference, usable = _row_pairs(rows, base)
    out = {}
    for name in attacks:
        if name in EZ_MIA_VARIANTS:
            kw = {k: v for k, v in EZ_MIA_VARIANTS[name].items() if k != "reference"}
            scores = ez_mia_score(target, reference, list(rows["token_top1"]), **kw)
        else:
            kw = {k: v for k, v in WBC_VARIANTS[name].items() if k != "reference"}
            scores = wbc_score(target, reference, windows=WBC_GRIDS[kw.pop("grid")], **kw)
        out[name] = np.where(usable, scores, np.nan)
    return out


def reference_matrices(
    t: Target, base: pd.DataFrame | None, matched: pd.DataFrame | None, attacks: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """[M, N] scores of EZ-MIA, WBC (and their variants) and ref_qbase, with the reasons of those that
    cannot run. base: the reference unit's rows (`base_rows`); matched: the base under the target's own
    quantizer, None where it was not scored or the target's quantizer is the reference one."""
    matrices: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    wanted = [a for a in attacks if a in EZ_MIA_VARIANTS or a in WBC_VARIANTS or a == "ref_qbase"]
    by_reference: dict[str, list[str]] = {"base": [], "matched": []}
    for name in wanted:
        variant = EZ_MIA_VARIANTS.get(name) or WBC_VARIANTS.get(name) or {"reference": "matched"}
        source = variant.get("reference", "base")
        rows = base if source == "base" else matched
        if rows is None:
            skipped[name] = (
                "no base-model rows (run == -1) on split 'pool'"
                if source == "base"
                else "no quantization-matched base: the base model was not scored under this quantizer "
                "(score.matched_base=true scores it; the reference quantizer's match is the base itself)"
            )
        elif name in EZ_MIA_VARIANTS and not _has_top1(t.rows):
            skipped[name] = PREDATES_TOP1
        elif name == "ref_qbase":
            ref = rows["loss"].to_numpy(dtype=np.float64)
            matrices[name] = np.stack([ref_score(t.loss[m], ref, np.isfinite(ref)) for m in range(t.runs.size)])
        else:
            by_reference[source].append(name)
    for source, names in by_reference.items():
        if names:
            scored = _token_scores(t.rows, base if source == "base" else matched, names)
            frame = t.rows.assign(**{f"_s_{n}": v for n, v in scored.items()})
            matrices |= {n: pivot(frame, f"_s_{n}", t.runs, t.samples).astype(np.float64) for n in names}
    return matrices, skipped


def _population(df: pd.DataFrame, quantizer: str, t: Target) -> np.ndarray | None:
    """[M, Z] probabilities of the validation texts (never trained on) at each run's final checkpoint;
    texts scored by every run only; None without any."""
    val = df[(df["quantizer"] == quantizer) & (df["split"] == "val") & (df["run"].isin(t.runs))]
    val = val[val["checkpoint"] == val["run"].map(t.final)]
    if val.empty:
        return None
    per_run = val.groupby("sample_id")["run"].nunique()
    texts = sorted(per_run.index[per_run == t.runs.size])
    if not texts:
        return None
    return text_probability(pivot(val[val["sample_id"].isin(texts)], "loss", t.runs, texts).astype(np.float64))


def rmia_matrices(
    df: pd.DataFrame, quantizer: str, t: Target, attacks: tuple[str, ...]
) -> tuple[dict[str, np.ndarray], dict[str, str], dict]:
    """[M, N] RMIA scores, each run in turn the target and the other runs its references (offline: their
    OUT models with the tuned a; online: IN and OUT; as many for a member of the target as for a non-member,
    `balanced_references`), with the reasons of those that cannot run and the offline coefficient chosen per
    target."""
    wanted = [a for a in attacks if a in RMIA_ATTACKS]
    if not wanted:
        return {}, {}, {}
    z = _population(df, quantizer, t)
    why = None
    if t.runs.size < 2:
        why = "one fine-tuning run: RMIA's references are the other runs"
    elif z is None:
        why = "no population texts: RMIA needs the 'val' split (never trained on) at the runs' final checkpoints"
    if why:
        return {}, dict.fromkeys(wanted, why), {}
    p = text_probability(t.loss)
    M = t.runs.size
    out = {name: np.full(p.shape, np.nan) for name in wanted}
    chosen_a = []
    for m in range(M):
        others = np.arange(M) != m
        out_refs, in_refs = (refs[others] for refs in balanced_references(t.keep, m))
        if "rmia" in out:
            a = _tuned_a(p, t.keep, z, m)
            chosen_a.append(a)
            marg_x = offline_marginal(p[others], out_refs, a)
            marg_z = offline_marginal(z[others], np.ones(z[others].shape, bool), a)
            out["rmia"][m] = rmia_score(p[m], marg_x, z[m], marg_z)
        if "rmia_online" in out:
            marg_z = z[others].mean(0)  # every reference is OUT for a population text
            marg_x = online_marginal(p[others], in_refs, out_refs)
            out["rmia_online"][m] = rmia_score(p[m], marg_x, z[m], marg_z)
    return out, {}, ({"rmia_offline_a": chosen_a} if chosen_a else {})


def _tuned_a(p: np.ndarray, keep: np.ndarray, z: np.ndarray, target: int) -> float:
    """Offline a for `target`: tuned by attacking the paired run (target + 1, cyclically) with the runs that
    are neither (`tune_offline_a`); the target's own scores never enter."""
    M = p.shape[0]
    paired = (target + 1) % M
    rest = np.array([r for r in range(M) if r not in (target, paired)], dtype=int)
    a, _ = tune_offline_a(p[paired], p[rest], ~keep[rest], keep[paired], z[paired], z[rest])
    return a
