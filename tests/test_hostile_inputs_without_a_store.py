"""Hostile inputs, without a store: every float setting is finite or refused when it loads; nothing a
store or `--quantized` names is loaded through a path that can unpickle; a user's GGUF header or quantized
directory that does not parse is one line naming the file (QuantizationError / exit 2), never an IndexError; text
from data reaches the terminal with its control characters escaped."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import logging
import os
import re
import struct
import sys
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel
from rich.text import Text

import llmaudit
from llmaudit.common.io import file_digest
from llmaudit.config import ExperimentConfig, RecipeError, load_recipe
from llmaudit.quantize.base import QuantizationError
from llmaudit.quantize.given import GivenFile, check_digests, describe, load_gguf, load_given
from llmaudit.validate.synthetic.config import SyntheticConfig, SyntheticConfigError
from llmaudit.validate.synthetic.config import load_config as load_synthetic
from tests.conftest import run_cli
from tests.tiny_models import tiny_causal_lm

SRC = Path(llmaudit.__file__).resolve().parent
"""The source of the package imported (not of this checkout), so the scan checks what runs."""
OSC0, OSC8, CSI, CR = "\x1b]0;TITLE\x07", "\x1b]8;;http://e.vil\x07link\x1b]8;;\x07", "\x1b[2K\x1b[1A", "\r"
HOSTILE = f"a{OSC0}b{OSC8}c{CSI}d{CR}all units verified\x9b1A\u202e"
CONTROL_KEEP_LINES = re.compile("[\t\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""What a terminal obeys instead of showing (line breaks aside)."""

# ------------------------------------------------------------------------------------------ finite settings


def float_fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted name of every field of `model` (and its sections) that holds a float."""
    names = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names += float_fields(annotation, f"{prefix}{name}.")
        elif annotation is float or float in typing.get_args(annotation):
            names.append(prefix + name)
    return names


FLOATS = float_fields(ExperimentConfig)


def test_the_float_settings_are_found():
    assert {"lora.alpha", "train.lr", "train.weight_decay", "model.builtin.pretrain_lr", "attack.fpc"} <= set(FLOATS)
    assert {"report.min_r_q", "report.min_indicator", "report.max_tpr_at_1pct_fpr", "report.alpha"} <= set(FLOATS)
    assert len(FLOATS) >= 14


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e400"])
@pytest.mark.parametrize("key", FLOATS)
def test_every_float_setting_refuses_inf_and_nan_at_load(key, value):
    with pytest.raises(RecipeError, match=key.replace(".", r"\.")):
        load_recipe("demo-cpu", [f"{key}={value}"])


@pytest.mark.parametrize("key", float_fields(SyntheticConfig))
def test_every_float_setting_of_the_synthetic_validation_refuses_inf(key):
    value = "[1.5, .inf]" if key == "sigmas" else ".inf"
    with pytest.raises(SyntheticConfigError, match=key):
        load_synthetic(None, [f"{key}={value}"])


@pytest.mark.parametrize("value", ["2", "0", "-0.5", "1.0000001", '"inf"', "true"])
def test_fpc_is_a_factor_in_0_1(value):
    with pytest.raises(RecipeError, match=r"attack\.fpc.*\(0, 1\]"):
        load_recipe("demo-cpu", [f"attack.fpc={value}"])


@pytest.mark.parametrize(
    ("value", "read"), [("1", 1.0), ("0.25", 0.25), ('"0.5"', 0.5), ("auto", "auto"), ("off", "off")]
)
def test_fpc_accepts_auto_off_and_a_factor(value, read):
    assert load_recipe("demo-cpu", [f"attack.fpc={value}"]).attack.fpc == read


VALID = {
    "model.builtin.pretrain_lr": 0.0123,
    "lora.alpha": 12.5,
    "lora.dropout": 0.125,
    "train.member_fraction": 0.375,
    "train.lr": 0.0015,
    "train.weight_decay": 0.01,
    "attack.fpc": 0.75,
    "report.max_tpr_at_1pct_fpr": 0.025,
    "report.min_r_q": 1.5,
    "report.max_utility_loss": 0.2,
    "report.utility_limit": 0.3,
    "report.min_indicator": -0.5,
    "report.alpha": 0.025,
    "report.equivalence_margin": 0.02,
}


def test_every_float_setting_recorded_in_a_store_reads_back_as_written(tmp_path):
    """The manifest records each value as written and the store's config reads it back (nothing becomes null)."""
    from llmaudit.store.run_store import RunStore

    assert sorted(VALID) == sorted(FLOATS)
    cfg = load_recipe("demo-cpu", [f"{k}={v}" for k, v in VALID.items()] + ["data.pool_size=8", "train.runs=2"])
    pool = [f"p{i}" for i in range(8)]
    data = {"pool_ids": pool, "val_ids": ["v0", "v1"], "fingerprint": "f"}
    membership = np.array([[1, 0] * 4, [0, 1] * 4], dtype=bool)
    store = RunStore(tmp_path / "exp")
    store.create(cfg, data, membership)
    recorded = json.loads(store.manifest_path.read_text())["config"]
    back = store.config()
    for key, value in VALID.items():
        section, name = key.rsplit(".", 1)
        node, obj = recorded, back
        for part in section.split("."):
            node, obj = node[part], getattr(obj, part)
        assert node[name] == value and getattr(obj, name) == value, key


# ------------------------------------------------------------------------------------------ nothing unpickled

WEIGHTLESS = {"AutoTokenizer", "PreTrainedTokenizerFast", "AutoConfig"}
"""Classes whose from_pretrained reads configurations and tokenizers (JSON, sentencepiece), never weights."""
CHECKED_ADAPTER = {("models/loading.py", "_merged_adapter")}
"""peft's loader takes no use_safetensors: the function refuses a directory without adapter_model.safetensors
first, and peft reads the safetensors file when it exists."""


def _from_pretrained_calls() -> list[tuple[str, str, ast.Call]]:
    calls = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(func):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                    calls.append((str(path.relative_to(SRC)), func.name, node))
    return calls


def test_every_from_pretrained_of_weights_loads_safetensors_only():
    """What `grep from_pretrained` finds: every call that loads weights passes use_safetensors=True (or reads a GGUF
    file), so a directory a store or `--quantized` names never reaches torch's unpickler."""
    calls = _from_pretrained_calls()
    assert len(calls) >= 6
    unsafe = []
    for where, function, call in calls:
        receiver = getattr(call.func.value, "id", None) or getattr(call.func.value, "attr", None)
        keywords = {k.arg: k.value for k in call.keywords}
        safetensors = isinstance(keywords.get("use_safetensors"), ast.Constant) and keywords["use_safetensors"].value
        if receiver in WEIGHTLESS or (where, function) in CHECKED_ADAPTER:
            continue
        if safetensors is not True and "gguf_file" not in keywords:
            unsafe.append(f"{where}:{call.lineno} {receiver}.from_pretrained in {function}")
    assert unsafe == []


def _opened(paths: list[Path]):
    """A context recording every open of a file in `paths` (the proof that it was or was not read)."""
    seen: list[str] = []
    watched = {str(p.resolve()) for p in paths}

    def hook(event, args):
        opens = event == "open" and args and isinstance(args[0], (str, os.PathLike))
        if opens and os.path.abspath(os.fspath(args[0])) in watched:
            seen.append(os.fspath(args[0]))

    sys.addaudithook(hook)  # hooks cannot be removed: it only records the files of this test
    return seen


def _given_directory(root: Path, *, safetensors: bool) -> GivenFile:
    """A quantized model directory as `--quantized` records it, beside a pickled copy of its weights."""
    model = tiny_causal_lm()
    model.save_pretrained(root)
    torch.save(model.state_dict(), root / "pytorch_model.bin")  # what from_pretrained would unpickle
    if not safetensors:
        (root / "model.safetensors").unlink()
    files = {p.name: file_digest(p) for p in root.iterdir() if p.suffix in (".json", ".safetensors")}
    return GivenFile(0, 3, "gptq-4", str(root), "checkpoint", files)


@pytest.mark.parametrize("safetensors", [False, True])
def test_a_pickle_in_a_given_directory_is_never_opened(tmp_path, safetensors):
    """A recorded directory that holds pytorch_model.bin (alone, or beside the safetensors weights) is refused before
    any loader runs; the pickle is never opened."""
    given = _given_directory(tmp_path / "given", safetensors=safetensors)
    opened = _opened([tmp_path / "given" / "pytorch_model.bin"])
    with pytest.raises(QuantizationError, match="pytorch_model.bin"):
        load_given(given, tiny_causal_lm(), torch.device("cpu"))
    assert opened == []


def test_a_given_record_whose_file_names_are_paths_is_refused_unread(tmp_path):
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.json"
    secret.write_text("{}")
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / "config.json").write_text("{}")
    opened = _opened([secret])
    for names in ({"../outside/secret.json": "0" * 64}, {str(secret): "0" * 64}):
        given = GivenFile(0, 3, "gptq-4", str(tmp_path / "given"), "checkpoint", names)
        with pytest.raises(QuantizationError, match="not file names"):
            check_digests(given)
    assert opened == []


@pytest.mark.parametrize("config", ["{not json", "[1, 2]", '"quantization_config"'])
def test_a_quantized_directory_whose_config_is_not_an_object_is_refused(tmp_path, config):
    (tmp_path / "config.json").write_text(config)
    (tmp_path / "model.safetensors").write_bytes(b"x")
    with pytest.raises(QuantizationError, match=f"{tmp_path / 'config.json'}"):
        describe(0, 3, "gptq-4", tmp_path)


# ------------------------------------------------------------------------------------------ GGUF headers


def _gguf(path: Path) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_string("general.name", "a tiny model of a user")
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _cut_inside_a_key(path: Path) -> None:
    blob = path.read_bytes()
    path.write_bytes(blob[: blob.index(b"general.name") + 5])


def _data_past_the_end(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    at = blob.index(b"output_norm.weight") + len(b"output_norm.weight") + 4 + 8 + 4  # n_dims, dims[1], type
    blob[at : at + 8] = struct.pack("<Q", 2**40)
    path.write_bytes(bytes(blob))


def _lfs_pointer(path: Path) -> None:
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 123456789\n")


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (_cut_inside_a_key, "not a readable GGUF file"),
        (_data_past_the_end, "not a readable GGUF file"),
        (_lfs_pointer, "Git LFS pointer"),
        (lambda p: p.write_bytes(b"PK\x03\x04 a zip"), "not a GGUF file"),
    ],
    ids=["a header that ends inside a key", "tensor data 2^40 bytes past the end", "a Git LFS pointer", "a zip"],
)
def test_a_gguf_that_does_not_parse_is_refused_naming_the_file(tmp_path, damage, fragment):
    path = _gguf(tmp_path / "user.gguf")
    damage(path)
    model = tiny_causal_lm(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    with pytest.raises(QuantizationError, match=fragment) as caught:
        load_gguf(path, model, "gguf-q8_0")
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_git_lfs_pointer_is_refused_before_the_import_loads_anything(tmp_path):
    from llmaudit.ingest.checkpoints import ImportInputError
    from llmaudit.ingest.quantized import parse_quantized

    path = tmp_path / "model.Q4_K_M.gguf"
    _lfs_pointer(path)
    with pytest.raises(ImportInputError, match="Git LFS pointer.*git lfs pull"):
        parse_quantized([f"gguf-q4_k_m={path}"], 1)


# ------------------------------------------------------------------------------------------ the terminal


def test_control_characters_are_shown_escaped():
    from llmaudit.common.safe_text import escape_controls

    shown = escape_controls(HOSTILE)
    assert CONTROL_KEEP_LINES.search(shown) is None
    assert shown == (
        "a\\x1b]0;TITLE\\x07b\\x1b]8;;http://e.vil\\x07link\\x1b]8;;\\x07c\\x1b[2K\\x1b[1Ad\\rall units verified"
        "\\x9b1A\\u202e"
    )
    assert escape_controls("two\nlines\t", keep_newlines=True) == "two\nlines\\t"
    assert escape_controls("a\nb") == "a\\nb"


SGR = re.compile(r"\x1b\[[0-9;]*m")


def test_the_console_escapes_data_and_keeps_its_own_styles(monkeypatch):
    from llmaudit.common.safe_text import safe_console

    monkeypatch.setenv("FORCE_COLOR", "1")  # a terminal: rich emits its own styles
    buffer = io.StringIO()
    safe_console(buffer, width=100).print(Text(HOSTILE, style="bold red"))
    out = buffer.getvalue()
    assert SGR.search(out)  # rich's style
    assert CONTROL_KEEP_LINES.search(SGR.sub("", out)) is None and "\\x1b]0;TITLE" in out


def test_the_verdict_screen_shows_hostile_report_text_escaped(received_report, monkeypatch):
    from llmaudit.report.terminal import print_summary

    report = json.loads(received_report.read_text())
    report["provenance"]["experiment_name"] = HOSTILE
    report["recommendation"]["explanation"] = HOSTILE
    for forced in ("1", None):
        if forced:
            monkeypatch.setenv("FORCE_COLOR", forced)
        else:
            monkeypatch.delenv("FORCE_COLOR", raising=False)
        buffer = io.StringIO()
        print_summary(report, file=buffer, width=100)
        out = buffer.getvalue()
        assert "\\x1b]0;TITLE" in out and "\\x1b]8;;http://e.vil" in out
        assert CONTROL_KEEP_LINES.search(SGR.sub("", out)) is None, repr(out)


def test_stdout_escapes_every_control_but_line_breaks_and_colours():
    from llmaudit.common.safe_text import SafeStream

    raw = io.StringIO()
    stream = SafeStream(raw)
    stream.write(f"\x1b[1mbold\x1b[0m {HOSTILE}\n")
    assert raw.getvalue().startswith("\x1b[1mbold\x1b[0m a\\x1b]0;TITLE") and raw.getvalue().endswith("\n")
    assert CONTROL_KEEP_LINES.search(raw.getvalue().replace("\x1b[1m", "").replace("\x1b[0m", "")) is None


def test_an_error_line_and_a_log_line_show_data_escaped(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError(f"a file named {HOSTILE}")

    monkeypatch.setattr("llmaudit.quantize.list_quantizers", broken)  # the command imports it when it runs
    code, out, err = run_cli(["quantizers"])
    assert code == 1 and "\\x1b]8;;http://e.vil" in err and "\x1b" not in err and "\r" not in err
    from llmaudit.commands.base import CurrentStderrHandler

    handler = CurrentStderrHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("llmaudit", logging.WARNING, __file__, 1, HOSTILE, None, None)
    with contextlib.redirect_stderr(io.StringIO()) as captured:
        handler.emit(record)
    assert "\x1b" not in captured.getvalue() and "\\x1b]0;TITLE" in captured.getvalue()


@pytest.fixture
def received_report(audited_tiny_store):
    return audited_tiny_store / "report" / "report.json"
