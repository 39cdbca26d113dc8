"""The loss table: llmaudit's public interchange format (parquet).

One row per (run, checkpoint, quantizer, sample). Any tool can write one and feed it to
`llmaudit indicator`, `llmaudit attack` or `llmaudit memorization` ("bring your own losses").

Required columns
    run           int    index of the fine-tuning run; -1 = the reference unit: the base model before
                         fine-tuning, scored once per data set under the reference (full-precision)
                         quantizer and, with score.matched_base, once more under every other quantizer.
                         "base" in the attacks (ref, EZ-MIA, WBC) means these rows
    checkpoint    int    optimizer step of the checkpoint along the run's trajectory (0 for the base)
    quantizer     str    quantizer name (see `llmaudit.quantize.list_quantizers()`)
    sample_id     str    stable id of the sample
    split         str    "pool" (candidate training samples; membership varies per run) or "val"
                         (held-out validation samples, never trained on by any run)
    member        bool   True iff the sample was in this run's training set
    loss          float  mean negative log-likelihood (nats) over the scored tokens
    n_tokens      int    number of scored tokens
    token_losses  list<float>  per-token negative log-likelihoods (nats), in order
Optional columns
    token_vocab_mean, token_vocab_std  list<float>  at each scored position, the mean and standard
                         deviation of log p(v) for v drawn from the MODEL'S OWN next-token distribution:
                         E_{v~p}[log p(v)] (minus its entropy) and sqrt(Var_{v~p}[log p(v)]), as
                         Min-K%++ defines them. NOT the plain average over the vocabulary (uniform weights;
                         some tools store that): such a column gives a wrong Min-K%++, and
                         `uniform_vocab_mean_evidence` recognises it where it can
    token_top1    list<bool>  at each scored position, whether the model's top-1 prediction (argmax of
                         the logits, the lowest token id on ties) is the scored token (needed by EZ-MIA);
                         added in loss-table version 2
    zlib_bytes    int    zlib-compressed length (bytes) of the scored text (needed by the zlib attack)
    point_id      str    digest of the quantized weights: equal ids mean the same quantized point
    token_kl      list<float>  per scored token, KL(p_ref || p_q) in nats of this model's next-token
                         distribution from the unquantized model of the same checkpoint (val rows of a run's final
                         checkpoint; null elsewhere)
    token_same_top list<bool>  per scored token, whether both models' most likely next token is the same
    generated     str    the model's greedy answer to the record's prompt (the generation subset of the val rows of
                         a run's final checkpoint; null elsewhere), for the task metrics
A unit file that holds these also records how they were made in its parquet metadata (UTILITY_METADATA_KEY).

Versions: 1 = the columns above without token_top1 (tables written before it, and any table without
version metadata); 2 = token_top1 added. llmaudit writes the version into the parquet metadata
(`llmaudit.loss_table_version`) and reads every version up to its own; a table of version 1 is read and
reported as before, with EZ-MIA "not measurable: table predates top-1".
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from llmaudit.common.bounded import InputLimitError, read_parquet_bounded
from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_bytes
from llmaudit.common.names import SAFE_NAME_RULE, is_safe_name
from llmaudit.store.table_columns import BOOL_LISTS, FLOAT_LISTS, is_text, pairs_unique, table_frame

REQUIRED_COLUMNS: dict[str, str] = {
    "run": "int",
    "checkpoint": "int",
    "quantizer": "str",
    "sample_id": "str",
    "split": "str",
    "member": "bool",
    "loss": "float",
    "n_tokens": "int",
    "token_losses": "list<float>",
}

UTILITY_METADATA_KEY = b"llmaudit.utility"
"""Parquet schema metadata of a unit file with utility columns: JSON of the settings they were made with."""

REFERENCE_RUN = -1

LOSS_TABLE_VERSION = 2
"""The loss-table version this llmaudit writes (module doc: what each version holds)."""

VERSION_KEY = b"llmaudit.loss_table_version"

SPLITS = ("pool", "val")

SCHEMA = pa.schema(
    [
        ("run", pa.int32()),
        ("checkpoint", pa.int64()),
        ("quantizer", pa.string()),
        ("sample_id", pa.string()),
        ("split", pa.string()),
        ("member", pa.bool_()),
        ("loss", pa.float64()),
        ("n_tokens", pa.int32()),
        ("token_losses", pa.list_(pa.float32())),
    ]
)

OPTIONAL_SCHEMA = {
    "token_vocab_mean": pa.list_(pa.float32()),
    "token_vocab_std": pa.list_(pa.float32()),
    "token_top1": pa.list_(pa.bool_()),
    "zlib_bytes": pa.int32(),
    "point_id": pa.string(),
    "token_kl": pa.list_(pa.float32()),
    "token_same_top": pa.list_(pa.bool_()),
    "generated": pa.string(),
}


class LossTableError(UserError):
    """A loss table does not follow the documented format."""


def validate_loss_table(df: pd.DataFrame, *, source: str = "loss table") -> pd.DataFrame:
    """Check columns, types and values; return the frame with canonical dtypes. Raises LossTableError."""
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise LossTableError(
            f"{source}: missing column(s) {missing}. A loss table needs {list(REQUIRED_COLUMNS)} "
            "(see `llmaudit.losstable` or the README section 'Loss tables')."
        )
    _check_nulls(df, source)
    df = _canonical_dtypes(df, source)
    bad_split = sorted(set(df["split"].unique()) - set(SPLITS))
    if bad_split:
        raise LossTableError(f"{source}: unknown split value(s) {bad_split}; allowed: {list(SPLITS)}.")
    if ((df["split"].to_numpy() == "val") & df["member"].to_numpy()).any():
        raise LossTableError(
            f"{source}: a 'val' row is marked member=True; validation samples must never be trained on."
        )
    n_tokens = df["n_tokens"].to_numpy()
    if (np.fromiter(map(len, df["token_losses"].to_numpy()), np.int64, len(df)) != n_tokens).any():
        lengths = df["token_losses"].map(len)
        first = df.index[(lengths != df["n_tokens"]).to_numpy()][0]
        raise LossTableError(
            f"{source}: row {first}: len(token_losses)={lengths[first]} but n_tokens={df.at[first, 'n_tokens']}."
        )
    if (n_tokens <= 0).any():
        raise LossTableError(f"{source}: every row needs at least one scored token (n_tokens > 0).")
    bad_names = sorted({q for q in df["quantizer"].unique() if not is_safe_name(q)})
    if bad_names:
        raise LossTableError(f"{source}: quantizer name(s) {bad_names[:3]} are not allowed: use {SAFE_NAME_RULE}.")
    nonfinite = ~np.isfinite(df["loss"].to_numpy())
    if nonfinite.any():
        rows = df.loc[nonfinite, ["run", "checkpoint", "quantizer"]].drop_duplicates().head(5)
        raise LossTableError(
            f"{source}: {int(nonfinite.sum())} non-finite loss value(s), e.g. at "
            f"{rows.to_dict('records')}. A quantized model that diverges cannot be scored; drop that "
            "quantizer or check the checkpoint."
        )
    _check_token_columns(df, source)
    if not pairs_unique(df):  # where each (run, sample) has one row, neither check below can fail
        _check_duplicates(df, source)
        check_one_membership(df, source)
    return df


def _canonical_dtypes(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """A copy with the canonical dtypes: int64 run/checkpoint/n_tokens, float64 loss, str names, bool member."""
    df = df.copy()
    try:
        for col, dtype in (("run", "int64"), ("checkpoint", "int64"), ("n_tokens", "int64"), ("loss", "float64")):
            if df[col].dtype != dtype:  # a column of that dtype already is left as it is
                df[col] = df[col].astype(dtype)
    except (TypeError, ValueError) as exc:
        raise LossTableError(f"{source}: a numeric column holds non-numbers ({exc}).") from exc
    for col in ("quantizer", "sample_id", "split"):
        if not is_text(df[col]):
            df[col] = df[col].astype(str)
    if df["member"].dtype != bool:
        if not df["member"].isin([0, 1, True, False]).all():
            raise LossTableError(f"{source}: column 'member' must be boolean (True/False or 0/1).")
        df["member"] = df["member"].astype(bool)
    return df


def _check_nulls(df: pd.DataFrame, source: str) -> None:
    """No required value is null: a null sample_id would read as the id "None", a null token list has no length."""
    for col in (c for c in REQUIRED_COLUMNS if c != "loss"):  # a NaN loss is refused below, as non-finite
        column = df[col]
        if isinstance(column.dtype, np.dtype) and column.dtype.kind in "iub":
            continue  # a numpy integer or boolean column holds no null
        null = column.isna().to_numpy()
        if null.any():
            raise LossTableError(
                f"{source}: column {col!r} is null in {int(null.sum())} row(s), first at row {int(np.flatnonzero(null)[0])}; "
                "every row needs a value there (write the table again, or drop those rows)."
            )


def _check_duplicates(df: pd.DataFrame, source: str) -> None:
    dup = df.duplicated(["run", "checkpoint", "quantizer", "sample_id"])
    if dup.any():
        raise LossTableError(f"{source}: {int(dup.sum())} duplicate (run, checkpoint, quantizer, sample_id) row(s).")


def check_one_membership(df: pd.DataFrame, source: str, *, files: np.ndarray | None = None) -> None:
    """One (run, sample) has one membership: a run trained on a sample or it did not, whatever the quantizer
    or checkpoint its losses were scored at. LossTableError naming the first contradicting (run, sample), the
    rows (quantizer, checkpoint and, for a directory of tables, file) and how many more there are.
    files: the file of each row (tables read from a directory)."""
    if df.empty:
        return
    counts = df.groupby(["run", "sample_id"], sort=True)["member"].nunique()
    bad = counts[counts > 1]
    if bad.empty:
        return
    run, sample = bad.index[0]
    at = np.flatnonzero(((df["run"] == run) & (df["sample_id"] == sample)).to_numpy())
    rows = [
        f"quantizer {df['quantizer'].iat[i]} checkpoint {df['checkpoint'].iat[i]}"
        + (f" in {files[i]}" if files is not None else "")
        + f": member={bool(df['member'].iat[i])}"
        for i in at[:4]
    ]
    more = f"; and {len(bad) - 1} more (run, sample) pair(s)" if len(bad) > 1 else ""
    raise LossTableError(
        f"{source}: the member flags of run {run}, sample {sample!r} differ between rows ({'; '.join(rows)}"
        f"{'; ...' if len(at) > 4 else ''}){more}. One (run, sample) has one membership: correct the flags "
        "where they were written (in a run store, `llmaudit score RUN_DIR` rescores the units that contradict it)."
    )


def _flat(column: pd.Series | np.ndarray, source: str, name: str) -> np.ndarray:
    """The rows' values of a token column joined as float64 (each row as `np.asarray(row, dtype=np.float64)`
    flattened); LossTableError where a row holds non-numbers."""
    rows = column.to_numpy() if isinstance(column, pd.Series) else column
    if len(rows) and all(type(v) is np.ndarray and v.dtype == np.float64 and v.ndim == 1 for v in rows):
        return np.concatenate(list(rows))  # the rows `read_parquet_file` makes: joined as they are
    try:
        return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in column]) if len(column) else np.zeros(0)
    except (TypeError, ValueError) as exc:
        raise LossTableError(f"{source}: column '{name}' holds non-numbers ({exc}).") from None


def _first_bad_row(df: pd.DataFrame, bad_tokens: np.ndarray, offsets: np.ndarray) -> dict:
    row = int(np.searchsorted(offsets, np.flatnonzero(bad_tokens)[0], side="right") - 1)
    return df.iloc[row][["run", "checkpoint", "quantizer", "sample_id"]].to_dict()


NEGATIVE_TOLERANCE = 1e-4
"""A token NLL is >= 0; tables written by other tools may carry float rounding of about -1e-7 for tokens
with p ~ 1 (llmaudit clamps it), so only values below -1e-4 are refused."""


def _check_token_columns(df: pd.DataFrame, source: str) -> None:
    """Per-token values: finite non-negative NLLs whose mean is the row's loss; finite vocabulary statistics
    (std >= 0); positive zlib lengths. A NaN hidden in token_losses would change min-k% and Min-K%++."""
    flat = _flat(df["token_losses"], source, "token_losses")
    offsets = np.concatenate([[0], np.cumsum(df["n_tokens"].to_numpy())])[:-1]
    bad = ~np.isfinite(flat) | (flat < -NEGATIVE_TOLERANCE)
    if bad.any():
        raise LossTableError(
            f"{source}: token_losses hold {int(bad.sum())} non-finite or negative value(s), first at "
            f"{_first_bad_row(df, bad, offsets)}; rescore that unit (`llmaudit score` redoes a failed unit)."
        )
    if len(df):
        means = np.add.reduceat(flat, offsets) / df["n_tokens"].to_numpy()
        off = ~np.isclose(means, df["loss"].to_numpy(), rtol=1e-4, atol=1e-5)
        if off.any():
            row = df.iloc[int(np.flatnonzero(off)[0])]
            raise LossTableError(
                f"{source}: 'loss' is not the mean of 'token_losses' for {int(off.sum())} row(s), e.g. run "
                f"{row['run']} checkpoint {row['checkpoint']} quantizer {row['quantizer']} sample {row['sample_id']!r}."
            )
    for col in ("token_vocab_mean", "token_vocab_std"):
        if col in df.columns and pd.notna(df[col].to_numpy()).all():
            values = _flat(df[col], source, col)
            if values.size != flat.size:
                raise LossTableError(f"{source}: '{col}' does not hold one value per scored token.")
            bad = ~np.isfinite(values) | ((values < 0) if col == "token_vocab_std" else False)
            if bad.any():
                raise LossTableError(
                    f"{source}: '{col}' holds {int(bad.sum())} invalid value(s), first at {_first_bad_row(df, bad, offsets)}."
                )
    if "zlib_bytes" in df.columns and df["zlib_bytes"].notna().all() and (df["zlib_bytes"].to_numpy() <= 0).any():
        raise LossTableError(f"{source}: 'zlib_bytes' must be positive byte counts.")
    if "token_top1" in df.columns:
        _check_top1(df, source)
    _check_divergence_columns(df, source)


def _check_top1(df: pd.DataFrame, source: str) -> None:
    """token_top1: per row either missing (a row of a version-1 table read beside newer ones) or one
    boolean per scored token."""
    for i, (value, n) in enumerate(zip(df["token_top1"].to_numpy(), df["n_tokens"].to_numpy())):
        if type(value) is np.ndarray and value.dtype == bool and value.ndim == 1 and value.size == n:
            continue  # the rows `read_parquet_file` makes
        if value is None or (np.ndim(value) == 0 and pd.isna(value)):
            continue
        flags = np.asarray(value)
        if flags.ndim != 1 or flags.size != n or not (flags.dtype == bool or np.isin(flags, (0, 1)).all()):
            row = df.iloc[i][["run", "checkpoint", "quantizer", "sample_id"]].to_dict()
            raise LossTableError(
                f"{source}: 'token_top1' must hold one boolean per scored token (n_tokens={n}); row {row} does not."
            )


LOG_VOCAB_BOUND = 24 * math.log(2)
"""log V for the largest vocabulary allowed for (2^24 tokens): Fano's bound below holds for any V up to it."""


def uniform_vocab_mean_evidence(token_losses, token_vocab_mean, *, min_positions: int = 5) -> str | None:
    """Why `token_vocab_mean` cannot be E_{v~p}[log p(v)] under the model's own distribution, or None.

    token_losses, token_vocab_mean: per text, [T] arrays. Two tests, neither of which a mean under the model's
    distribution can fail (minus the entropy H_t):
    - Fano's inequality: where the scored token has probability q = exp(-l_t) >= 1/2 >= 1/V, the top token
      has probability p_max >= q and H_t <= h(q) + (1 - q) log(V - 1) with h the binary entropy. The plain
      vocabulary average (uniform weights) is at most -log V, far below -h(q) - (1 - q) log V at confident
      positions. Flagged when at least 10% of such positions (and min_positions) break the bound by 1e-3.
    - a mean that is the same at every position (e.g. -log V written as a constant): a model's entropy varies.
    At positions where the model is unsure the two means cannot be told apart from the table alone."""
    losses = np.concatenate(list(token_losses), axis=None).astype(np.float64)  # one C loop, not one call per text
    means = np.concatenate(list(token_vocab_mean), axis=None).astype(np.float64)
    if losses.size != means.size or losses.size < min_positions:
        return None
    q = np.exp(-losses)
    confident = q >= 0.5
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(q * np.log(q) + np.where(q < 1, (1 - q) * np.log1p(-q), 0.0))
    bound = h + (1 - q) * LOG_VOCAB_BOUND
    broken = confident & (-means > bound + 1e-3)
    if broken.sum() >= max(min_positions, 0.1 * confident.sum()):
        return (
            f"token_vocab_mean breaks Fano's bound at {int(broken.sum())} of {int(confident.sum())} positions where the "
            f"token has probability >= 1/2 (e.g. mean {means[broken][0]:.3g} at loss {losses[broken][0]:.3g}): it looks "
            "like the plain average of log p over the vocabulary, not the mean under the model's distribution that "
            "Min-K%++ needs; Min-K%++ on this table is wrong"
        )
    if np.ptp(means) <= 1e-6 * max(1.0, float(np.abs(means).max())):
        return (
            f"token_vocab_mean is {means[0]:.4g} at every one of {means.size} positions: a mean under the model's "
            "distribution varies with the position; Min-K%++ on this table is wrong"
        )
    return None


def _missing(value) -> bool:
    """None, NaN or pandas' NA: a row a column does not apply to."""
    return value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value))


def _check_divergence_columns(df: pd.DataFrame, source: str) -> None:
    """token_kl / token_same_top where present (null rows allowed): one value per scored token, KL finite and
    >= 0, agreement boolean; generated: text or null."""
    for col in ("token_kl", "token_same_top"):
        if col not in df.columns:
            continue
        column = df[col].to_numpy()
        present = np.fromiter((not _missing(v) for v in column), bool, len(column))
        if not present.any():
            continue
        lists = column[present]
        if (np.fromiter(map(len, lists), np.int64, len(lists)) != df["n_tokens"].to_numpy()[present]).any():
            raise LossTableError(
                f"{source}: '{col}' does not hold one value per scored token in every row that has it."
            )
        values = _flat(lists, source, col)
        bad = (
            ~np.isfinite(values) | (values < -NEGATIVE_TOLERANCE) if col == "token_kl" else ~np.isin(values, (0.0, 1.0))
        )
        if bad.any():
            raise LossTableError(
                f"{source}: '{col}' holds {int(bad.sum())} invalid value(s) (KL must be finite and >= 0, agreement "
                "boolean); rescore that unit (`llmaudit score` redoes a failed unit)."
            )
    if (
        "generated" in df.columns
        and not is_text(df["generated"])
        and not df["generated"].map(lambda v: isinstance(v, str) or _missing(v)).all()
    ):
        raise LossTableError(f"{source}: 'generated' must hold text or null.")


def to_arrow(df: pd.DataFrame) -> pa.Table:
    fields = list(SCHEMA)
    for col, typ in OPTIONAL_SCHEMA.items():
        if col in df.columns:
            fields.append(pa.field(col, typ))
    schema = pa.schema(fields, metadata={VERSION_KEY: str(LOSS_TABLE_VERSION).encode()})
    return pa.Table.from_pandas(df[[f.name for f in fields]], schema=schema, preserve_index=False)


def table_version(schema: pa.Schema, source: str) -> int:
    """The loss-table version a parquet schema declares (1 without the metadata); LossTableError for a
    version newer than this llmaudit reads."""
    raw = (schema.metadata or {}).get(VERSION_KEY)
    try:
        version = 1 if raw is None else int(raw)
    except ValueError:
        raise LossTableError(f"{source}: loss-table version {raw[:20]!r} is not a number.") from None
    if version > LOSS_TABLE_VERSION:
        raise LossTableError(
            f"{source}: loss-table version {version} is newer than this llmaudit reads ({LOSS_TABLE_VERSION}); "
            "upgrade llmaudit."
        )
    return version


def write_loss_table(df: pd.DataFrame, path: str | os.PathLike, *, metadata: dict[bytes, bytes] | None = None) -> Path:
    """Validate and write atomically as parquet; `metadata` is added to the file's schema metadata."""
    df = validate_loss_table(df, source=str(path))
    table = to_arrow(df)
    if metadata:
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return atomic_write_bytes(path, buf.getvalue())


def read_parquet_file(path: Path) -> pd.DataFrame:
    """One parquet file as a frame (token columns as float64 arrays), LossTableError naming the file
    when it is truncated, corrupt or not parquet."""
    try:
        table = read_parquet_bounded(path, what="loss table")  # bounded before it is decoded
        df, converted = table_frame(table)
    except InputLimitError as exc:
        raise LossTableError(str(exc)) from None
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise LossTableError(
            f"{path}: not a readable parquet file ({str(exc).splitlines()[0][:200]}); if it is a scoring unit, "
            "`llmaudit score RUN_DIR` scores it again."
        ) from None
    table_version(table.schema, str(path))
    for col in (c for c in FLOAT_LISTS if c in df.columns and c not in converted):
        try:
            df[col] = df[col].map(lambda v: None if v is None else np.asarray(v, dtype=np.float64))
        except (TypeError, ValueError) as exc:
            raise LossTableError(
                f"{path}: column {col!r} holds non-numbers ({' '.join(str(exc).split())[:120]}); it holds one "
                "list of numbers per row."
            ) from None
    for col in (c for c in BOOL_LISTS if c in df.columns and c not in converted):
        df[col] = df[col].map(lambda v: None if v is None else np.asarray(v, dtype=bool))
    return df


def unit_metadata(path: str | os.PathLike) -> dict[bytes, bytes]:
    """A parquet file's schema metadata (empty when it has none or cannot be read)."""
    try:
        return dict(pq.read_schema(path).metadata or {})
    except (pa.ArrowException, OSError, ValueError):
        return {}


def read_loss_table(
    path: str | os.PathLike,
    *,
    files: list[Path] | None = None,
    each: Callable[[pd.DataFrame], pd.DataFrame] | None = None,
) -> pd.DataFrame:
    """Read one parquet file, or every `*.parquet` below a directory (or the given `files`), and validate.
    each: applied to every file's validated frame before the frames are joined (the analysis keeps a light copy
    of each: `llmaudit.analyze.store_table`), so no more than one file's whole frame is held at a time.
    Errors name the file at fault."""
    path = Path(path)
    if files is None:
        if not path.exists():
            raise LossTableError(
                f"loss table {path} does not exist; pass a parquet file or a directory of them "
                "(an audit writes them under RUN_DIR/scores/)."
            )
        files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise LossTableError(f"{path}: no *.parquet files found.")
    keep = each or (lambda frame: frame)
    frames = [keep(validate_loss_table(read_parquet_file(f), source=str(f))) for f in files]
    if len(frames) == 1:
        return frames[0]
    df = pd.concat(frames, ignore_index=True)
    _check_duplicates(df, str(path))
    check_one_membership(df, str(path), files=np.repeat([str(f) for f in files], [len(f) for f in frames]))
    return df


def loss_matrix(
    df: pd.DataFrame, *, run: int, quantizer: str, split: str = "val"
) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Per-sample losses of one (run, quantizer) along its trajectory.

    Returns (checkpoints [K], sample_ids [n], losses [K, n]) with checkpoints ascending and the same
    sample order in every row. Raises LossTableError if checkpoints cover different samples."""
    sub = df[(df["run"] == run) & (df["quantizer"] == quantizer) & (df["split"] == split)]
    if sub.empty:
        raise LossTableError(f"no rows for run={run}, quantizer={quantizer!r}, split={split!r}.")
    wide = sub.pivot(index="checkpoint", columns="sample_id", values="loss").sort_index()
    if wide.isna().any().any():
        raise LossTableError(
            f"run={run}, quantizer={quantizer!r}: checkpoints were scored on different samples; "
            "every checkpoint needs the same validation samples."
        )
    return wide.index.to_numpy(), [str(c) for c in wide.columns], wide.to_numpy(dtype=np.float64)
