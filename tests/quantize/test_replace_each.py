"""replace_each: every target replaced in order, each original released as soon as its replacement is in place."""

from __future__ import annotations

import gc
import weakref

from torch import nn

from llmaudit.quantize.base import replace_each, target_modules


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
