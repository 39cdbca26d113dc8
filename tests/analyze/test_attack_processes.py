"""`report.processes`: the quantizers attacked in worker processes give the numbers of one process, the workers
inherit the table by fork instead of receiving it pickled, and a failure in a worker reaches the caller as itself."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from llmaudit.analyze.attacks import evaluate, workers
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings

pytestmark = pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(), reason="worker processes need the fork start method"
)


def _json(result: dict) -> str:
    return json.dumps(result, sort_keys=True, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))


def test_worker_processes_give_the_numbers_of_one_process():
    df = synthetic_loss_table(4, 80, 3, seed=2)
    s, decision = AttackRunSettings(n_boot=20, seed=3), DecisionSettings(seed=3, resamples=50)
    one = run_attacks(df, s, decision=decision)
    two = run_attacks(df, s, decision=decision, processes=2)
    assert list(two["quantizers"]) == list(one["quantizers"]) == ["fp32", "q1", "q2"]
    assert _json(two) == _json(one)


class _NeverPickled:
    """A value that refuses to be pickled (a deep copy is itself): a table holding it reaches the workers only by
    fork."""

    def __reduce__(self):
        raise AssertionError("the table was pickled for a worker")

    def __deepcopy__(self, memo):
        return self


def test_the_workers_inherit_the_table_by_fork_without_pickling_it():
    df = synthetic_loss_table(3, 40, 3, seed=1)
    df.attrs["guard"] = _NeverPickled()
    with pytest.raises(AssertionError, match="pickled"):  # the guard works: pickling the table fails
        pickle.dumps(df)
    two = run_attacks(df, AttackRunSettings(n_boot=0, attacks=("loss", "min_k")), processes=2)
    assert list(two["quantizers"]) == ["fp32", "q1", "q2"]
    assert workers._ForkedWorker.job is None  # the parent keeps no job: only the workers' initializer sets it


def test_a_failure_in_a_worker_is_raised_as_itself(monkeypatch):
    def broken(df, quantizer, *args):
        if quantizer == "q1":
            raise ValueError(f"quantizer {quantizer!r}: planted")
        return real(df, quantizer, *args)

    real = evaluate.attack_quantizer
    monkeypatch.setattr(evaluate, "attack_quantizer", broken)
    with pytest.raises(ValueError, match="quantizer 'q1': planted"):
        run_attacks(synthetic_loss_table(3, 40, 3, seed=1), AttackRunSettings(n_boot=0), processes=2)


def _pid_and_kind(value) -> tuple[int, str]:
    return os.getpid(), type(value).__name__


def test_a_block_computed_beside_runs_in_a_forked_process_and_returns_its_result():
    """`forked_beside`: the call reads an unpicklable input (inherited by fork, never pickled), runs in another
    process while the block runs here, and its result comes back; with one process it runs here instead."""
    with workers.forked_beside(functools.partial(_pid_and_kind, _NeverPickled()), processes=2) as result:
        pid, kind = result()
    assert pid != os.getpid() and kind == "_NeverPickled"
    assert workers._ForkedCall.call is None  # only the forked process's initializer sets it
    with workers.forked_beside(functools.partial(_pid_and_kind, 7), processes=1) as result:
        assert result() == (os.getpid(), "int")


def _fails() -> None:
    raise ValueError("the side block failed")


def test_a_failure_beside_is_raised_as_itself():
    with pytest.raises(ValueError, match="the side block failed"), workers.forked_beside(_fails, processes=2) as result:
        result()
