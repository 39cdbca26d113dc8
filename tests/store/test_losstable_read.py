"""Reading a loss table's token lists straight from arrow gives exactly the frame the row-by-row conversion of
`table.to_pandas()` gives (None rows, empty lists, null values, several chunks, sliced arrays, other element
types), and a file whose token list column holds the wrong type is still refused naming the file."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmaudit.store.losstable import LossTableError, read_loss_table, read_parquet_file, validate_loss_table
from llmaudit.store.table_columns import BOOL_LISTS, FLOAT_LISTS, list_rows


def straightforward(table: pa.Table) -> pd.DataFrame:
    """The frame as `to_pandas()` and a conversion of every row give it."""
    df = table.to_pandas()
    for col in FLOAT_LISTS:
        if col in df.columns:
            df[col] = df[col].map(lambda v: None if v is None else np.asarray(v, dtype=np.float64))
    for col in BOOL_LISTS:
        if col in df.columns:
            df[col] = df[col].map(lambda v: None if v is None else np.asarray(v, dtype=bool))
    return df


def assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Every column, dtype and value equal, and each per-row array of the same dtype and values."""
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    for col in want.columns:
        if want[col].dtype != object:
            continue
        for a, b in zip(got[col], want[col]):
            assert type(a) is type(b), (col, a, b)
            if isinstance(b, np.ndarray):
                assert a.dtype == b.dtype and a.shape == b.shape, (col, a, b)
                assert np.array_equal(a, b, equal_nan=b.dtype.kind == "f"), (col, a, b)
                assert a.base is None or b.base is not None  # no view keeps a whole file's values alive


LOSSES = [[0.5, 1.5], None, [], [float("nan"), None, 2.0], [3.0]]
FLAGS = [[True, False], None, [], [None, True, False], [True]]


def odd_table() -> pa.Table:
    """Five rows whose token lists hold a null row, an empty list and null values, in two chunks."""
    columns = {
        "run": pa.array([0, 0, 1, 1, 2], pa.int32()),
        "sample_id": pa.array(["a", "b", "c", "d", "e"]),
        "token_losses": pa.array(LOSSES, pa.list_(pa.float32())),
        "token_vocab_mean": pa.array(LOSSES, pa.large_list(pa.float64())),
        "token_kl": pa.array([[1, 2], None, [], [None, 3], [4]], pa.list_(pa.int64())),  # converted row by row
        "token_top1": pa.array(FLAGS, pa.list_(pa.bool_())),
        "token_same_top": pa.array([[1, 0], None, [], [None, 1, 0], [2]], pa.list_(pa.int8())),
    }
    whole = pa.table(columns)
    return pa.concat_tables([whole.slice(0, 2), whole.slice(2)])


def test_fast_conversion_gives_the_straightforward_frame(tmp_path):
    table = odd_table()
    assert table.column("token_losses").num_chunks == 2
    path = tmp_path / "odd.parquet"
    pq.write_table(table, path)
    assert_same_frame(read_parquet_file(path), straightforward(pq.read_table(path)))
    rows = read_parquet_file(path)
    assert rows["token_losses"][1] is None and rows["token_losses"][2].size == 0
    assert np.isnan(rows["token_losses"][3][:2]).all() and rows["token_losses"][3][2] == 2.0
    assert rows["token_top1"][3].tolist() == [False, True, False]  # a null flag reads False, as row by row


@pytest.mark.parametrize("dtype", [np.float64, bool])
def test_list_rows_of_chunked_and_sliced_columns(dtype):
    values = LOSSES if dtype is np.float64 else FLAGS
    kind = pa.list_(pa.float32() if dtype is np.float64 else pa.bool_())
    array = pa.array(values * 3, kind).slice(3, 9)  # an offset into both the lists and their values
    column = pa.chunked_array([array.slice(0, 4), array.slice(4)])
    got = list_rows(column, dtype)
    want = pa.table({"c": column}).to_pandas()["c"].map(lambda v: None if v is None else np.asarray(v, dtype=dtype))
    assert len(got) == len(want) == 9
    for a, b in zip(got, want):
        assert (a is None) == (b is None)
        if b is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b, equal_nan=dtype is np.float64)


def test_list_rows_leaves_other_types_to_the_row_by_row_conversion():
    assert list_rows(pa.chunked_array([pa.array([[1, 2]], pa.list_(pa.int64()))]), np.float64) is None
    assert list_rows(pa.chunked_array([pa.array([[1.0]], pa.list_(pa.float32()))]), bool) is None
    assert list_rows(pa.chunked_array([pa.array(["1.0"])]), np.float64) is None


def unit_table(token_losses: pa.Array) -> pa.Table:
    return pa.table(
        {
            "run": pa.array([0, 0], pa.int32()),
            "checkpoint": pa.array([10, 10], pa.int64()),
            "quantizer": ["fp32", "fp32"],
            "sample_id": ["s0", "s1"],
            "split": ["pool", "val"],
            "member": [True, False],
            "loss": [1.0, 2.0],
            "n_tokens": pa.array([2, 1], pa.int32()),
            "token_losses": token_losses,
            "token_top1": pa.array([[True, False], [True]], pa.list_(pa.bool_())),
        }
    )


def test_a_valid_unit_reads_as_the_straightforward_frame(tmp_path):
    path = tmp_path / "unit.parquet"
    pq.write_table(unit_table(pa.array([[0.5, 1.5], [2.0]], pa.list_(pa.float32()))), path)
    frame = read_loss_table(path)
    assert_same_frame(frame, validate_loss_table(straightforward(pq.read_table(path)), source=str(path)))
    assert frame["run"].dtype == np.int64 and frame["n_tokens"].dtype == np.int64


@pytest.mark.parametrize(
    "token_losses",
    [
        pa.array([["a", "b"], ["c"]], pa.list_(pa.string())),
        pa.array(["0.5 1.5", "x"]),
        pa.array([[b"\x00", b"\x01"], [b"\x02"]], pa.list_(pa.binary())),
    ],
    ids=["list of text", "text", "list of bytes"],
)
def test_a_token_list_column_of_the_wrong_type_is_refused_naming_the_file(tmp_path, token_losses):
    path = tmp_path / "bad-unit.parquet"
    pq.write_table(unit_table(token_losses), path)
    with pytest.raises(LossTableError, match="bad-unit.parquet"):
        read_loss_table(tmp_path)


def two_checkpoints(member_at_20: bool) -> pd.DataFrame:
    """A pool sample scored at checkpoints 10 and 20 of run 0, a member at 10."""
    row = dict(run=0, quantizer="fp32", sample_id="s0", split="pool", loss=1.0, n_tokens=1)
    return pd.DataFrame(
        [
            {**row, "checkpoint": 10, "member": True, "token_losses": np.array([1.0])},
            {**row, "checkpoint": 20, "member": member_at_20, "token_losses": np.array([1.0])},
        ]
    )


def test_a_sample_seen_twice_in_one_table_is_checked_for_one_membership():
    assert len(validate_loss_table(two_checkpoints(member_at_20=True))) == 2
    with pytest.raises(LossTableError, match="member flags of run 0, sample 's0' differ"):
        validate_loss_table(two_checkpoints(member_at_20=False), source="t.parquet")
    with pytest.raises(LossTableError, match="1 duplicate"):
        validate_loss_table(pd.concat([two_checkpoints(True)] * 2, ignore_index=True).iloc[:3], source="t.parquet")


def test_a_unit_with_a_repeated_column_is_refused_naming_the_file(tmp_path):
    table = unit_table(pa.array([[0.5, 1.5], [2.0]], pa.list_(pa.float32())))
    pq.write_table(table.append_column("token_losses", table.column("token_losses")), tmp_path / "twice.parquet")
    with pytest.raises(LossTableError, match="twice.parquet: not a readable parquet file"):
        read_loss_table(tmp_path)
