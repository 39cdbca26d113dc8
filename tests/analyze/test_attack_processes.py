"""`report.processes`: the quantizers attacked in worker processes give the numbers of one process, and a failure in
a worker reaches the caller as itself."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest

from llmaudit.analyze.attacks import evaluate
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="worker processes need the fork start method"
)


def _json(result: dict) -> str:
    return json.dumps(result, sort_keys=True, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))


def test_worker_processes_give_the_numbers_of_one_process():
    df = synthetic_loss_table(4, 80, 3, seed=2)
    kw = dict(n_boot=20, seed=3, decision=DecisionSettings(seed=3, resamples=50))
    one = run_attacks(df, **kw)
    two = run_attacks(df, processes=2, **kw)
    assert list(two["quantizers"]) == list(one["quantizers"]) == ["fp32", "q1", "q2"]
    assert _json(two) == _json(one)


def test_a_failure_in_a_worker_is_raised_as_itself(monkeypatch):
    def broken(df, quantizer, *args):
        if quantizer == "q1":
            raise ValueError(f"quantizer {quantizer!r}: planted")
        return real(df, quantizer, *args)

    real = evaluate.attack_quantizer
    monkeypatch.setattr(evaluate, "attack_quantizer", broken)
    with pytest.raises(ValueError, match="quantizer 'q1': planted"):
        run_attacks(synthetic_loss_table(3, 40, 3, seed=1), n_boot=0, processes=2)
    assert evaluate._FORKED is None  # nothing of the table kept after the workers
