"""Extraction of training responses, per record and run, from what the loss table holds (docs/science.md
section 13): no generation needed.

A record is a prompt (the prefix) and its response, the scored tokens x_1..x_T (the end-of-turn token included:
it is what makes a generation stop where the response ends).
- Discoverable (greedy) extraction [Carlini2023]: greedy decoding of the prompt reproduces the response exactly,
  end-of-turn included. With teacher forcing this holds iff every response token is the model's top-1 prediction
  given the prompt and the response before it (`token_top1`, the argmax of the logits, the lowest id on ties): the
  greedy decoder emits x_1, then, fed x_1, emits x_2, ..., then the end-of-turn, and stops.
- (n, p)-discoverable extraction [Hayes2024]: the probability of sampling exactly the response at temperature 1,
  p_z = exp(-sum_t l_t) (l_t the token losses), makes the record extractable when at least one of n independent
  samples reproduces it with probability at least p: 1 - (1 - p_z)^n >= p, i.e. p_z >= p* = 1 - (1 - p)^(1/n)
  (`exact_probability_threshold`; n = 100, p = 0.5 give p* = 0.00691, a summed loss of at most 4.975 nats).

The rates over members and non-members, their intervals and the comparison with full precision are
`llmaudit.analyze.extraction_risk`; this module holds the per-record science and the [M runs, N records] matrices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from llmaudit.analyze.attacks.matrices import pivot, target_matrices
from llmaudit.analyze.memorization import LN2, SEQUENCE_BITS, rows_bits
from llmaudit.store.losstable import REFERENCE_RUN

GREEDY = "greedy_extracted"
"""A per-row column a light table may carry (`llmaudit.analyze.store_table`): 1.0 when every scored token is the
top-1, 0.0 when one is not, NaN without top-1 flags (`rows_greedy` computes it where the token lists are held)."""


@dataclass(frozen=True)
class ExtractionSettings:
    """The (n, p) of (n, p)-discoverable extraction [Hayes2024]."""

    n: int = 100
    """Samples an attacker draws at temperature 1 from the prompt."""
    p: float = 0.5
    """Probability with which at least one of them must reproduce the response exactly."""

    def check(self) -> None:
        """Check the settings.

        Raises:
            ValueError: unless n is an integer >= 1 and p lies in (0, 1).
        """
        if not (isinstance(self.n, int) and self.n >= 1) or not 0 < self.p < 1:
            raise ValueError(f"extraction needs n >= 1 and p in (0, 1); got n={self.n}, p={self.p}")


def exact_probability_threshold(n: int, p: float) -> float:
    """Compute p* = 1 - (1 - p)^(1 / n), the least exact-sampling probability that makes a record extractable.

    With it, n samples at temperature 1 reproduce the response at least once with probability p (computed as
    -expm1(log1p(-p) / n)).

    Args:
        n (int): samples the attacker draws, at least 1.
        p (float): the probability of at least one reproduction, in (0, 1).
    Returns:
        float: p*.
    Raises:
        ValueError: when n or p is out of range.
    """
    ExtractionSettings(n, p).check()
    return -math.expm1(math.log1p(-p) / n)


def sampled_extractable(log_p_exact: np.ndarray, n: int, p: float) -> np.ndarray:
    """Decide (n, p)-discoverable extraction: 1 - (1 - p_z)^n >= p, p_z = exp(log_p_exact).

    Args:
        log_p_exact (np.ndarray): log p_z of each record, in nats, any shape.
        n (int): samples the attacker draws.
        p (float): the probability of at least one reproduction.
    Returns:
        np.ndarray: 1.0 where extractable, 0.0 where not, NaN where log_p_exact is NaN; same shape.
    """
    log_p = np.asarray(log_p_exact, dtype=np.float64)
    hit = (log_p >= math.log(exact_probability_threshold(n, p))).astype(np.float64)
    return np.where(np.isnan(log_p), np.nan, hit)


def greedy_extracted(top1: Sequence[bool] | np.ndarray | None) -> float:
    """Decide greedy extraction: every scored token is the model's top-1 (greedy decoding reproduces it).

    Args:
        top1 (Sequence[bool] | np.ndarray | None): the row's top-1 flags, one per scored token.
    Returns:
        float: 1.0 when every flag is set, 0.0 when one is not, NaN without flags or without a scored token.
    """
    if top1 is None or (isinstance(top1, float) and math.isnan(top1)):
        return math.nan
    flags = np.asarray(top1, dtype=bool)
    return math.nan if flags.size == 0 else float(flags.all())


def rows_greedy(rows: pd.DataFrame) -> np.ndarray:
    """Compute `greedy_extracted` of each loss-table row.

    Args:
        rows (pd.DataFrame): loss-table rows; their `GREEDY` column where the table carries it, else their
            `token_top1` lists (NaN for every row of a table without that column, as loss tables of version 1).
    Returns:
        np.ndarray: [n] 1.0, 0.0 or NaN per row.
    Raises:
        ValueError: for a light table (no token lists) without the `GREEDY` column.
    """
    if GREEDY in rows.columns:
        return rows[GREEDY].to_numpy(dtype=np.float64)
    if SEQUENCE_BITS in rows.columns and "token_top1" in rows.columns:
        raise ValueError(
            f"a light table (pool rows without their token lists) has no {GREEDY!r} column: greedy extraction would "
            "read as unmeasured; compute the column where the table is read (store_table.light_frame) or pass the "
            "quantizer's whole rows (StoreTable.rows_of)"
        )
    if "token_top1" not in rows.columns:
        return np.full(len(rows), np.nan)
    return np.array([greedy_extracted(t) for t in rows["token_top1"]], dtype=np.float64)


def rows_log_p_exact(rows: pd.DataFrame) -> np.ndarray:
    """Compute log p_z = -(sum of the row's token losses) in nats (from its sequence bits where the table has them).

    Args:
        rows (pd.DataFrame): loss-table rows.
    Returns:
        np.ndarray: [n] log p_z per row.
    """
    return -rows_bits(rows) * LN2


@dataclass(frozen=True)
class ExtractionMatrices:
    """One quantizer's final checkpoints on the pool as [M runs, N records] matrices: membership, greedy
    extraction (None: the table has no top-1 flags) and log p_z."""

    quantizer: str
    runs: tuple[int, ...]
    sample_ids: tuple[str, ...]
    keep: np.ndarray
    greedy: np.ndarray | None
    log_p_exact: np.ndarray

    def restricted(self, sample_ids: Sequence[str]) -> ExtractionMatrices:
        """Restrict the matrices to a subset of the records, in the given order.

        Args:
            sample_ids (Sequence[str]): the records kept, each one of `self.sample_ids`.
        Returns:
            ExtractionMatrices: the same matrices on those records.
        """
        pos = {s: i for i, s in enumerate(self.sample_ids)}
        idx = np.array([pos[s] for s in sample_ids], dtype=np.int64)
        greedy = None if self.greedy is None else self.greedy[:, idx]
        return ExtractionMatrices(
            self.quantizer, self.runs, tuple(sample_ids), self.keep[:, idx], greedy, self.log_p_exact[:, idx]
        )


def extraction_matrices(df: pd.DataFrame, quantizer: str) -> ExtractionMatrices:
    """Build the `ExtractionMatrices` of one quantizer's final checkpoints on split "pool".

    The records are those scored by every run, as the attacks take them
    (`llmaudit.analyze.attacks.matrices.target_matrices`).

    Args:
        df (pd.DataFrame): a loss table, or a light table carrying `sequence_bits` and `GREEDY`.
        quantizer (str): the quantizer's name.
    Returns:
        ExtractionMatrices: membership, greedy extraction (None without top-1 flags) and log p_z, [M, N] each.
    Raises:
        LossTableError: when the quantizer has no pool rows.
    """
    t = target_matrices(df, quantizer)
    rows = t.rows.assign(_greedy=rows_greedy(t.rows), _log_p=rows_log_p_exact(t.rows))
    greedy = pivot(rows, "_greedy", t.runs, t.samples).astype(np.float64)
    return ExtractionMatrices(
        quantizer,
        tuple(int(r) for r in t.runs),
        tuple(t.samples),
        t.keep,
        None if np.isnan(greedy).all() else greedy,
        pivot(rows, "_log_p", t.runs, t.samples).astype(np.float64),
    )


class GreedyCheck(BaseModel):
    """Greedy extraction read from the top-1 flags against the greedy answers actually generated (the validation
    records answered at each run's final checkpoint): how many rows agree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: str
    answers: int
    """Rows with both a generated answer and top-1 flags."""
    both: int
    """Every response token top-1 AND the answer equals the reference response."""
    top1_only: int
    """Every token top-1 but the answer differs: would contradict the equivalence (0 where decoding is greedy)."""
    text_only: int
    """The answer equals the reference text though some token is not top-1: the model spelled the same text with
    other tokens than the reference's tokenization, or the reference text ends where the model would go on."""
    rate_top1: float | None
    rate_text: float | None
    agree: bool
    """top1_only == 0 and text_only == 0: the two rates are equal row by row."""


def text_reproduced(generated: str, reference_output: str) -> bool:
    """Say whether a generated answer equals the record's reference response, both stripped.

    Args:
        generated (str): the answer as the scorer stores it (decoded without special tokens, stripped).
        reference_output (str): the record's reference response.
    Returns:
        bool: True when they are equal.
    """
    return generated.strip() == reference_output.strip()


def greedy_check(quantizer: str, top1: Sequence, generated: Sequence, reference_outputs: Sequence[str]) -> GreedyCheck:
    """Compare greedy extraction read from the top-1 flags with the greedy answers actually generated.

    Rows without a generated answer or without flags are left out.

    Args:
        quantizer (str): the quantizer's name.
        top1 (Sequence): [n] each row's top-1 flags.
        generated (Sequence): [n] each row's generated answer (None: not generated).
        reference_outputs (Sequence[str]): [n] the records' reference responses (`output`).
    Returns:
        GreedyCheck: the counts of rows where the two readings agree and differ.
    Raises:
        ValueError: when the three sequences differ in length.
    """
    counts = {"both": 0, "top1_only": 0, "text_only": 0, "neither": 0}
    for flags, text, ref in zip(top1, generated, reference_outputs, strict=True):
        greedy = greedy_extracted(flags)
        if not isinstance(text, str) or math.isnan(greedy):
            continue
        same = text_reproduced(text, ref)
        key = ("both" if same else "top1_only") if greedy else ("text_only" if same else "neither")
        counts[key] += 1
    n = sum(counts.values())
    return GreedyCheck(
        quantizer=quantizer,
        answers=n,
        both=counts["both"],
        top1_only=counts["top1_only"],
        text_only=counts["text_only"],
        rate_top1=(counts["both"] + counts["top1_only"]) / n if n else None,
        rate_text=(counts["both"] + counts["text_only"]) / n if n else None,
        agree=counts["top1_only"] == 0 and counts["text_only"] == 0,
    )


def greedy_check_of_table(df: pd.DataFrame, quantizer: str, outputs: Mapping[str, str]) -> GreedyCheck:
    """Run `greedy_check` on the validation rows at each run's final checkpoint that hold a generated answer.

    Args:
        df (pd.DataFrame): the loss table.
        quantizer (str): the quantizer's name.
        outputs (Mapping[str, str]): {sample_id: the record's reference response} (the store's validation records).
    Returns:
        GreedyCheck: the comparison (no rows when the table has no generations or no top-1 flags).
    """
    val = df[(df["quantizer"] == quantizer) & (df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    if "generated" not in val.columns or "token_top1" not in val.columns or val.empty:
        return greedy_check(quantizer, [], [], [])
    final = val["checkpoint"] == val.groupby("run")["checkpoint"].transform("max")
    rows = val[final & val["generated"].map(lambda g: isinstance(g, str))]
    refs = [outputs[s] for s in rows["sample_id"]]
    return greedy_check(quantizer, list(rows["token_top1"]), list(rows["generated"]), refs)
