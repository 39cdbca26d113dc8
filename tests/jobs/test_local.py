"""train.processes and score.processes: several local processes share one store's runs or units."""

import sys
import time

import pytest

from llmaudit.finetune.runs import finetune
from llmaudit.jobs.local import _run_children, finetune_stage, score_in_processes
from llmaudit.planning.status import stage_status
from llmaudit.store.units import plan_units
from llmaudit.store.worklog import read_work


def test_two_local_processes_score_every_unit_once(tiny_cfg):
    cfg = tiny_cfg.model_copy(update={"score": tiny_cfg.score.model_copy(update={"processes": 2})})
    store = finetune(cfg, progress=False, echo=lambda *a: None)
    lines = []
    result = score_in_processes(cfg, store, echo=lines.append)
    assert result["processes"] == 2 and "2 scoring processes" in lines[0]
    done = [(w["run"], w["step"], w["quantizer"]) for w in read_work(store.worklog_path)]
    assert sorted(done) == sorted((u.run, u.step, u.quantizer) for u in plan_units(cfg, store))
    # the store keeps the user's setting, not the children's
    assert store.manifest()["config"]["score"]["processes"] == 2
    status = stage_status(store)
    assert not status["score"]["missing"] and not status["score"]["invalid"]


def _adapters(store, runs):
    """Every checkpoint's adapter bytes, by (run, step)."""
    return {
        (run, step): (store.checkpoint_dir(run, step) / "adapter_model.safetensors").read_bytes()
        for run in range(runs)
        for step in store.checkpoints(run)
    }


def test_two_training_processes_leave_the_checkpoints_of_one_bit_for_bit(tmp_path, capsys):
    """train.processes=2: `finetune` starts two children, each trains its share of the runs whole; every checkpoint
    is byte for byte the one the same runs trained in one process give (the built-in model trains on one thread)."""
    from llmaudit.common.runtime import torch_threads
    from llmaudit.config import load_recipe
    from llmaudit.store.run_store import RunStore
    from tests.conftest import TINY_OVERRIDES

    overrides = [*TINY_OVERRIDES, "train.processes=2"]
    cfg = load_recipe("demo-cpu", [*overrides, f"output_dir={tmp_path / 'two'}"])
    two = finetune_stage(cfg, "demo-cpu", overrides, shard=None, show_progress=False)
    assert "[finetune] 2 processes with 1 thread(s) each train the runs of" in capsys.readouterr().out
    assert all(two.run_done(r) for r in range(cfg.train.runs))
    one_cfg = load_recipe("demo-cpu", [*TINY_OVERRIDES, f"output_dir={tmp_path / 'one'}"])
    with torch_threads(1):
        one = finetune(one_cfg, progress=False, echo=lambda *a: None)
    assert cfg.identity_hash() == one_cfg.identity_hash()  # the processes are the runner's, not the experiment's
    expected = _adapters(one, cfg.train.runs)
    assert len(expected) == cfg.train.runs * cfg.train.epochs
    assert _adapters(RunStore(two.root), cfg.train.runs) == expected


def test_a_failed_build_stops_the_started_children(tmp_path):
    """What the parent does while its children start (the base model's build) fails: the children are stopped
    and the build's own error is raised, not a report about the children."""
    started = tmp_path / "started"
    sleeper = [sys.executable, "-c", f"open({str(started)!r}, 'a').write('x'); import time; time.sleep(60)"]

    def build() -> None:
        deadline = time.time() + 30
        while (not started.exists() or len(started.read_text()) < 2) and time.time() < deadline:
            time.sleep(0.05)
        raise OSError("the build failed")

    t0 = time.time()
    with pytest.raises(OSError, match="the build failed"):
        _run_children([sleeper, sleeper], None, "fine-tuning", "finished runs are kept", meanwhile=build)
    assert started.read_text() == "xx" and time.time() - t0 < 30  # both ran, and neither was waited out
