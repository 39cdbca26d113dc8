"""What a release audit is asked for, refused or shown before any work: a grid without a full-precision reference
is refused at import, at recipe load and at score time (exit 2, naming the fix); `--release` with a near miss says
which name was meant; `llmaudit quantizers` is one readable table with one install hint per backend; a quantizer
the recipe asks for only where its library is installed is either audited or said to be left out, and why."""

from __future__ import annotations

import copy
import re

import pytest

from llmaudit.config import RecipeError, load_recipe
from llmaudit.planning.targets import check_quantizer_requests, config_from_recipe, with_available
from llmaudit.quantize import QUANTIZER_NAMES, gguf_backend, llama_cpp_lib
from llmaudit.report.answer import left_out
from llmaudit.report.gate import gate_summary
from llmaudit.report.model_card import render_model_card
from llmaudit.report.models import as_report
from llmaudit.report.terminal import summary_text
from tests.conftest import run_cli
from tests.ingest.test_import import import_args, lora_run, model_cfg, records, refused
from tests.report.test_model_card import audited

__all__ = ["audited", "lora_run", "model_cfg", "records"]

NOT_INSTALLED = (
    "the Python package 'llama_cpp' (llama-cpp-python) is not installed; fix: pip install 'llmaudit[llamacpp]'"
)


@pytest.fixture
def no_llama_cpp(monkeypatch):
    """llama.cpp's library as if it were not installed here, whatever this machine has."""
    monkeypatch.setattr(llama_cpp_lib, "availability", lambda: NOT_INSTALLED)
    assert gguf_backend.llama_cpp_lib.availability() == NOT_INSTALLED


# ------------------------------------------------------------------------------------------ no reference


def test_an_import_without_full_precision_is_refused_before_the_store_is_written(tmp_path, lora_run):
    out = tmp_path / "audit"
    args = import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], out)
    args[args.index("score.quantizers=[fp32,uniform-4]")] = "score.quantizers=[bnb-nf4,hqq-4]"
    code, _, err = run_cli(args)
    refused(code, err, "no full-precision reference", "score.quantizers=[full,bnb-nf4,hqq-4]")
    assert not out.exists()


def test_a_recipe_or_a_store_without_full_precision_is_refused_before_any_work(tmp_path):
    with pytest.raises(RecipeError, match=re.escape("'score.quantizers=[full,bnb-nf4,hqq-4]'")):
        config_from_recipe("demo-cpu", ["score.quantizers=[bnb-nf4,hqq-4]", "score.if_available=[]"], tmp_path / "x")
    no_gguf = ["score.quantizers=[bnb-nf4,hqq-4]", "score.if_available=[]"]
    code, _, err = run_cli(["finetune", "demo-cpu", *no_gguf, "--out", tmp_path / "y"])
    assert code == 2 and err.count("\n") == 1 and "add `full`" in err and not (tmp_path / "y").exists()
    # `score RUN_DIR` adding quantizers to a store: its scored reference counts, a store without one is refused
    cfg = load_recipe("demo-cpu", ["score.quantizers=[uniform-3]", "score.if_available=[]"])
    check_quantizer_requests(cfg, [], scored=["fp32", "hqq-4"])
    with pytest.raises(RecipeError, match="no full-precision reference"):
        check_quantizer_requests(cfg, [], scored=["bnb-nf4", "hqq-4"])


# ------------------------------------------------------------------------------------------ --release


def test_a_release_name_near_a_quantizer_says_which_was_meant(audited):
    code, _, err = run_cli(["report", audited["root"], "--release", "uniform5"])
    assert code == 2 and err.count("\n") == 1 and "(did you mean 'uniform-5'?)" in err
    code, _, err = run_cli(["report", audited["root"], "--release", "uniform5", "--gate"])
    assert code == 2 and "did you mean 'uniform-5'" in err


# ------------------------------------------------------------------------------------------ llmaudit quantizers


def test_the_quantizers_table_is_readable_with_one_install_hint_per_backend(no_llama_cpp):
    code, out, _ = run_cli(["quantizers"])
    lines = out.rstrip("\n").splitlines()
    assert code == 0 and max(len(x) for x in lines) <= 120 and len(lines) < 30
    table = "\n".join(lines[1:])  # below the header
    shown = set(re.findall(r"([\w.-]+?)(?:\[-imatrix\])? \(", table))
    shown |= {f"{n}-imatrix" for n in re.findall(r"([\w.-]+)\[-imatrix\]", table)}
    assert shown == set(QUANTIZER_NAMES)  # every quantizer, the -imatrix twins folded into their base name
    assert out.count("'llmaudit[llamacpp]'") == 1 and out.count("why:") == 1
    gguf = next(x for x in lines if x.startswith("gguf "))
    assert re.match(r"gguf\s+no\s", gguf) and re.match(r"full\s+yes\s+fp32 \(32\)", lines[1])


# ------------------------------------------------------------------------------------------ score.if_available


def test_a_quantizer_asked_for_where_available_joins_or_is_left_out_with_why(tmp_path, no_llama_cpp, monkeypatch):
    cfg = config_from_recipe("demo-cpu", [], tmp_path / "demo")
    assert cfg.score.if_available == ["gguf-q4_k_m"] and "gguf-q4_k_m" not in cfg.score.quantizers
    _, left = with_available(cfg)
    assert left == {"gguf-q4_k_m": f"gguf-q4_k_m: {NOT_INSTALLED}"}
    monkeypatch.setattr(llama_cpp_lib, "availability", lambda: None)
    monkeypatch.setattr(gguf_backend.base, "library_available", lambda name: True)
    added, left = with_available(cfg)
    assert added.score.quantizers[-1] == "gguf-q4_k_m" and left == {}
    with pytest.raises(RecipeError, match=r"score.if_available: unknown quantizer 'gguf-q4km' \(did you mean"):
        config_from_recipe("demo-cpu", ["score.if_available=[gguf-q4km]"], tmp_path / "demo")


def test_a_quantizer_left_out_is_in_every_answer_never_skipped_silently(audited):
    report = copy.deepcopy(audited["report"])
    why = f"gguf-q4_k_m: {NOT_INSTALLED}"
    report["provenance"]["left_out_quantizers"] = {"gguf-q4_k_m": why}
    typed = as_report(report)
    assert left_out(typed) == [("gguf-q4_k_m", f"left out on the machine that scored it: {why}")]
    screen = " ".join(summary_text(typed).split())
    assert "gguf-q4_k_m NOT AUDITED left out on the machine that scored it: gguf-q4_k_m: the Python package" in screen
    assert gate_summary(typed, None).left_out == {"gguf-q4_k_m": f"left out on the machine that scored it: {why}"}
    assert "  - `gguf-q4_k_m`: not audited (left out on the machine that scored it" in render_model_card(typed)
