"""Bounds on every input llmaudit parses: bytes, nesting depth and counts, each with a one-line refusal.

A received run directory, a user's data file or a recipe may be careless or hostile: JSON nested a million
levels deep (Python's parser recurses and dies with a traceback), a YAML alias that expands to a billion
values (minutes, then out of memory), a date where a string was meant, a file of many gigabytes, a FIFO that
blocks a read forever. Every JSON and YAML parse of llmaudit goes through `parse_json` / `load_yaml`, and every
file read whole through `check_file`, so such input is refused before it costs memory or time, in one line
naming the file (or key) and the limit.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import stat
from collections.abc import Iterator
from typing import Any

import yaml

from llmaudit.common.errors import UserError

MAX_DEPTH = 64
"""Nesting levels of a JSON or YAML value. llmaudit's own files need at most 8 (a manifest's imported block),
Trainer's trainer_state.json 4; deeper input is refused before code that walks it recursively sees it."""
MAX_JSON_BYTES = 512 * 2**20
"""A JSON file read whole (manifest, run record, trainer_state.json, a user's JSON data file): the largest
llmaudit writes, a manifest of 1,000 runs x 50,000 membership characters, is 50 MB."""
MAX_LINE_BYTES = 64 * 2**20
"""One line of a JSONL file (one record, one work-log entry)."""
MAX_JSONL_BYTES = 16 * 2**30
"""A JSONL or parquet data file (read record by record; the records are kept in memory)."""
MAX_ROWS = 10_000_000
"""Records in one data file, rows in one loss table: above SMolInstruct's 3.3M training samples."""
MAX_YAML_BYTES = 2**20
"""A recipe (the shipped ones are a few KB) or one `key=value` override."""


LFS_POINTER = b"version https://git-lfs"
"""How a Git LFS pointer file starts: the small text file a clone without `git lfs pull` holds in place of a large
file (a model's weights)."""


def magic_problem(path: str | os.PathLike, magic: bytes, kind: str) -> str | None:
    """Why the file at `path` is not a `kind` file starting with `magic` (a Git LFS pointer, an empty file, other
    bytes), or None when it starts as one should.

    Args:
        path: the file.
        magic: the bytes a file of its kind starts with.
        kind: what it should be, for the message ("GGUF").

    Returns:
        The reason in words (with the fix for an LFS pointer), or None.
    """
    with open(path, "rb") as handle:
        head = handle.read(max(len(magic), len(LFS_POINTER)))
    if head.startswith(LFS_POINTER):
        return (
            f"is a Git LFS pointer (a small text file that stands for the real {kind} file), not the file itself; "
            "fix: fetch it with `git lfs pull` (or download the file) and pass that"
        )
    if not head.startswith(magic):
        return f"does not start with {kind}'s magic bytes {magic!r} (it starts with {head[: len(magic)]!r}): not a {kind} file"
    return None


class InputLimitError(UserError):
    """An input exceeds a bound (bytes, depth, count) or is not plain data; the message names it and the bound."""


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def check_file(path: str | os.PathLike, *, limit: int, what: str = "file") -> int:
    """The size of a regular file at `path`, refused when it is not a regular file (a FIFO or device would block
    or never end) or larger than `limit` bytes. FileNotFoundError passes through for the caller to word."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise InputLimitError(f"{what} {path} is not a regular file; llmaudit reads only regular files.")
    if info.st_size > limit:
        raise InputLimitError(
            f"{what} {path} is {_mib(info.st_size)}, above the {_mib(limit)} llmaudit reads for it; "
            "pass a smaller file (or split it)."
        )
    return info.st_size


def json_depth(value: Any) -> int:
    """Nesting depth of a parsed JSON/YAML value (a scalar is 0, [] and {} are 1), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1) for v in node)
            deepest = max(deepest, depth + 1)
    return deepest


def _too_deep(where: str, max_depth: int) -> InputLimitError:
    return InputLimitError(
        f"{where} is nested more than {max_depth} levels deep, which llmaudit does not read (no file it uses "
        "needs more); it is damaged or not the file you meant."
    )


def parse_json(text: str | bytes, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of `text`; InputLimitError naming `where` when it is nested deeper than `max_depth`.
    json.JSONDecodeError passes through (callers word it with their fix); an integer too long for Python
    (over 4,300 digits) is reported like invalid JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(where, max_depth) from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:  # int digit limit, surrogates
        raise json.JSONDecodeError(str(exc).splitlines()[0][:200], "", 0) from None
    if json_depth(value) > max_depth:
        raise _too_deep(where, max_depth)
    return value


class _PlainDataLoader(yaml.SafeLoader):
    """YAML as plain data: no aliases (a nested alias expands exponentially), dates stay strings."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "an alias (*name) is not accepted: write the value out", event.start_mark
            )
        return super().compose_node(parent, index)


# Dates and times (YYYY-MM-DD ...) are read as the strings they are written as, not as datetime objects.
_PlainDataLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}

_PLAIN = (str, int, float, bool, type(None))


def _not_plain(value: Any, path: str = "") -> str | None:
    """The dotted key of the first value that is not plain JSON data (bytes, a set, a date), or None."""
    stack = [(value, path)]
    while stack:
        node, where = stack.pop()
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, _PLAIN):
                    return f"{where or '(top level)'} (a key of type {type(key).__name__})"
                stack.append((child, f"{where}.{key}" if where else str(key)))
        elif isinstance(node, list):
            stack.extend((child, f"{where}[{i}]") for i, child in enumerate(node))
        elif not isinstance(node, _PLAIN):
            kind = "date" if isinstance(node, (_dt.date, _dt.datetime)) else type(node).__name__
            return f"{where or '(top level)'} (a {kind})"
    return None


def load_yaml(text: str, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """The YAML value of `text` as plain JSON-compatible data: at most MAX_YAML_BYTES, `max_depth` levels, no
    aliases, dates kept as strings, no binary, set or other tagged values. InputLimitError naming `where`;
    yaml.YAMLError passes through for syntax errors."""
    if len(text.encode("utf-8", errors="replace")) > MAX_YAML_BYTES:
        raise InputLimitError(f"{where} is over {_mib(MAX_YAML_BYTES)}, which no recipe needs; check the file.")
    try:
        value = yaml.load(text, Loader=_PlainDataLoader)  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise _too_deep(where, max_depth) from None
    if json_depth(value) > max_depth:
        raise _too_deep(where, max_depth)
    bad = _not_plain(value)
    if bad:
        raise InputLimitError(
            f"{where}: {bad} is not plain data (a string, number, boolean, list or mapping); quote it or write it "
            "as one of those."
        )
    return value


class JsonLineError(UserError):
    """A line of a JSONL file that is not valid JSON (or not UTF-8): `where` is FILE:LINE, `reason` the parser's."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where} is not valid JSON ({reason})")
        self.where, self.reason = where, reason


def read_jsonl(
    path: str | os.PathLike, *, what: str = "JSONL file", limit: int = MAX_JSONL_BYTES, max_rows: int = MAX_ROWS
) -> Iterator[tuple[str, Any]]:
    """(where = 'FILE:LINE', value) of every non-empty line of a JSONL file, each line read at most
    MAX_LINE_BYTES at a time (a file without newlines never lands in memory whole), each value `parse_json`ed;
    InputLimitError beyond `limit` bytes, MAX_LINE_BYTES per line or `max_rows` lines; JsonLineError naming
    the line when it is not valid JSON."""
    check_file(path, limit=limit, what=what)
    rows = 0
    with open(path, encoding="utf-8") as handle:
        lineno = 0
        while True:
            lineno += 1
            where = f"{path}:{lineno}"
            try:
                line = handle.readline(MAX_LINE_BYTES + 1)
            except UnicodeDecodeError:
                raise JsonLineError(where, "not UTF-8 text") from None
            if not line:
                return
            if len(line) > MAX_LINE_BYTES:
                raise InputLimitError(f"{where} is a line of over {_mib(MAX_LINE_BYTES)}, more than any record needs.")
            if not line.strip():
                continue
            rows += 1
            if rows > max_rows:
                raise InputLimitError(f"{what} {path} holds more than {max_rows:,} lines, more than llmaudit reads.")
            try:
                yield where, parse_json(line, where)
            except json.JSONDecodeError as exc:
                raise JsonLineError(where, exc.msg) from None


MAX_PARQUET_VALUES = 500_000_000
"""Values (leaf values of every column: a loss table's token losses included) in one parquet file: 4 GB as
float64, 80x a unit of the paper's experiment (20,000 samples x 300 tokens)."""
MAX_DECODED_BYTES = 4 * 2**30
"""Bytes a parquet file's columns take once decoded (a string repeated in a dictionary decodes once per row)."""


def check_parquet(path: str | os.PathLike, *, what: str = "parquet file", max_rows: int = MAX_ROWS) -> None:
    """Refuse a parquet file with more than `max_rows` rows, MAX_PARQUET_VALUES values or MAX_JSONL_BYTES of
    uncompressed pages (a few compressed bytes can expand to gigabytes), from its footer alone. Unreadable files
    pass through to the reader, which words its own error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    check_file(path, limit=MAX_JSONL_BYTES, what=what)
    try:
        meta = pq.ParquetFile(path).metadata
    except (pa.ArrowException, OSError, ValueError):
        return
    if meta.num_rows > max_rows:
        raise InputLimitError(f"{what} {path} holds {meta.num_rows:,} rows, more than the {max_rows:,} llmaudit reads.")
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    values = sum(g.column(c).num_values for g in groups for c in range(g.num_columns))
    if values > MAX_PARQUET_VALUES:
        raise InputLimitError(
            f"{what} {path} holds {values:,} values, more than the {MAX_PARQUET_VALUES:,} llmaudit reads from one file."
        )
    size = sum(g.total_byte_size for g in groups)
    if size > MAX_JSONL_BYTES:
        raise InputLimitError(
            f"{what} {path} expands to {_mib(size)} uncompressed, above the {_mib(MAX_JSONL_BYTES)} llmaudit reads."
        )


def read_parquet_bounded(
    path: str | os.PathLike, *, what: str = "parquet file", columns: list[str] | None = None
) -> Any:
    """The pyarrow Table of a parquet file whose decoded size is known before it is decoded: the footer's
    bounds (`check_parquet`), then the top-level string columns read dictionary-encoded (each distinct string
    once), their decoded size summed from the dictionary and refused above MAX_DECODED_BYTES, and only then
    decoded. The same table `pyarrow.parquet.read_table` returns."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    check_parquet(path, what=what)
    schema = pq.ParquetFile(path).schema_arrow
    wanted = [f for f in schema if columns is None or f.name in columns]
    strings = [f.name for f in wanted if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]
    if columns is None and len(set(schema.names)) == len(schema.names):  # skips read_table's dataset layer
        with pq.ParquetFile(path, read_dictionary=strings) as parquet:
            table = parquet.read()
    else:  # read_table refuses a column the file lacks or holds twice (ParquetFile.read would not)
        table = pq.read_table(path, columns=columns, read_dictionary=strings)
    decoded = sum(table.column(f.name).nbytes for f in wanted if f.name not in strings)
    for name in strings:
        for chunk in table.column(name).chunks:
            lengths = pc.binary_length(chunk.dictionary)
            decoded += int(pc.sum(pc.take(lengths, chunk.indices)).as_py() or 0)
    if decoded > MAX_DECODED_BYTES:
        raise InputLimitError(
            f"{what} {path} decodes to {_mib(decoded)}, above the {_mib(MAX_DECODED_BYTES)} llmaudit reads from one file."
        )
    target = [schema.field(n) if n in strings else table.schema.field(n) for n in table.column_names]
    return table.cast(pa.schema(target, metadata=table.schema.metadata))
