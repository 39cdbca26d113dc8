"""A store's loss tables as the analysis reads them: memory bounded by one quantizer's token lists.

The pool rows' token lists (every pooled sample under every run and quantizer: the bulk of a store) are read by the
attacks alone. The analysis therefore holds a *light table*: every row of every unit, each file read and validated as
`read_loss_table` does, where a pool row keeps its scalars (loss, member, n_tokens, zlib_bytes), gains its sequence's
bits (`SEQUENCE_BITS`, what memorization reads) and drops its token lists; validation rows keep theirs (utility,
divergence and task metrics read them). The attacks on one quantizer read that quantizer's units whole again
(`StoreTable.rows_of`), in the process that attacks it, and let them go when they are done.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa

from llmaudit.analyze.memorization import SEQUENCE_BITS, sequences_bits
from llmaudit.store.losstable import OPTIONAL_SCHEMA, REFERENCE_RUN, SCHEMA, read_loss_table

TOKEN_LISTS = tuple(
    name for name, kind in [*zip(SCHEMA.names, SCHEMA.types), *OPTIONAL_SCHEMA.items()] if pa.types.is_list(kind)
)
"""The loss table's per-token columns (one list per row)."""


def light_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """One validated file's frame as the light table keeps it: every row with its `SEQUENCE_BITS`, the pool rows
    without their token lists (None), the rows in their order."""
    frame[SEQUENCE_BITS] = sequences_bits(frame["token_losses"])
    pool = frame["split"].to_numpy() == "pool"
    if pool.any():
        for column in TOKEN_LISTS:
            if column in frame.columns:
                frame[column] = frame[column].where(~pool, None)
    return frame


@dataclass(frozen=True)
class StoreTable:
    """The light table of a store's units and, per unit, its run, quantizer and file (in reading order); `source`
    (the store's scores directory) is what errors about the units together name."""

    light: pd.DataFrame
    units: tuple[tuple[int, str, Path], ...]
    source: Path

    def rows_of(self, quantizer: str, base_quantizer: str | None) -> pd.DataFrame:
        """The rows, token lists included, that the attacks on `quantizer` read: those of its own units (the
        fine-tuned runs' pool and validation rows, its quantization-matched base model's) and the base model's under
        `base_quantizer`, in the order of the whole table, so the attacks compute the same numbers."""
        files = [
            path for run, q, path in self.units if q == quantizer or (run == REFERENCE_RUN and q == base_quantizer)
        ]
        return read_loss_table(self.source, files=files)


def read_store_table(source: Path, units: list[tuple[int, str, Path]]) -> StoreTable:
    """The `StoreTable` of these units (run, quantizer, file), read in this order. LossTableError naming the file
    at fault, as `read_loss_table`."""
    light = read_loss_table(source, files=[path for _, _, path in units], each=light_frame)
    return StoreTable(light, tuple(units), Path(source))
