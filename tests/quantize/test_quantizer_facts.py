"""Every quantizer class states its facts; one that lacks a fact is refused when it is defined or registered."""

import pytest

import llmaudit.quantize as quantize
from llmaudit.quantize import QUANTIZER_NAMES, quantizer_class, register_quantizer, tracked_libraries
from llmaudit.quantize.base import FACTS, Quantizer
from llmaudit.store.manifest import BASE_LIBRARIES, library_versions

COMPLETE = {
    "family": "toy",
    "install_hint": None,
    "tracked_libraries": (),
    "gpu_seconds_per_layer": 0.1,
    "shares_calibration": None,
}


def define(**facts):
    return type("ToyQuantizer", (Quantizer,), facts)


def test_a_class_with_every_fact_is_accepted():
    assert define(**COMPLETE).gpu_seconds_per_layer == 0.1


@pytest.mark.parametrize("fact", FACTS)
def test_a_missing_fact_is_refused_at_class_definition(fact):
    facts = {k: v for k, v in COMPLETE.items() if k != fact}
    with pytest.raises(TypeError, match=f"ToyQuantizer: {fact} is missing"):
        define(**facts)


@pytest.mark.parametrize(
    "fact, value",
    [
        ("family", ""),
        ("install_hint", ""),
        ("tracked_libraries", "hqq"),  # a string, not a tuple of names
        ("gpu_seconds_per_layer", -1.0),
        ("gpu_seconds_per_layer", float("nan")),
        ("gpu_seconds_per_layer", None),
        ("shares_calibration", 3),
    ],
)
def test_a_malformed_fact_is_refused_at_class_definition(fact, value):
    with pytest.raises(TypeError, match=f"ToyQuantizer: {fact} has the wrong type or value"):
        define(**{**COMPLETE, fact: value})


def test_a_library_without_an_install_hint_is_refused():
    with pytest.raises(TypeError, match="install_hint is None, but the class names a library"):
        define(**COMPLETE, library="toylib")
    assert define(**{**COMPLETE, "install_hint": "pip install toylib"}, library="toylib").library == "toylib"


def test_sharing_calibration_needs_the_methods_that_share_it():
    with pytest.raises(TypeError, match="shares_calibration names a group, but the class does not override"):
        define(**{**COMPLETE, "shares_calibration": "toy"})


def test_registration_refuses_a_taken_unsafe_or_reserved_name_and_a_non_quantizer(monkeypatch):
    monkeypatch.setattr(quantize, "_REGISTRY", dict(quantize._REGISTRY))
    toy = define(**COMPLETE)
    for names, message in ((["hqq-4"], "already HQQQuantizer"), (["../x"], "cannot name"), (["full"], "cannot name")):
        with pytest.raises(ValueError, match=message):
            register_quantizer(toy, names)
    with pytest.raises(ValueError, match="no name"):
        register_quantizer(toy, [])
    with pytest.raises(TypeError, match="not a subclass"):
        register_quantizer(object, ["toy-1"])
    assert "toy-1" not in QUANTIZER_NAMES  # nothing half-registered
    register_quantizer(toy, ["toy-1"])
    assert "toy-1" in QUANTIZER_NAMES and QUANTIZER_NAMES[-1] == "toy-1" and quantizer_class("toy-1") is toy


def test_the_shipped_facts_reach_their_consumers():
    assert quantizer_class("gptq-4").shares_calibration == "gptq"
    assert [n for n in QUANTIZER_NAMES if quantizer_class(n).shares_calibration] == [
        n for n in QUANTIZER_NAMES if n.startswith("gptq")
    ]
    assert {quantizer_class(n).gpu_seconds_per_layer for n in ("fp32", "bf16", "fp16")} == {0.0}
    assert quantizer_class("awq-4").install_hint == "pip install 'llmaudit[gptq]'"
    assert set(tracked_libraries()) == {"bitsandbytes", "gptqmodel", "optimum", "hqq", "gguf", "llama-cpp-python"}
    versions = library_versions()
    assert list(versions) == ["python", "llmaudit", *BASE_LIBRARIES, *tracked_libraries()]
