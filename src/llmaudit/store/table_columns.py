"""The loss-table reader's column work at arrow and numpy speed: the token lists of a parquet table converted from
their flat values and offsets, and the cheap tests that let `llmaudit.store.losstable` skip a conversion or a check
that cannot change anything. Each gives exactly what the row-by-row pandas code it replaces gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

PAIRS_CHECKED_IN_PYTHON = 100_000
"""Up to this many rows (one unit file's), `pairs_unique` hashes the rows' (run, sample_id) in Python, a few
microseconds a row; above it pandas' own checks run at once."""


def pairs_unique(df: pd.DataFrame) -> bool:
    """Tell whether no two rows of a small frame share (run, sample_id): then no two rows share (run, checkpoint,
    quantizer, sample_id) and no (run, sample) can have two member flags.

    Args:
        df (pd.DataFrame): loss-table rows with `run` and `sample_id`.
    Returns:
        bool: True when every (run, sample_id) is on one row; False when one is on several, or for a frame above
            `PAIRS_CHECKED_IN_PYTHON` rows (not looked at).
    """
    if len(df) > PAIRS_CHECKED_IN_PYTHON:
        return False
    return len(set(zip(df["run"].tolist(), df["sample_id"].tolist()))) == len(df)


STR_DTYPE = pd.Series(["a"]).astype(str).dtype
"""The dtype `astype(str)` gives a column (pandas' string dtype; object before pandas 3)."""


def is_text(column: pd.Series) -> bool:
    """Tell whether a column has pandas' string dtype, so holds text or null in every row.

    Args:
        column (pd.Series): a frame's column.
    Returns:
        bool: True for pandas' string dtype (`STR_DTYPE`); False otherwise, and for every object column (what
            `astype(str)` gives before pandas 3), which may hold other objects.
    """
    return not isinstance(STR_DTYPE, np.dtype) and column.dtype == STR_DTYPE  # object: before pandas 3


FLOAT_LISTS = ("token_losses", "token_vocab_mean", "token_vocab_std", "token_kl")
"""The per-token number columns: each row read as a float64 array (None for a null row)."""

BOOL_LISTS = ("token_top1", "token_same_top")
"""The per-token flag columns: each row read as a bool array (None for a null row)."""


def list_rows(column: pa.ChunkedArray, dtype: type) -> np.ndarray | None:
    """Convert each row of an arrow list column to its own numpy array from the flat values and the offsets.

    The arrays are those `np.asarray(v, dtype)` makes of `to_pandas()`'s rows: the same values and dtype, a null
    number NaN, a null flag False, a null row None; each row owns its values (no view keeps the whole column).

    Args:
        column (pa.ChunkedArray): a token list column.
        dtype (type): np.float64 for number lists, bool for flag lists.
    Returns:
        np.ndarray | None: [rows] object array of the rows' arrays; None where the column is not a list of float32
            or float64 numbers (`dtype` np.float64) or of booleans (`dtype` bool), for the caller to convert row by row.
    """
    kind = column.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)):
        return None
    element = kind.value_type
    if not (
        pa.types.is_boolean(element) if dtype is bool else pa.types.is_float32(element) or pa.types.is_float64(element)
    ):
        return None
    rows = np.empty(len(column), dtype=object)
    at = 0
    for chunk in column.chunks:
        values = pc.fill_null(chunk.values, False) if dtype is bool else chunk.values
        flat = values.to_numpy(zero_copy_only=False)  # a null number reads NaN
        offsets = chunk.offsets.to_numpy().tolist()
        valid = chunk.is_valid().to_numpy(zero_copy_only=False).tolist()
        for start, end, ok in zip(offsets, offsets[1:], valid):  # one by one: a slice assignment of equal-length
            rows[at] = flat[start:end].astype(dtype) if ok else None  # arrays would broadcast them as a 2-D array
            at += 1
    return rows


def table_frame(table: pa.Table) -> tuple[pd.DataFrame, set[str]]:
    """Convert a loss table to a frame: `table.to_pandas()`, the token list columns `list_rows` converts converted.

    Args:
        table (pa.Table): a parquet file's table.
    Returns:
        tuple[pd.DataFrame, set[str]]: the frame, and the names of the `FLOAT_LISTS` and `BOOL_LISTS` columns it holds
            converted (float64 or bool arrays); the others are as `to_pandas` gives them. A table with a repeated
            column name is left to `to_pandas` whole.
    """
    names = table.column_names
    fast: dict[str, np.ndarray] = {}
    if len(set(names)) == len(names):
        for col in (*FLOAT_LISTS, *BOOL_LISTS):
            if col in names:
                rows = list_rows(table.column(col), bool if col in BOOL_LISTS else np.float64)
                if rows is not None:
                    fast[col] = rows
                    table = table.set_column(names.index(col), col, pa.nulls(len(table)))
    df = table.to_pandas()
    for col, rows in fast.items():
        df[col] = rows
    return df, set(fast)
