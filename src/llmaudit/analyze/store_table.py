"""A store's loss tables as the analysis reads them: the token lists of one quantizer's units at a time.

The token lists are the bulk of a store: every pooled sample under every run and quantizer at the final checkpoint,
and every validation sample at every checkpoint of every run's trajectory (on the paper's grid 4.8 million rows of
each). The analysis reads them in two places only: the attacks (the pool rows and the target's validation texts
of one quantizer) and the divergence from full precision (the validation rows of each run's final unit). It
therefore holds a *light table*: every row of every unit, each file read and validated as `read_loss_table` does,
each row with its scalars (loss, member, n_tokens, zlib_bytes, generated text), its sequence's bits
(`SEQUENCE_BITS`, what memorization reads) and its greedy extraction flag (`GREEDY`, from its top-1 flags); only
the validation rows of a run's final unit keep their token lists.
The attacks on one quantizer read that quantizer's units whole again (`StoreTable.rows_of`), in the process that
attacks it, and let them go when they are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from llmaudit.analyze.extraction import GREEDY, rows_greedy
from llmaudit.analyze.memorization import SEQUENCE_BITS, sequences_bits
from llmaudit.store.losstable import OPTIONAL_SCHEMA, REFERENCE_RUN, SCHEMA, read_loss_table

TOKEN_LISTS = tuple(
    name for name, kind in [*zip(SCHEMA.names, SCHEMA.types), *OPTIONAL_SCHEMA.items()] if pa.types.is_list(kind)
)
"""The loss table's per-token columns (one list per row)."""


@dataclass(frozen=True)
class UnitFile:
    """A scoring unit's loss table: the unit's (run, step, quantizer) key (`store.units.Unit`) and its file.

    Attributes:
        run: the fine-tuning run (`REFERENCE_RUN` for the base model).
        step: the checkpoint's training step.
        quantizer: the quantizer's registered name.
        path: the unit's parquet loss table.
    """

    run: int
    step: int
    quantizer: str
    path: Path


def final_steps(units: list[UnitFile]) -> dict[tuple[int, str], int]:
    """Find each run's final checkpoint under each quantizer: the step of its last unit.

    Args:
        units (list[UnitFile]): the store's units.
    Returns:
        dict[tuple[int, str], int]: {(run, quantizer): final step}.
    """
    finals: dict[tuple[int, str], int] = {}
    for u in units:
        finals[(u.run, u.quantizer)] = max(u.step, finals.get((u.run, u.quantizer), u.step))
    return finals


def light_frame(frame: pd.DataFrame, finals: dict[tuple[int, str], int]) -> pd.DataFrame:
    """Reduce one validated file's frame to what the light table keeps.

    Every row keeps its scalars, its `SEQUENCE_BITS` and its greedy extraction flag (`GREEDY`, what extraction risk
    reads); the token lists are kept only on validation rows at their run's final step (None elsewhere); the rows
    stay in their order.

    Args:
        frame (pd.DataFrame): one file's validated rows; left as it is.
        finals (dict[tuple[int, str], int]): {(run, quantizer): final step} (`final_steps`).
    Returns:
        pd.DataFrame: a new frame (built at once, not column by column): `frame`'s columns in their order, the token
            lists cleared where not kept, then `GREEDY` and `SEQUENCE_BITS`.
    """
    greedy = rows_greedy(frame).astype(np.float32)  # before SEQUENCE_BITS: a frame with it reads as a light table
    bits = sequences_bits(frame["token_losses"])
    keys = zip(frame["run"].tolist(), frame["quantizer"].tolist())
    final = np.fromiter((finals.get((int(run), str(q)), -1) for run, q in keys), np.int64, len(frame))
    keep = (frame["split"].to_numpy() == "val") & (frame["checkpoint"].to_numpy() == final)
    columns = {}
    for name in frame.columns:
        column = frame[name]
        if name in TOKEN_LISTS and not keep.all() and column.dtype == object:
            lists = column.to_numpy(copy=True)  # what `where(keep, None)` gives, without its overhead
            lists[~keep] = None
            columns[name] = lists
        elif name in TOKEN_LISTS and not keep.all():
            columns[name] = column.where(keep, None).array
        else:
            columns[name] = column.to_numpy() if isinstance(column.dtype, np.dtype) else column.array
    columns[GREEDY] = greedy
    columns[SEQUENCE_BITS] = bits
    return pd.DataFrame(columns, index=frame.index)


@dataclass(frozen=True)
class StoreTable:
    """The light table of a store's units, the units (in reading order) and `source` (the store's scores
    directory, what errors about the units together name)."""

    light: pd.DataFrame
    units: tuple[UnitFile, ...]
    source: Path

    def rows_of(self, quantizer: str, base_quantizer: str | None) -> pd.DataFrame:
        """Read the rows, token lists included, that the attacks on one quantizer read.

        They are the rows of its own units (the fine-tuned runs' pool and validation rows, its quantization-matched base
        model's) and the base model's under `base_quantizer`, in the order of the whole table, so the attacks compute
        the same numbers.

        Args:
            quantizer (str): the quantizer attacked.
            base_quantizer (str | None): the quantizer of the base-model rows "base" means.
        Returns:
            pd.DataFrame: the rows.
        Raises:
            LossTableError: naming the file at fault.
        """
        files = [
            u.path
            for u in self.units
            if u.quantizer == quantizer or (u.run == REFERENCE_RUN and u.quantizer == base_quantizer)
        ]
        return read_loss_table(self.source, files=files)


def read_store_table(source: Path, units: list[UnitFile]) -> StoreTable:
    """Read the light table of these units, in this order.

    Args:
        source (Path): the store's scores directory.
        units (list[UnitFile]): the units to read.
    Returns:
        StoreTable: the light table, the units and the source.
    Raises:
        LossTableError: naming the file at fault, as `read_loss_table`.
    """
    finals = final_steps(units)
    light = read_loss_table(source, files=[u.path for u in units], each=lambda frame: light_frame(frame, finals))
    return StoreTable(light, tuple(units), Path(source))
