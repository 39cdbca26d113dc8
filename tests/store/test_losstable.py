"""Every branch of loss-table validation: each bad table is refused with a message naming what is wrong."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llmaudit.store.losstable import (
    LOSS_TABLE_VERSION,
    VERSION_KEY,
    LossTableError,
    read_loss_table,
    uniform_vocab_mean_evidence,
    validate_loss_table,
    write_loss_table,
)


def table(**changes) -> pd.DataFrame:
    rows = []
    for j in range(4):
        tl = np.array([1.0, 2.0, 3.0]) * (j + 1) / 4
        rows.append(
            dict(
                run=0,
                checkpoint=10,
                quantizer="fp32",
                sample_id=f"s{j}",
                split="pool" if j < 2 else "val",
                member=j == 0,
                loss=float(tl.mean()),
                n_tokens=3,
                token_losses=tl,
                token_vocab_mean=-np.ones(3),
                token_vocab_std=np.ones(3),
                zlib_bytes=20 + j,
            )
        )
    df = pd.DataFrame(rows)
    for fn in changes.values():
        df = fn(df)
    return df


def set_at(col, row, value):
    def fn(df):
        df = df.copy()
        df[col] = df[col].astype(object)
        df.at[row, col] = value
        return df

    return fn


def test_a_valid_table_round_trips(tmp_path):
    path = write_loss_table(table(), tmp_path / "t.parquet")
    back = read_loss_table(path)
    assert len(back) == 4 and back["loss"].tolist() == pytest.approx(table()["loss"].tolist())
    assert back["member"].dtype == bool


@pytest.mark.parametrize(
    "change, message",
    [
        ({"x": lambda df: df.drop(columns=["token_losses"])}, "missing column"),
        ({"x": set_at("loss", 0, "abc")}, "non-numbers"),
        ({"x": set_at("member", 1, 5)}, "must be boolean"),
        ({"x": set_at("split", 1, "train")}, "unknown split"),
        ({"x": set_at("member", 2, True)}, "'val' row is marked member=True"),
        ({"x": set_at("n_tokens", 0, 4)}, "len(token_losses)=3 but n_tokens=4"),
        ({"x": lambda df: df.assign(n_tokens=0, token_losses=[np.zeros(0)] * 4)}, "at least one scored token"),
        ({"x": set_at("loss", 3, np.inf)}, "non-finite loss"),
        ({"x": set_at("token_losses", 1, np.array([1.0, np.nan, 2.0]))}, "token_losses hold 1 non-finite or negative"),
        ({"x": set_at("token_losses", 1, np.array([1.0, -1.0, 2.0]))}, "non-finite or negative"),
        ({"x": set_at("loss", 1, 9.0)}, "is not the mean of 'token_losses'"),
        ({"x": set_at("token_vocab_std", 0, np.array([1.0, -0.5, 1.0]))}, "'token_vocab_std' holds 1 invalid"),
        ({"x": set_at("token_vocab_mean", 0, np.array([np.nan, 1.0, 1.0]))}, "'token_vocab_mean' holds 1 invalid"),
        ({"x": set_at("token_vocab_mean", 0, np.array([1.0, 1.0]))}, "one value per scored token"),
        ({"x": set_at("zlib_bytes", 0, 0)}, "positive byte counts"),
        ({"x": lambda df: pd.concat([df, df.iloc[:1]], ignore_index=True)}, "duplicate"),
        ({"x": set_at("quantizer", 0, "../x")}, "not allowed"),
    ],
)
def test_each_bad_table_is_refused(change, message):
    with pytest.raises(LossTableError) as err:
        validate_loss_table(table(**change), source="my.parquet")
    assert message in str(err.value) and "my.parquet" in str(err.value)


def test_unreadable_and_missing_files_name_the_file(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(LossTableError, match="bad.parquet: not a readable parquet file"):
        read_loss_table(bad)
    with pytest.raises(LossTableError, match="does not exist"):
        read_loss_table(tmp_path / "none.parquet")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LossTableError, match="no \\*.parquet files"):
        read_loss_table(tmp_path / "empty")


def test_a_directory_of_tables_is_checked_file_by_file(tmp_path):
    write_loss_table(table(), tmp_path / "a.parquet")
    other = table(x=lambda df: df.assign(run=1))
    write_loss_table(other, tmp_path / "b.parquet")
    assert len(read_loss_table(tmp_path)) == 8
    write_loss_table(table(), tmp_path / "c.parquet")  # the same rows as a.parquet
    with pytest.raises(LossTableError, match="duplicate"):
        read_loss_table(tmp_path)


# ------------------------------------------------------------------------- top-1 column and versions


def _with_top1(df: pd.DataFrame) -> pd.DataFrame:
    return df.assign(token_top1=[np.array([True, False, j % 2 == 0]) for j in range(len(df))])


def test_top1_round_trips_as_booleans_in_a_version_2_table(tmp_path):
    path = write_loss_table(_with_top1(table()), tmp_path / "t.parquet")
    assert pq.read_schema(path).metadata[VERSION_KEY] == str(LOSS_TABLE_VERSION).encode() == b"2"
    back = read_loss_table(path)
    assert [v.dtype for v in back["token_top1"]] == [np.dtype(bool)] * 4
    assert [v.tolist() for v in back["token_top1"]] == [[True, False, j % 2 == 0] for j in range(4)]


def test_a_version_1_table_reads_beside_a_version_2_one(tmp_path):
    """A table written before top-1 (no column, no version metadata) still reads, alone or in a directory
    with newer units; its rows then carry no top-1 flags."""
    old = table()
    pq.write_table(pa.Table.from_pandas(old, preserve_index=False), tmp_path / "old.parquet")
    assert pq.read_schema(tmp_path / "old.parquet").metadata.get(VERSION_KEY) is None
    assert "token_top1" not in read_loss_table(tmp_path / "old.parquet").columns
    write_loss_table(_with_top1(table(x=lambda df: df.assign(run=1))), tmp_path / "new.parquet")
    both = read_loss_table(tmp_path)
    has = both["token_top1"].map(lambda v: isinstance(v, np.ndarray))
    assert has.tolist() == (both["run"] == 1).tolist() and len(both) == 8


def test_a_newer_table_version_and_bad_top1_flags_are_refused(tmp_path):
    frame = pa.Table.from_pandas(table(), preserve_index=False)
    pq.write_table(frame.replace_schema_metadata({VERSION_KEY: b"3"}), tmp_path / "v3.parquet")
    with pytest.raises(LossTableError, match="v3.parquet: loss-table version 3 is newer"):
        read_loss_table(tmp_path / "v3.parquet")
    short = _with_top1(table()).assign(token_top1=[np.array([True, False])] * 4)
    with pytest.raises(LossTableError, match="'token_top1' must hold one boolean per scored token"):
        validate_loss_table(short, source="my.parquet")


def _model_and_uniform_means(seed: int = 0, positions: int = 400, vocab: int = 50):
    """Token losses, the mean of log p under each position's distribution, and the plain vocabulary
    average of log p, from random logits of varied sharpness (many positions confident)."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(positions, vocab)) * rng.uniform(0.5, 8, size=(positions, 1))
    logp = (
        logits
        - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True))
        - logits.max(1, keepdims=True)
    )
    tokens = np.array([rng.choice(vocab, p=np.exp(row)) for row in logp])
    losses = -logp[np.arange(positions), tokens]
    model_mean = (np.exp(logp) * logp).sum(1)
    return np.split(losses, 8), np.split(model_mean, 8), np.split(logp.mean(1), 8)


def test_a_uniform_vocabulary_mean_is_recognised_and_the_model_mean_is_not():
    """Fano's bound can never be broken by a mean under the model's distribution (exact means of random
    distributions pass), while the plain vocabulary average (LeakPro's extractor) and a constant break it."""
    losses, model_mean, uniform_mean = _model_and_uniform_means()
    assert uniform_vocab_mean_evidence(losses, model_mean) is None
    why = uniform_vocab_mean_evidence(losses, uniform_mean)
    assert why is not None and "Fano" in why and "plain average" in why
    constant = [np.full(len(t), -3.9) for t in losses]
    high_loss = [np.full(len(t), 5.0) for t in losses]  # no confident position: only the constant test can fire
    assert "at every one of 400 positions" in uniform_vocab_mean_evidence(high_loss, constant)
    assert uniform_vocab_mean_evidence(high_loss, [m + 0.01 * np.arange(len(m)) for m in constant]) is None


def with_utility(df: pd.DataFrame) -> pd.DataFrame:
    """The utility columns as the scorer writes them: on the validation rows only, null on the pool rows."""
    df = df.copy()
    val = df["split"] == "val"
    df["token_kl"] = [np.array([0.0, 0.5, 1e-6]) if v else None for v in val]
    df["token_same_top"] = [np.array([True, False, True]) if v else None for v in val]
    df["generated"] = ["<SMILES> CCO </SMILES>" if v else None for v in val]
    return df


def test_utility_columns_round_trip_with_their_metadata(tmp_path):
    from llmaudit.store.losstable import UTILITY_METADATA_KEY, unit_metadata

    path = write_loss_table(with_utility(table()), tmp_path / "t.parquet", metadata={UTILITY_METADATA_KEY: b"{}"})
    back = read_loss_table(path)
    assert back.loc[2, "token_kl"].tolist() == pytest.approx([0.0, 0.5, 1e-6])
    assert back.loc[3, "token_same_top"].dtype == bool and back.loc[3, "token_same_top"].tolist() == [True, False, True]
    assert back.loc[0, "token_kl"] is None and back.loc[2, "generated"] == "<SMILES> CCO </SMILES>"
    assert unit_metadata(path)[UTILITY_METADATA_KEY] == b"{}"
    assert UTILITY_METADATA_KEY not in unit_metadata(write_loss_table(table(), tmp_path / "old.parquet"))
    assert "token_kl" not in read_loss_table(tmp_path / "old.parquet").columns  # tables without them still read


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("token_kl", np.array([0.0, -0.1, 0.0]), "'token_kl' holds 1 invalid"),
        ("token_kl", np.array([0.0, np.nan, 0.0]), "'token_kl' holds 1 invalid"),
        ("token_kl", np.array([0.0, 0.1]), "one value per scored token"),
        ("token_same_top", np.array([0.0, 2.0, 1.0]), "'token_same_top' holds 1 invalid"),
        ("generated", 3.5, "'generated' must hold text or null"),
    ],
)
def test_tampered_utility_columns_are_refused(column, value, message):
    with pytest.raises(LossTableError, match=message):
        validate_loss_table(set_at(column, 2, value)(with_utility(table())))
