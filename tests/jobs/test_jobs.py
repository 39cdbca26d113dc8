"""Batch jobs: sharding covers every unit once, a killed job resumes to the uninterrupted result bit for bit,
`llmaudit submit` runs the demo through submitit's local executor, and the SLURM job it would submit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from llmaudit.common.io import atomic_write_json
from llmaudit.config import load_recipe
from llmaudit.finetune.checkpoints import load_trainer_state
from llmaudit.finetune.runs import finetune
from llmaudit.jobs.submit import slurm_parameters, submit
from llmaudit.planning.status import stage_status
from llmaudit.score.stage import score
from llmaudit.store.markers import clear_stale_markers, marker_state, run_marker_path, running_marker
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import shard_items
from llmaudit.store.units import plan_units
from tests.conftest import TINY_OVERRIDES

# The shared tiny experiment, with batch 2 so that a run has several steps between its checkpoints.
OVERRIDES = TINY_OVERRIDES + [
    "train.epochs=3",
    "train.batch_size=2",
    "score.quantizers=[fp32,uniform-4]",
    "attack.n_boot=10",
]


def small_cfg(out: Path, *extra: str):
    return load_recipe("demo-cpu", OVERRIDES + [f"output_dir={out}", *extra])


@pytest.fixture
def one_thread():
    """CPU results are bitwise reproducible only at a fixed thread count (the subprocesses use 1 too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> RunStore:
    """The uninterrupted experiment, in this process, one thread."""
    out = tmp_path_factory.mktemp("reference")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = small_cfg(out)
        store = finetune(cfg, progress=False, echo=lambda *_: None)
        score(cfg, store, progress=False, echo=lambda *_: None)
    finally:
        torch.set_num_threads(before)
    return store


# ------------------------------------------------------------------------------------------ helpers


def assert_same_runs(a: RunStore, b: RunStore, runs: int) -> None:
    from safetensors.torch import load_file

    for run in range(runs):
        assert b.run_done(run)
        assert a.checkpoints(run) == b.checkpoints(run) != []
        for step in a.checkpoints(run):
            ta = load_file(str(a.checkpoint_dir(run, step) / "adapter_model.safetensors"))
            tb = load_file(str(b.checkpoint_dir(run, step) / "adapter_model.safetensors"))
            assert ta.keys() == tb.keys()
            for key in ta:
                assert torch.equal(ta[key], tb[key]), f"run {run} step {step} {key} differs"
            ja = json.loads((a.checkpoint_dir(run, step) / "checkpoint.json").read_text())
            jb = json.loads((b.checkpoint_dir(run, step) / "checkpoint.json").read_text())
            # adapter_config.json's bytes depend on the process that saved it (peft writes target_modules from a
            # set, and the base model's path): its recorded digest is the checkpoint's own, the weights' are equal
            fa, fb = ja.pop("files"), jb.pop("files")
            assert fa.keys() == fb.keys() and fa["adapter_model.safetensors"] == fb["adapter_model.safetensors"]
            assert ja == jb
        last = a.checkpoints(run)[-1]
        sa = load_trainer_state(a.checkpoint_dir(run, last), torch.device("cpu"))
        sb = load_trainer_state(b.checkpoint_dir(run, last), torch.device("cpu"))
        assert torch.equal(sa["torch_rng"], sb["torch_rng"])
        for pid, state in sa["optimizer"]["state"].items():
            for name, value in state.items():
                assert torch.equal(value, sb["optimizer"]["state"][pid][name]), f"run {run} optimizer {name}"


def loss_tables(store: RunStore) -> dict[str, pd.DataFrame]:
    return {str(p.relative_to(store.root)): pd.read_parquet(p) for p in sorted(store.scores_dir.rglob("*.parquet"))}


def assert_same_scores(a: RunStore, b: RunStore) -> None:
    ta, tb = loss_tables(a), loss_tables(b)
    assert ta.keys() == tb.keys() and len(ta) > 0
    for name, da in ta.items():
        db = tb[name]
        assert list(da.columns) == list(db.columns), name
        for col in da.columns:
            for x, y in zip(da[col], db[col]):
                assert _same_cell(x, y), f"{name}: {col} differs"


def _same_cell(x, y) -> bool:
    """Equal values, arrays element for element, and a missing value (None / NaN, e.g. the answer column of a
    record that was not generated) equal to a missing value."""
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype.kind == "f" and y.dtype.kind == "f":
        return bool(np.array_equal(x, y, equal_nan=True))
    return bool(np.array_equal(x, y))


def cli_process(*args: str) -> subprocess.Popen:
    env = dict(os.environ, LLMAUDIT_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "llmaudit.cli", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def kill_when(proc: subprocess.Popen, condition, timeout: float = 240.0) -> None:
    """SIGKILL `proc` as soon as `condition()` holds (polled every few ms)."""
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(
                f"process ended (rc {proc.returncode}) before the kill point: {proc.stderr.read().decode()[-2000:]}"
            )
        if time.time() > deadline:
            proc.kill()
            pytest.fail("the kill point never came")
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()


def file_stamps(paths) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


# ------------------------------------------------------------------------------------------ sharding


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_shards_cover_every_run_and_unit_exactly_once(tmp_path, n):
    cfg = small_cfg(tmp_path, "train.runs=7", "score.quantizers=[fp32,uniform-4,hqq-4]")
    store = RunStore(tmp_path)
    # A store with finished runs of different lengths, written by hand: planning reads only the layout.
    for run in range(7):
        for step in range(1, 2 + run % 3):
            atomic_write_json(store.checkpoint_dir(run, step) / "checkpoint.json", {"step": step})
        atomic_write_json(store.run_done_path(run), {"run": run, "steps": list(range(1, 2 + run % 3))})
    units = plan_units(cfg, store)
    assert len(units) == 1 + 3 * sum(1 + run % 3 for run in range(7))
    for items in (list(range(7)), units):
        shards = [shard_items(items, (i, n)) for i in range(n)]
        flat = [x for shard in shards for x in shard]
        assert sorted(flat) == sorted(items)  # every unit, none twice
        assert len(set(map(repr, flat))) == len(flat)
        assert max(map(len, shards)) - min(map(len, shards)) <= 1  # balanced


# ------------------------------------------------------------------------------------------ config


def test_cluster_settings_do_not_change_the_experiment_identity(tmp_path):
    plain = small_cfg(tmp_path)
    batch = small_cfg(
        tmp_path, "cluster.cluster=slurm", "cluster.shards=8", "cluster.gpus_per_job=1", "cluster.partition=gpu"
    )
    assert batch.cluster.shards == 8 and batch.cluster.cluster == "slurm"
    assert plain.identity_hash() == batch.identity_hash()
    with pytest.raises(ValueError, match="cluster.cluster"):
        small_cfg(tmp_path, "cluster.cluster=kubernetes")


# ------------------------------------------------------------------------------------------ markers


def test_running_marker_lives_with_its_block_and_a_dead_pid_makes_it_stale(tmp_path):
    marker = tmp_path / "RUNNING.json"
    with running_marker(marker, heartbeat_s=0.01):
        assert marker_state(marker) == "running"
        time.sleep(0.05)
        assert time.time() - marker.stat().st_mtime < 1  # the heartbeat refreshes it
    assert not marker.exists() and marker_state(marker) is None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    atomic_write_json(marker, {"host": socket.gethostname(), "pid": int(dead.stdout)})
    assert marker_state(marker) == "stale"
    atomic_write_json(marker, {"host": "another-node", "pid": 1})
    assert marker_state(marker) == "running"
    assert marker_state(marker, now=time.time() + 3600) == "stale"  # no heartbeat for an hour


def test_stale_markers_of_finished_items_are_cleared(tmp_path):
    """A job killed after writing an item but before removing its marker leaves a stale marker next to a
    finished item; the next run removes it. A live job's marker stays."""
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale, live, absent = tmp_path / "a.RUNNING.json", tmp_path / "b.RUNNING.json", tmp_path / "c.RUNNING.json"
    atomic_write_json(stale, {"host": socket.gethostname(), "pid": int(dead.stdout)})
    atomic_write_json(live, {"host": socket.gethostname(), "pid": os.getpid()})
    assert clear_stale_markers([stale, live, absent]) == 1
    assert not stale.exists() and live.exists()


# ------------------------------------------------------------------------------------------ kill and resume


@pytest.mark.slow  # real processes: about 20 s (kill) and 40-80 s (submit) on a busy 2-core CPU
def test_killed_jobs_resume_to_the_uninterrupted_result_bit_for_bit(tmp_path, reference, one_thread):
    out = tmp_path / "killed"
    cfg = small_cfg(out)
    store = RunStore(out)

    # finetune, killed right after the first checkpoint of the first run: in the middle of a run.
    proc = cli_process("finetune", "demo-cpu", "--no-progress", *OVERRIDES, f"output_dir={out}")
    kill_when(proc, lambda: store.checkpoints(0) != [])
    assert not store.run_done(0)
    assert marker_state(run_marker_path(store, 0)) == "stale"
    status = stage_status(store)
    assert (
        0 in status["finetune"]["missing"] and 0 in status["finetune"]["stale"] and status["finetune"]["running"] == []
    )
    before = file_stamps(store.checkpoint_dir(0, s) / "adapter_model.safetensors" for s in store.checkpoints(0))
    finetune(cfg, progress=False, echo=lambda *_: None)
    assert file_stamps(before) == before  # finished checkpoints were not redone
    assert not run_marker_path(store, 0).exists()
    assert_same_runs(reference, store, cfg.train.runs)

    # score, killed right after its first unit was written: in the middle of the second unit.
    proc = cli_process("score", str(out), "--no-progress")
    kill_when(proc, lambda: any(store.scores_dir.rglob("*.parquet")))
    done_at_kill = sorted(store.scores_dir.rglob("*.parquet"))
    before = file_stamps(done_at_kill)
    status = stage_status(store)
    assert status["score"]["done"] == len(done_at_kill) < status["score"]["total"]
    assert len(status["score"]["stale"]) <= 1 and status["score"]["running"] == []
    result = score(cfg, store, progress=False, echo=lambda *_: None)
    assert result["scored"] == status["score"]["total"] - len(done_at_kill)
    assert file_stamps(before) == before
    assert_same_scores(reference, store)
    assert not list(store.scores_dir.rglob("*.RUNNING.json"))


# ------------------------------------------------------------------------------------------ submit


@pytest.mark.slow  # real processes: about 20 s (kill) and 40-80 s (submit) on a busy 2-core CPU
def test_submit_all_on_the_local_cluster_completes_the_demo(tmp_path, reference):
    """`llmaudit submit all` as a user runs it, in its own process (submitit's local jobs are processes of it)."""
    out = tmp_path / "submitted"
    args = ["submit", "all", "demo-cpu", *OVERRIDES, "cluster.shards=2", f"output_dir={out}"]
    env = dict(os.environ, LLMAUDIT_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-m", "llmaudit.cli", *args], env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout + result.stderr
    store = RunStore(out)
    status = stage_status(store)
    assert status["complete"], status
    assert status["score"]["done"] == status["score"]["total"] == len(loss_tables(reference))
    # Two finetune and two score shard jobs ran as separate processes, each with its own log.
    assert len(list((out / "jobs" / "finetune").glob("*_0_log.out"))) == 2
    assert len(list((out / "jobs" / "score").glob("*_0_log.out"))) == 2
    report = json.loads((store.report_dir / "report.json").read_text())
    assert report  # the report stage ran after the scores existed
    assert_same_runs(reference, store, 3)
    assert_same_scores(reference, store)


def test_submit_to_slurm_builds_array_jobs_with_the_recipe_settings(tmp_path, monkeypatch):
    """No cluster here: a stand-in `sbatch` records the scripts submitit writes (nothing runs)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\nn=$(ls "$FAKE_SLURM" | wc -l)\ncp "$1" "$FAKE_SLURM/$n.sh"\necho "Submitted batch job $((1000 + n))"\n'
    )
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit only checks that it exists
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM", str(scripts))
    prepared = []  # the data draw (tested with finetune) happens once in the submitting process, before any job
    monkeypatch.setattr("llmaudit.jobs.submit.prepare_experiment", lambda cfg, store, **kw: prepared.append(store.root))
    cfg = small_cfg(
        tmp_path / "run",
        "cluster.cluster=slurm",
        "cluster.partition=gpu-h100",
        "cluster.gpus_per_job=1",
        "cluster.cpus_per_job=8",
        "cluster.mem_gb=64",
        "cluster.time_minutes=90",
        "cluster.shards=5",
        "cluster.array_parallelism=4",
        "cluster.slurm_additional_parameters={account: audit}",
    )
    jobs = submit(cfg, "all", echo=lambda *_: None)
    assert len(jobs) == 3 + 5 + 1  # finetune capped at train.runs=3 shards, score 5, report 1
    text = [(scripts / f"{i}.sh").read_text() for i in range(3)]
    for script in text:
        for flag in (
            "--partition=gpu-h100",
            "--gpus-per-node=1",
            "--cpus-per-task=8",
            "--mem=64GB",
            "--time=90",
            "--account=audit",
        ):
            assert f"#SBATCH {flag}\n" in script, (flag, script)
    assert "#SBATCH --array=0-2%3\n" in text[0] and "--dependency" not in text[0]  # submitit caps % at the task count
    assert "#SBATCH --array=0-4%4\n" in text[1] and "#SBATCH --dependency=afterok:1000\n" in text[1]
    assert "#SBATCH --dependency=afterok:1001\n" in text[2]
    assert "#SBATCH --job-name=llmaudit-score-demo-cpu\n" in text[1]
    assert slurm_parameters(cfg, "score")["slurm_additional_parameters"] == {"account": "audit"}
    assert prepared == [(tmp_path / "run").resolve()]


def test_job_threads_share_the_machine(tmp_path, monkeypatch):
    """Local shard jobs divide this machine's cores among the jobs that run at once; SLURM jobs take
    cpus_per_job; LLMAUDIT_THREADS wins everywhere."""
    from llmaudit.jobs import submit as jobs

    for var in ("LLMAUDIT_THREADS", "SLURM_JOB_ID", "SUBMITIT_LOCAL_JOB_ID"):
        monkeypatch.delenv(var, raising=False)
    cfg = small_cfg(tmp_path, "cluster.shards=3", "cluster.array_parallelism=2", "cluster.cpus_per_job=5")
    assert jobs.job_threads(cfg) is None
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("SUBMITIT_LOCAL_JOB_ID", "1")
    assert jobs.job_threads(cfg) == 4  # 8 cores, 2 jobs at once
    monkeypatch.delenv("SUBMITIT_LOCAL_JOB_ID")
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert jobs.job_threads(cfg) == 5
    monkeypatch.setenv("LLMAUDIT_THREADS", "3")
    assert jobs.job_threads(cfg) == 3
