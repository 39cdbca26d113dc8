"""Which engine scores which quantizer: `score.engine` (validated), set on every GGUF quantizer and on no other, a
quantizer's own option over it, and a store's record without the option read as torch (what made its units)."""

from __future__ import annotations

import os

import pytest
import torch

from llmaudit.common.errors import UserError
from llmaudit.config import load_recipe
from llmaudit.quantize import QuantizationError, get_quantizer, llama_cpp_lib
from llmaudit.score.llama_cpp_engine import ENGINE_METADATA_KEY, engine_metadata, engine_of


def test_score_engine_is_validated_in_one_line():
    assert load_recipe("demo-cpu").score.engine == "torch"
    assert load_recipe("demo-cpu", ["score.engine=llama.cpp"]).score.engine == "llama.cpp"
    with pytest.raises(UserError, match="score.engine.*'torch' or 'llama.cpp'"):
        load_recipe("demo-cpu", ["score.engine=vulkan"])


def test_only_gguf_quantizers_have_an_engine_and_an_unknown_one_is_refused():
    assert engine_of(get_quantizer("gguf-q8_0", engine="llama.cpp")) == "llama.cpp"
    assert engine_of(get_quantizer("gguf-q8_0")) == "torch"
    assert engine_of(get_quantizer("hqq-4")) == "torch"
    assert engine_metadata(get_quantizer("gguf-q4_k_m", engine="llama.cpp")) == {ENGINE_METADATA_KEY: b"llama.cpp"}
    with pytest.raises(QuantizationError, match="engine"):
        get_quantizer("gguf-q8_0", engine="vulkan")
    with pytest.raises(QuantizationError, match="engine"):
        get_quantizer("hqq-4", engine="llama.cpp")


def test_a_record_without_the_engine_was_scored_by_torch():
    recorded = {"device": "cpu"}  # a gguf quantizer's options as a store recorded them before the option existed
    assert get_quantizer("gguf-q8_0", engine="torch").recorded_options_mismatch(recorded) is None
    why = get_quantizer("gguf-q8_0", engine="llama.cpp").recorded_options_mismatch(recorded)
    assert why is not None and "engine='torch'" in why and "engine='llama.cpp'" in why


def test_the_recipes_engine_goes_to_every_gguf_quantizer_unless_its_own_option_says():
    missing = llama_cpp_lib.availability()  # the GGUF quantizers need llama-cpp-python; CI requires it
    if missing:
        assert os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") != "1", missing
        pytest.skip(missing)
    from llmaudit.score.stage import check_quantizers

    cfg = load_recipe("demo-cpu", ["score.quantizers=[fp32,gguf-q8_0,gguf-q4_k_m]", "score.engine=llama.cpp",
                                   "score.quantizer_options={gguf-q8_0: {engine: torch}}"])  # fmt: skip
    quantizers = check_quantizers(cfg, torch.device("cpu"))
    assert {name: engine_of(q) for name, q in quantizers.items()} == {
        "fp32": "torch", "gguf-q8_0": "torch", "gguf-q4_k_m": "llama.cpp"
    }  # fmt: skip
    assert "engine" not in quantizers["fp32"].options
