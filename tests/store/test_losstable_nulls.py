"""A loss table with a null or a non-number where the format wants a value is refused in one line naming the
file (in a folder of tables, the bad one) and the column, by every command that reads loss tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmaudit.store.losstable import to_arrow, validate_loss_table
from tests.conftest import run_cli
from tests.store.test_losstable import table


def _write(df, path, **columns) -> None:
    """`df` as parquet with some columns replaced by raw pyarrow arrays (types the writer would never produce)."""
    t = to_arrow(validate_loss_table(df))
    for name, array in columns.items():
        t = t.set_column(t.schema.get_field_index(name), name, array)
    pq.write_table(t, path)


def _lists(values, value_type):
    return pa.array(values, type=pa.list_(value_type))


BAD = {
    "null token list": {
        "token_losses": _lists([None, [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]], pa.float64())
    },
    "text token losses": {"token_losses": _lists([["a", "b", "c"]] * 4, pa.string())},
    "null sample_id": {"sample_id": pa.array([None, "s1", "s2", "s3"], type=pa.string())},
}


@pytest.mark.parametrize("command", ["indicator", "attack", "memorization"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_table_in_a_folder_is_named(case, command, tmp_path):
    folder = tmp_path / "tables"
    folder.mkdir()
    _write(table(), folder / "good.parquet")
    other = table()
    other["run"] = 1
    _write(other, folder / "bad.parquet", **BAD[case])
    code, _, err = run_cli([command, folder, "--out", tmp_path / "out.json"])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(folder / "bad.parquet") in err and "good.parquet" not in err
    column = next(iter(BAD[case]))
    assert column in err
    assert not (tmp_path / "out.json").exists()


def test_a_null_sample_id_is_never_the_id_none():
    df = table()
    df["sample_id"] = df["sample_id"].astype(object)
    df.at[0, "sample_id"] = None
    with pytest.raises(Exception, match="'sample_id' is null"):
        validate_loss_table(df, source="t.parquet")
    assert np.isfinite(validate_loss_table(table())["loss"]).all()
