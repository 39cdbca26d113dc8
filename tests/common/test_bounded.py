"""Every input parse is bounded (common/bounded.py), and every size a recipe sets has an upper bound with a reason."""

from __future__ import annotations

import json
import os
import typing

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import BaseModel

from llmaudit.common import bounded
from llmaudit.common.bounded import (
    InputLimitError,
    JsonLineError,
    check_file,
    check_parquet,
    json_depth,
    load_yaml,
    parse_json,
    read_jsonl,
    read_parquet_bounded,
)
from llmaudit.common.io import read_json
from llmaudit.config import UPPER_BOUND_WHY, ExperimentConfig, RecipeError, config_from_dict, load_recipe


def test_json_depth_is_counted_without_recursion():
    assert json_depth(1) == 0 and json_depth([]) == 1 and json_depth({"a": [1, {"b": []}]}) == 4
    deep: list = []
    node = deep
    for _ in range(100_000):  # far deeper than Python's recursion limit
        node.append([])
        node = node[0]
    assert json_depth(deep) == 100_001


@pytest.mark.parametrize("depth, ok", [(64, True), (65, False), (500, False), (300_000, False)])
def test_parse_json_refuses_nesting_beyond_the_bound(depth, ok):
    text = "[" * depth + "]" * depth
    if ok:
        assert json_depth(parse_json(text, "x")) == 64
    else:  # 500: parsed by Python, refused by the walk; 300,000: Python's parser itself gives up
        with pytest.raises(InputLimitError, match="x is nested more than 64 levels deep"):
            parse_json(text, "x")


def test_parse_json_reports_an_overlong_integer_as_invalid_json():
    with pytest.raises(json.JSONDecodeError, match="integer"):
        parse_json("1" * 5000, "x")


def test_read_json_refuses_a_fifo_and_a_file_over_its_bound(tmp_path):
    fifo = tmp_path / "m.json"
    os.mkfifo(fifo)
    with pytest.raises(InputLimitError, match="not a regular file"):
        read_json(fifo, what="manifest")  # returns at once: a FIFO is never opened
    big = tmp_path / "big.json"
    big.write_text(json.dumps(["x" * 100] * 100))
    with pytest.raises(InputLimitError, match=f"manifest {big} is 0 MiB, above the 0 MiB .* Restore it"):
        read_json(big, what="manifest", fix="Restore it.", limit=1000)


def test_read_jsonl_bounds_lines_and_rows_and_names_the_line(tmp_path, monkeypatch):
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert [w for w, _ in read_jsonl(path)] == [f"{path}:1", f"{path}:3"]
    with pytest.raises(InputLimitError, match="more than 1 lines"):
        list(read_jsonl(path, max_rows=1))
    path.write_text('{"a": 1}\n{"a": \n')
    with pytest.raises(JsonLineError) as err:
        list(read_jsonl(path))
    assert err.value.where == f"{path}:2"
    monkeypatch.setattr(bounded, "MAX_LINE_BYTES", 16)
    path.write_text('{"a": "' + "x" * 10_000 + '"}')  # one line, no newline: never read whole
    with pytest.raises(InputLimitError, match=f"{path}:1 is a line of over"):
        list(read_jsonl(path))


def test_parquet_is_bounded_by_its_footer_and_its_decoded_size(tmp_path, monkeypatch):
    path = tmp_path / "t.parquet"
    frame = pd.DataFrame({"x": [0.0] * 200_000, "s": ["y" * 1000] * 200_000, "i": range(200_000)})
    frame.to_parquet(path)  # 200 MB of strings once decoded, about 1 MB on disk (one dictionary entry)
    assert os.path.getsize(path) < 2 * 2**20
    assert read_parquet_bounded(path).to_pandas().equals(pq.read_table(path).to_pandas())
    with pytest.raises(InputLimitError, match="200,000 rows, more than the 1,000"):
        check_parquet(path, max_rows=1000)
    monkeypatch.setattr(bounded, "MAX_PARQUET_VALUES", 500_000)
    with pytest.raises(InputLimitError, match="600,000 values, more than the 500,000"):
        check_parquet(path)
    monkeypatch.setattr(bounded, "MAX_PARQUET_VALUES", 10**9)
    monkeypatch.setattr(bounded, "MAX_DECODED_BYTES", 100 * 2**20)
    with pytest.raises(InputLimitError, match="decodes to 19[0-9] MiB, above the 100 MiB"):
        read_parquet_bounded(path)
    assert read_parquet_bounded(path, columns=["x", "i"]).column_names == ["x", "i"]  # strings not read: fine


def test_load_yaml_is_plain_data_without_aliases():
    assert load_yaml("a: 2024-01-01\nb: [1, 2.5, null, true]\n", "r") == {"a": "2024-01-01", "b": [1, 2.5, None, True]}
    with pytest.raises(yaml.YAMLError, match="alias"):
        load_yaml("a: &x [1]\nb: *x\n", "r")
    with pytest.raises(yaml.YAMLError, match="alias"):
        load_yaml("base: &b {x: 1}\nother:\n  <<: *b\n", "r")  # merge keys are aliases too
    for text, what in [
        ("a: !!binary aGk=", "a (a bytes)"),
        ("a: !!set {x: null}", "a (a set)"),
        ("a: {b: !!timestamp 2024-01-01}", "a.b (a date)"),
    ]:
        with pytest.raises(
            InputLimitError, match=rf"r: {what.replace('(', '[(]').replace(')', '[)]')} is not plain data"
        ):
            load_yaml(text, "r")
    with pytest.raises(InputLimitError, match="nested more than 64"):
        load_yaml("a: " + "[" * 70 + "]" * 70, "r")
    with pytest.raises(InputLimitError, match="over 1 MiB"):
        load_yaml("a: " + "x" * (2**20 + 1), "r")


def test_check_file_passes_a_missing_file_through_for_the_caller_to_word(tmp_path):
    with pytest.raises(FileNotFoundError):
        check_file(tmp_path / "absent", limit=10)


def _size_fields(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from _size_fields(annotation, f"{prefix}{name}.")
            continue
        args = typing.get_args(annotation) or (annotation,)
        if int in args and bool not in args and not name.endswith("seed"):
            yield f"{prefix}{name}", field, "int"
        elif typing.get_origin(annotation) in (list, dict):
            yield f"{prefix}{name}", field, "container"


def test_every_size_in_a_recipe_has_an_upper_bound_that_says_why():
    fields = list(_size_fields(ExperimentConfig))
    assert len(fields) > 30
    for key, field, kind in fields:
        limits = {type(m).__name__: m for m in field.metadata}
        if kind == "int":
            assert "Le" in limits, f"{key} has no upper bound"
            assert UPPER_BOUND_WHY in (field.json_schema_extra or {}), f"{key}'s bound does not say why"
        else:
            assert "MaxLen" in limits, f"{key} has no length bound"


def test_an_absurd_size_is_refused_with_its_reason_before_anything_is_allocated():
    with pytest.raises(RecipeError) as err:
        load_recipe("demo-cpu", ["train.runs=300000000", "data.pool_size=300000000"])
    message = str(err.value)
    assert (
        "train.runs = 300000000: Input should be less than or equal to 1024 (each run is a complete fine-tune"
        in message
    )
    assert (
        "data.pool_size = 300000000: Input should be less than or equal to 1000000 (every sample is scored" in message
    )
    with pytest.raises(RecipeError, match=r"train.runs x data.pool_size = 1,000 x 100,000 = 100,000,000 is above"):
        config_from_dict({"train": {"runs": 1000}, "data": {"pool_size": 100_000}})
    with pytest.raises(RecipeError, match="checkpoints per run is above 10,000"):
        config_from_dict({"train": {"epochs": 5000, "checkpoints_per_epoch": 5}})


def test_parquet_read_whole_is_read_tables_table_and_a_missing_column_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame({"x": [0.5, None], "s": ["a", None], "l": [[1.0], None]}).to_parquet(path)
    whole = read_parquet_bounded(path)
    assert whole.equals(pq.read_table(path)) and whole.schema.equals(pq.read_table(path).schema, check_metadata=True)
    with pytest.raises(pa.ArrowInvalid, match="nope"):
        read_parquet_bounded(path, columns=["x", "nope"])


def test_parquet_with_a_repeated_column_name_is_refused(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table([pa.array([1]), pa.array([2])], names=["x", "x"]), path)
    with pytest.raises(pa.ArrowInvalid, match="Multiple matches"):
        read_parquet_bounded(path)
