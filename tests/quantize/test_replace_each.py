"""replace_each: every target replaced in order, each original released as soon as its replacement is in place."""

from __future__ import annotations

import gc
import weakref

import pytest
from torch import nn

from llmaudit.quantize import get_quantizer
from llmaudit.quantize.layers import replace_each, target_modules


def test_each_original_layer_is_released_before_the_next_is_made():
    model = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(3)))
    targets = target_modules(model, [r"\d+\.0$"])
    refs = [weakref.ref(m) for _, m in targets]
    seen = []

    def make(name, module):
        gc.collect()
        seen.append((name, [r() is None for r in refs]))
        return nn.Linear(4, 4, bias=False)

    replace_each(model, targets, make)
    assert targets == []
    assert [name for name, _ in seen] == ["0.0", "1.0", "2.0"]
    assert [dead for _, dead in seen] == [[False] * 3, [True, False, False], [True, True, False]]
    assert all(model[i][0].bias is None for i in range(3))


@pytest.mark.parametrize(
    "name, options",
    [
        ("bnb-int8", {}),
        ("bnb-nf4", {}),
        ("bnb-nf4", {"mode": "real"}),
        ("hqq-4", {}),
        ("hqq-4", {"mode": "real"}),
    ],
)
def test_every_quantizer_releases_each_layer_as_it_replaces_it(name, options, fresh_model, monkeypatch):
    """Each backend replaces its layers through replace_each: when the k-th replacement is put in place, the k
    originals before it are already gone (a loop over the target list would keep them all alive to the end)."""
    from llmaudit.quantize import layers as quantize_layers

    # bitsandbytes logs a one-time warning with its exception's traceback on its first CPU layer; pytest's log capture
    # keeps that record and with it the frame holding the first layer. Quantize once before counting.
    get_quantizer(name, device="cpu", **options).quantize_model(fresh_model("qwen2"))
    model = fresh_model("qwen2")
    refs = [weakref.ref(m) for _, m in target_modules(model, get_quantizer(name).options["modules"])]
    dead_at_each_call = []
    replace = quantize_layers.replace_module

    def spy(model, module_name, new):
        gc.collect()
        dead_at_each_call.append(sum(r() is None for r in refs))
        replace(model, module_name, new)

    monkeypatch.setattr(quantize_layers, "replace_module", spy)  # what replace_each calls
    get_quantizer(name, device="cpu", **options).quantize_model(model)
    assert dead_at_each_call == list(range(len(refs)))
