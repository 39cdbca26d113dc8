"""The reference model of the memorization view (`llmaudit.analyze.memorization`): which rows of a loss
table (or of a separate one) are the model that mem_U compares each target with, and the command-line
form that names it. Selection only; the bits are computed in `llmaudit.analyze.memorization`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from llmaudit.common.errors import UserError
from llmaudit.quantize.full import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError, read_loss_table, validate_loss_table

Reference = str | Mapping[str, Any] | pd.DataFrame
""""base", {"run": R, "quantizer": Q[, "checkpoint": C]}, or a loss table scored by the reference model."""


class MemorizationError(LossTableError):
    """The loss table cannot give the memorization view (for example: no reference rows)."""


HOW_TO_SCORE = (
    "Score the reference model once on every sample the runs were scored on (pool and val) and add "
    f"those rows with run={REFERENCE_RUN}, checkpoint=0, quantizer='fp32' (the base model before "
    "fine-tuning), or name another model's rows with reference={'run': R, 'quantizer': Q} "
    "(command line: --reference run=R,quantizer=Q), or pass a separate loss table scored by the "
    "reference model (--reference PATH.parquet)."
)


def parse_reference(text: str) -> Reference:
    """Read the command-line form of a reference.

    Args:
        text (str): "base", "run=R,quantizer=Q[,checkpoint=C]" or the path of a parquet loss table.
    Returns:
        Reference: "base", the mapping of run, quantizer (and checkpoint), or the loss table read.
    Raises:
        UserError: when the text is none of these, or the path does not exist.
    """
    text = text.strip()
    if text == "base":
        return "base"
    if "=" in text:
        spec: dict[str, Any] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or key not in ("run", "quantizer", "checkpoint"):
                raise UserError(
                    f"reference {text!r}: cannot read {part!r}; use base, "
                    "run=R,quantizer=Q[,checkpoint=C], or the path of a parquet loss table."
                )
            spec[key] = value if key == "quantizer" else int(value)
        return spec
    path = Path(text)
    if not path.exists():
        raise UserError(
            f"reference {text!r} is neither 'base', nor run=R,quantizer=Q[,checkpoint=C], nor an "
            "existing parquet loss table."
        )
    return read_loss_table(path)


def _single_model(rows: pd.DataFrame, what: str) -> pd.DataFrame:
    """Rows of exactly one (run, quantizer, checkpoint); the final checkpoint if several."""
    quantizers = sorted(rows["quantizer"].unique())
    if len(quantizers) > 1:
        full = full_precision_reference(quantizers)
        if full is None:
            raise MemorizationError(
                f"{what} holds rows under several quantizers {quantizers}; name one with "
                "reference={'run': R, 'quantizer': Q} (--reference run=R,quantizer=Q)."
            )
        rows = rows[rows["quantizer"] == full]
    runs = sorted(rows["run"].unique())
    if len(runs) > 1:
        raise MemorizationError(f"{what} holds rows of several runs {runs}; a reference is one model: keep one run.")
    return rows[rows["checkpoint"] == rows["checkpoint"].max()]


def _base_rows(df: pd.DataFrame, reference: str) -> pd.DataFrame:
    """reference = "base": the rows of run == REFERENCE_RUN (the base model before fine-tuning)."""
    if reference != "base":
        raise UserError(
            f"reference={reference!r}: use 'base', a mapping {{'run', 'quantizer'[, 'checkpoint']}} "
            "or a DataFrame of the reference model's rows."
        )
    rows = df[df["run"] == REFERENCE_RUN]
    if rows.empty:
        raise MemorizationError(
            f"the loss table has no reference rows (run == {REFERENCE_RUN}, the base model before "
            f"fine-tuning), which the memorization view needs. {HOW_TO_SCORE}"
        )
    return _single_model(rows, f"the base model's rows (run == {REFERENCE_RUN})")


def _named_rows(df: pd.DataFrame, reference: Mapping[str, Any]) -> pd.DataFrame:
    """reference = {"run": R, "quantizer": Q[, "checkpoint": C]}: those rows, at the final checkpoint if several."""
    unknown = set(reference) - {"run", "quantizer", "checkpoint"}
    if unknown or "run" not in reference or "quantizer" not in reference:
        raise UserError(
            f"reference={dict(reference)!r}: needs keys 'run' and 'quantizer' (and optionally "
            "'checkpoint'); nothing else."
        )
    run, quantizer = int(reference["run"]), str(reference["quantizer"])
    rows = df[(df["run"] == run) & (df["quantizer"] == quantizer)]
    if "checkpoint" in reference:
        rows = rows[rows["checkpoint"] == int(reference["checkpoint"])]
    if rows.empty:
        raise MemorizationError(
            f"no rows for the named reference {dict(reference)!r} in the loss table. {HOW_TO_SCORE}"
        )
    return rows[rows["checkpoint"] == rows["checkpoint"].max()]


def select_reference_rows(df: pd.DataFrame, reference: Reference) -> tuple[pd.DataFrame, str]:
    """Select the reference model's rows of one (run, quantizer, checkpoint).

    Args:
        df (pd.DataFrame): the loss table of the targets.
        reference (Reference): "base" (run == REFERENCE_RUN of `df`), a mapping naming rows of `df`, or a separate
            loss table scored by the reference model.
    Returns:
        tuple[pd.DataFrame, str]: the rows, and their kind: "base", "named" or "loss table".
    Raises:
        MemorizationError: when no such rows exist.
        TypeError: for a reference of another type.
    """
    if isinstance(reference, pd.DataFrame):
        rows = validate_loss_table(reference, source="reference loss table")
        return _single_model(rows, "the reference loss table"), "loss table"
    if isinstance(reference, str):
        return _base_rows(df, reference), "base"
    if isinstance(reference, Mapping):
        return _named_rows(df, reference), "named"
    raise TypeError(f"reference must be 'base', a mapping or a DataFrame; got {type(reference).__name__}.")
