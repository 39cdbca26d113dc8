"""[M runs, N samples] inputs of the attacks on one quantizer: each run's final checkpoint on the pool, and the
base model's rows (the reference unit, and the quantization-matched one) (docs/science.md section 4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError


def pivot(frame: pd.DataFrame, values: str, runs: np.ndarray, samples: list[str]) -> np.ndarray:
    """Arrange one column of long rows as a [runs, samples] matrix.

    Args:
        frame (pd.DataFrame): rows with columns run, sample_id and `values`.
        values (str): the column to arrange.
        runs (np.ndarray): the runs, in row order.
        samples (list[str]): the sample ids, in column order.
    Returns:
        np.ndarray: [len(runs), len(samples)], NaN where a pair has no row.
    """
    wide = frame.pivot(index="run", columns="sample_id", values=values)
    return wide.reindex(index=runs, columns=samples).to_numpy()


def final_pool(df: pd.DataFrame, quantizer: str) -> tuple[pd.DataFrame, dict]:
    """Select the pool rows of each fine-tuned run's final checkpoint under one quantizer.

    Args:
        df (pd.DataFrame): the loss table.
        quantizer (str): the quantizer's name.
    Returns:
        tuple[pd.DataFrame, dict]: (the rows, {run: final checkpoint}).
    Raises:
        LossTableError: when the quantizer has no pool rows of fine-tuned runs.
    """
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
    """Build the [M runs, N samples] matrices of one quantizer's final checkpoints on the pool.

    Samples not scored by every run are dropped (counted in `Target.n_dropped`).

    Args:
        df (pd.DataFrame): the loss table.
        quantizer (str): the quantizer's name.
    Returns:
        Target: rows, runs, samples, keep, loss, final checkpoints, n_dropped.
    Raises:
        LossTableError: when there is no fine-tuned run to attack.
    """
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
    """Choose the quantizer of the base-model rows that "base" means.

    Args:
        df (pd.DataFrame): the loss table.
        reference (str | None): the reference quantizer.
    Returns:
        str | None: the reference quantizer when the base was scored under it, else the only one, else the first
        full-precision one; None without base rows or when the choice is ambiguous.
    """
    names = sorted(df.loc[(df["run"] == REFERENCE_RUN) & (df["split"] == "pool"), "quantizer"].unique())
    if reference in names:
        return reference
    if len(names) == 1:
        return str(names[0])
    return full_precision_reference(names)


def base_rows(df: pd.DataFrame, quantizer: str | None, samples: list[str]) -> pd.DataFrame | None:
    """Select the base model's pool rows under one quantizer (its last checkpoint).

    Args:
        df (pd.DataFrame): the loss table.
        quantizer (str | None): the quantizer; None gives None.
        samples (list[str]): the sample ids to reindex to.
    Returns:
        pd.DataFrame | None: rows indexed by sample_id in the order of `samples` (NaN where unscored), None when
        there are none.
    """
    if quantizer is None:
        return None
    b = df[(df["run"] == REFERENCE_RUN) & (df["split"] == "pool") & (df["quantizer"] == quantizer)]
    if b.empty:
        return None
    b = b[b["checkpoint"] == b["checkpoint"].max()].set_index("sample_id")
    return b.reindex(samples)


def row_pairs(rows: pd.DataFrame, base: pd.DataFrame) -> tuple[list, list, np.ndarray]:
    """Pair each target row's token losses with the base's for the same sample.

    Args:
        rows (pd.DataFrame): the target rows (sample_id, token_losses).
        base (pd.DataFrame): the base rows indexed by sample_id (`base_rows`).
    Returns:
        tuple[list, list, np.ndarray]: (target token losses, base token losses, usable) per target row; a row is
        usable when the base scored its sample (else its own losses stand in, masked).
    Raises:
        LossTableError: naming the sample when the base scored it on a different number of tokens.
    """
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
