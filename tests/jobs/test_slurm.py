"""`llmaudit submit` on a real SLURM scheduler: the single-node cluster of `.ci/slurm-up` (slurmctld, slurmd,
slurmdbd accounting), whose jobs run on this host. What a cluster user relies on: the demo as array jobs
chained with afterok gives the report a local audit gives, number for number; a preempted task is requeued
and no unit is lost or scored twice; a failed task leaves a chain that `llmaudit status` explains and one
command repairs; the cluster.* settings are what the scheduler holds. The tests at the end need no
cluster: they check the parsing of what SLURM prints against its real formats."""

from __future__ import annotations

import collections
import json
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from llmaudit.jobs import slurm
from llmaudit.planning.status import _format_jobs, format_status, stage_status
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import plan_units
from llmaudit.store.worklog import read_work
from tests.conftest import TINY_OVERRIDES, run_cli
from tests.jobs.slurm_cluster import (
    PARTITION,
    accounting,
    cancel_all,
    freeze_task_holding_a_unit,
    show_job,
    stage_states,
    wait_for_chain,
    wait_for_pending_signal,
)
from tests.jobs.test_jobs import assert_same_scores

# The shared tiny experiment with one library-backed quantizer (HQQ), whose default group size (64) does not
# fit the tiny model's 32-wide layers: HQQ_FIX is the option that makes it run.
OVERRIDES = [o for o in TINY_OVERRIDES if not o.startswith("score.quantizers=")] + [
    "score.quantizers=[fp32,uniform-4,hqq-4]"
]
HQQ_FIX = "score.quantizer_options={hqq-4: {group_size: 16}}"
ON_SLURM = ["cluster.cluster=slurm", "cluster.cpus_per_job=1"]
ENV = {"LLMAUDIT_THREADS": "1"}  # the jobs inherit it (sbatch exports the environment): bitwise equal results


@pytest.fixture
def threads_kept():
    """In-process commands set torch's thread count; put it back for the tests that run after."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def llmaudit(*args) -> str:
    """`llmaudit ARGS` in this process (the jobs it submits inherit ENV); its stdout, or a failure with stderr."""
    code, out, err = run_cli([*args], env=ENV)
    assert code == 0, f"llmaudit {' '.join(map(str, args))} exited {code}: {err[-3000:]}"
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> RunStore:
    """A local `llmaudit audit` of the recipe, one thread, in this process."""
    out = tmp_path_factory.mktemp("local") / "audit"
    before = torch.get_num_threads()
    try:
        llmaudit("audit", "demo-cpu", *OVERRIDES, HQQ_FIX, "--out", out, "--no-progress")
    finally:
        torch.set_num_threads(before)
    return RunStore(out)


@pytest.fixture
def finetuned(reference, tmp_path) -> Path:
    """A copy of the reference's run directory with its runs finished and nothing scored yet."""
    out = tmp_path / "run"
    out.mkdir()
    for name in ("data", "runs"):
        shutil.copytree(reference.root / name, out / name)
    for name in ("manifest.json", "config.yaml"):
        shutil.copy2(reference.root / name, out / name)
    return out


@pytest.fixture
def run_dirs():
    """Run directories a test submits; their jobs are cancelled when it ends, whatever happened."""
    dirs: list[Path] = []
    yield dirs
    cancel_all(dirs)


def comparable(report: dict, run_dir: Path) -> dict:
    """A report without what differs between two runs of the same audit: its time and its run directory."""
    text = json.dumps({k: v for k, v in report.items() if k != "generated_utc"}, sort_keys=True)
    return json.loads(text.replace(json.dumps(str(run_dir))[1:-1], "RUN_DIR"))


def assert_same_report(reference: RunStore, store: RunStore) -> None:
    a = json.loads((reference.report_dir / "report.json").read_text())
    b = json.loads((store.report_dir / "report.json").read_text())
    assert comparable(a, reference.root) == comparable(b, store.root)
    assert_same_scores(reference, store)


def assert_each_unit_scored_once(store: RunStore) -> list[dict]:
    work = read_work(store.worklog_path)
    counts = collections.Counter((w["run"], w["step"], w["quantizer"]) for w in work)
    assert [u for u, n in counts.items() if n > 1] == []
    assert set(counts) == {(u.run, u.step, u.quantizer) for u in plan_units(store.config(), store)}
    return work


def unit_key(store: RunStore, path: Path) -> dict:
    units = [u for u in plan_units(store.config(), store) if store.unit_path(u.run, u.step, u.quantizer) == path]
    assert len(units) == 1, path
    return {"run": units[0].run, "step": units[0].step, "quantizer": units[0].quantizer}


# ------------------------------------------------------------------------------------------ 1. the whole demo


@pytest.mark.slurm
@pytest.mark.slow
def test_submit_all_runs_the_demo_as_chained_array_jobs_and_reports_like_a_local_audit(
    tmp_path, reference, run_dirs, threads_kept
):
    out, shards = tmp_path / "slurm", 3
    run_dirs.append(out)
    llmaudit(
        "submit",
        "all",
        "demo-cpu",
        *OVERRIDES,
        HQQ_FIX,
        *ON_SLURM,
        f"cluster.shards={shards}",
        f"output_dir={out}",
        "--no-plan",
    )
    store = RunStore(out)
    stages = slurm.read_submissions(out)[-1]["stages"]
    assert [(s["stage"], s["tasks"], s["array"]) for s in stages] == [
        ("finetune", 3, True),
        ("score", shards, True),
        ("report", 1, False),
    ]

    # During the run: a score task stopped while it holds a unit, after others wrote theirs.
    held = freeze_task_holding_a_unit(out, done_at_least=1)
    try:
        status = json.loads(llmaudit("status", out, "--json"))
    finally:
        held.resume()
    assert unit_key(store, held.unit) in status["score"]["running"]
    assert status["score"]["done"] >= 1 and status["finetune"]["done"] == [0, 1, 2]
    during = stage_states(status["jobs"])
    assert during["finetune"] == {"COMPLETED": 3}
    assert during["score"].get("RUNNING", 0) >= 1
    assert during["report"] == {"PENDING (Dependency)": 1}

    jobs = wait_for_chain(out)
    assert stage_states(jobs) == {
        "finetune": {"COMPLETED": 3},
        "score": {"COMPLETED": shards},
        "report": {"COMPLETED": 1},
    }
    # afterok held: no score task started before every finetune task had ended, nor the report before the scores.
    rows = {s["stage"]: accounting([s["job_id"]]) for s in stages}
    assert len(rows["finetune"]) == 3 and len(rows["score"]) == shards
    assert min(r["Start"] for r in rows["score"]) >= max(r["End"] for r in rows["finetune"])
    assert rows["report"][0]["Start"] >= max(r["End"] for r in rows["score"])
    # One log per task, where submitit puts it (the report job is not an array: no task index).
    ids = {s["stage"]: s["job_id"] for s in stages}
    assert sorted(p.name for p in (out / "jobs" / "score").glob("*_log.err")) == [
        f"{ids['score']}_{i}_0_log.err" for i in range(shards)
    ]
    assert (out / "jobs" / "report" / f"{ids['report']}_0_log.err").exists()
    assert stage_status(store)["complete"]
    assert_each_unit_scored_once(store)
    assert_same_report(reference, store)


# ------------------------------------------------------------------------------------------ 2. preemption


@pytest.mark.slurm
@pytest.mark.slow
def test_a_preempted_score_task_is_requeued_and_no_unit_is_lost_or_scored_twice(
    finetuned, reference, run_dirs, threads_kept
):
    """Preemption the way submitit expects it: SIGUSR2 to the task (SLURM sends it ahead of a time limit, and at
    preemption with PreemptParameters=send_user_signal). submitit calls the job's checkpoint(), requeues it
    with `scontrol requeue` and exits; SLURM runs the task again."""
    out = finetuned
    run_dirs.append(out)
    llmaudit("submit", "all", out, *ON_SLURM, "cluster.shards=2", "--no-plan")
    store = RunStore(out)
    score_job = slurm.read_submissions(out)[-1]["stages"][0]
    assert score_job["stage"] == "score"  # the runs are finished: no finetune job

    held = freeze_task_holding_a_unit(out)
    try:
        subprocess.run(["scancel", "--signal=USR2", held.job_id], check=True, capture_output=True)
        wait_for_pending_signal(held.pid, signal.SIGUSR2)
    finally:
        held.resume()
    # The marker names the array task: for the array's last task, SLURM_JOB_ID is the array's own id, and
    # the signal above would have reached every task.
    task = show_job(held.job_id)
    preempted = f"{task['ArrayJobId']}_{task['ArrayTaskId']}"
    assert held.job_id == preempted and task["ArrayJobId"] == score_job["job_id"]

    jobs = wait_for_chain(out)
    assert stage_states(jobs) == {"score": {"COMPLETED": 2}, "report": {"COMPLETED": 1}}
    attempts = collections.defaultdict(list)
    for row in accounting([score_job["job_id"]], duplicates=True):
        attempts[row["JobID"]].append(row)
    other = ({f"{score_job['job_id']}_{i}" for i in range(2)} - {preempted}).pop()
    assert {t: [r["State"] for r in rows] for t, rows in attempts.items()} == {
        preempted: ["REQUEUED", "COMPLETED"],
        other: ["COMPLETED"],
    }
    # afterok waited for the requeued attempt, not only for the first one.
    report_job = slurm.read_submissions(out)[-1]["stages"][1]["job_id"]
    assert accounting([report_job])[0]["Start"] >= attempts[preempted][-1]["End"]
    assert "Requeued job" in (Path(score_job["log_dir"]) / f"{preempted}_0_log.out").read_text()
    # The unit it held was not written by the stopped process: the requeued task scored it, once.
    work = assert_each_unit_scored_once(store)
    key = unit_key(store, held.unit)
    [entry] = [w for w in work if {k: w[k] for k in ("run", "step", "quantizer")} == key]
    assert entry["pid"] != held.pid
    assert not list(store.scores_dir.rglob("*.RUNNING.json"))
    assert_same_report(reference, store)


# ------------------------------------------------------------------------------------------ 3. a failed task


@pytest.mark.slurm
@pytest.mark.slow
def test_a_failed_task_leaves_a_chain_that_status_explains_and_one_command_repairs(
    finetuned, reference, run_dirs, threads_kept
):
    """hqq-4 with its default group size cannot run on the tiny model: every score task fails, so the report
    job, waiting with afterok, can never start. `llmaudit status` says so and names the repair, which runs."""
    out = finetuned
    run_dirs.append(out)
    llmaudit("submit", "all", "demo-cpu", *OVERRIDES, *ON_SLURM, "cluster.shards=2", f"output_dir={out}", "--no-plan")
    first = slurm.read_submissions(out)[-1]["stages"]
    score_id, report_id = (s["job_id"] for s in first)

    jobs = wait_for_chain(out)
    assert stage_states(jobs) == {"score": {"FAILED": 2}, "report": {"PENDING (DependencyNeverSatisfied)": 1}}
    assert jobs["broken"] and jobs["stages"][1]["never_start"] == [report_id]
    text = format_status(stage_status(RunStore(out)))
    assert (
        f"failed: {score_id}_0 (FAILED), {score_id}_1 (FAILED): QuantizationError: hqq-4: group_size=64 does not divide"
        in text
    )
    assert f"never starts: {report_id} waits (afterok) for a job that did not succeed" in text
    log = Path(re.search(r"log: (\S+err)", text).group(1))
    assert "group_size=64" in log.read_text()

    # The documented repair: the command status names, with the override that removes the cause.
    command = re.search(r"fix: .*`(llmaudit submit all [^`]+)`", text).group(1).split()[1:]
    assert command == ["submit", "all", str(out)]
    # cluster settings are the submitter's, never the store's (README, Trust): the repair passes them again
    said = llmaudit(*command, *ON_SLURM, "cluster.shards=2", HQQ_FIX, "--no-plan")
    assert f"cancelled 1 job(s) of an earlier submission that could never start: {report_id}" in said
    assert "finetune: nothing left to do" in said
    # While the new chain is alive, a third submission is refused in one line (it would not wait for it).
    code, _, err = run_cli(["submit", "all", str(out), *ON_SLURM, "cluster.shards=2", "--no-plan"], env=ENV)
    assert code == 2 and "still queued or running" in err and len(err.strip().splitlines()) == 1

    jobs = wait_for_chain(out)
    assert stage_states(jobs) == {"score": {"COMPLETED": 2}, "report": {"COMPLETED": 1}} and not jobs["broken"]
    assert accounting([report_id])[0]["State"].startswith("CANCELLED")
    assert stage_status(RunStore(out))["complete"]
    assert_each_unit_scored_once(RunStore(out))
    assert_same_report(reference, RunStore(out))


# ------------------------------------------------------------------------------------------ 4. cluster.* options


@pytest.mark.slurm
def test_cluster_options_are_what_the_scheduler_holds(tmp_path, run_dirs, threads_kept):
    """Submitted held (`hold` passes through slurm_additional_parameters), read back with scontrol, cancelled."""
    out = tmp_path / "held"
    run_dirs.append(out)
    llmaudit(
        "submit",
        "all",
        "demo-cpu",
        *OVERRIDES,
        "cluster.cluster=slurm",
        f"cluster.partition={PARTITION}",
        "cluster.time_minutes=7",
        "cluster.cpus_per_job=2",
        "cluster.mem_gb=1",
        "cluster.shards=3",
        "cluster.array_parallelism=2",
        "cluster.slurm_additional_parameters={hold: true}",
        f"output_dir={out}",
        "--no-plan",
    )
    stages = {s["stage"]: s for s in slurm.read_submissions(out)[-1]["stages"]}
    held = {stage: show_job(s["job_id"]) for stage, s in stages.items()}
    for stage, job in held.items():
        assert job["Partition"] == PARTITION, stage
        assert job["TimeLimit"] == "00:07:00", stage
        assert job["NumCPUs"] == "2" and job["CPUs/Task"] == "2", stage
        assert job["MinMemoryNode"] == "1G", stage
        assert (job["JobState"], job["Reason"]) == ("PENDING", "JobHeldUser"), stage
        assert job["JobName"] == f"llmaudit-{stage}-demo-cpu", stage
    ft, sc = stages["finetune"]["job_id"], stages["score"]["job_id"]
    assert held["finetune"]["ArrayTaskId"] == "0-2%2" and held["finetune"]["ArrayTaskThrottle"] == "2"
    assert held["score"]["ArrayTaskId"] == "0-2%2"
    assert held["finetune"]["Dependency"] == "(null)"
    assert held["score"]["Dependency"] == f"afterok:{ft}_*(unfulfilled)"
    assert held["report"]["Dependency"] == f"afterok:{sc}_*(unfulfilled)"
    # Logs go to the run directory (a pending array shows a placeholder task index until a task starts).
    assert re.fullmatch(re.escape(str(out / "jobs" / "score")) + rf"/{sc}_\d+_0_log\.err", held["score"]["StdErr"])


@pytest.mark.slurm
def test_a_setting_sbatch_refuses_is_one_line_and_submits_nothing(tmp_path, run_dirs, threads_kept):
    out = tmp_path / "refused"
    run_dirs.append(out)
    args = [
        "submit",
        "all",
        "demo-cpu",
        *OVERRIDES,
        *ON_SLURM,
        "cluster.partition=no-such-partition",
        f"output_dir={out}",
    ]
    code, _, err = run_cli([*args, "--no-plan"], env=ENV)
    assert code == 2, err
    *before, last = err.strip().splitlines()  # before: what the data draw printed (building the tiny model)
    assert last.startswith("error: sbatch refused the finetune job") and "invalid partition" in last.lower()
    assert not [line for line in before if "sbatch" in line]  # sbatch's own lines only inside that one
    assert slurm.read_submissions(out) == []


# ------------------------------------------------------------------------------------------ no cluster needed


def fake_scheduler(monkeypatch, answers: dict[str, tuple[int, str, str] | None]) -> None:
    """Replace the scheduler commands by canned answers {command: (exit code, stdout, stderr), or None for
    'not installed'}, as SLURM 22.05 prints them."""

    def run(command: list[str]):
        answer = answers[command[0]]
        return None if answer is None else subprocess.CompletedProcess(command, answer[0], answer[1], answer[2])

    monkeypatch.setattr(slurm, "_run", run)


def recorded_chain(root: Path) -> None:
    """A submission as `submit_slurm` records it: a score array of 2 tasks, then the report job."""
    logs = root / "jobs"
    slurm.record_submission(
        root,
        [
            {
                "stage": "score",
                "job_id": "16",
                "array": True,
                "tasks": 2,
                "shards": [[0, 2], [1, 2]],
                "dependency": None,
                "log_dir": str(logs / "score"),
            },
            {
                "stage": "report",
                "job_id": "17",
                "array": False,
                "tasks": 1,
                "shards": [None],
                "dependency": "afterok:16",
                "log_dir": str(logs / "report"),
            },
        ],
    )


def test_a_broken_chain_is_read_from_what_sacct_and_squeue_print(tmp_path, monkeypatch):
    recorded_chain(tmp_path)
    (tmp_path / "jobs" / "score").mkdir(parents=True)
    (tmp_path / "jobs" / "score" / "16_1_0_log.err").write_text(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "llmaudit.quantize.base.QuantizationError: hqq-4: group_size=64 does not divide 32\n"
        "srun: error: vm: task 0: Exited with exit code 1\n"
    )
    fake_scheduler(
        monkeypatch,
        {
            "sacct": (0, "16_0|COMPLETED\n16_1|FAILED\n17|PENDING\n", ""),  # sacct's reason column lags: not read
            "squeue": (0, "17|PENDING|DependencyNeverSatisfied\n", ""),
        },
    )
    jobs = slurm.jobs_status(tmp_path)
    assert jobs["reachable"] and jobs["broken"]
    score, report = jobs["stages"]
    assert score["states"] == {"COMPLETED": 1, "FAILED": 1} and score["alive"] == []
    assert score["failed"] == [
        {
            "task": "16_1",
            "shard": [1, 2],
            "state": "FAILED",
            "log": str(tmp_path / "jobs/score/16_1_0_log.err"),
            "error": "QuantizationError: hqq-4: group_size=64 does not divide 32",
        }
    ]
    assert report["states"] == {"PENDING (DependencyNeverSatisfied)": 1} and report["never_start"] == ["17"]
    assert slurm.earlier_jobs(tmp_path) == ([], ["17"])
    text = "\n".join(_format_jobs(jobs, str(tmp_path)))
    assert "  score     array 16, 2 task(s): 1 COMPLETED, 1 FAILED\n" in text
    assert "    failed: 16_1 (FAILED): QuantizationError: hqq-4: group_size=64 does not divide 32; log: " in text
    assert "    never starts: 17 waits (afterok) for a job that did not succeed" in text
    assert f"then `llmaudit submit all {tmp_path}`" in text


def test_live_tasks_pending_arrays_and_forgotten_jobs(tmp_path, monkeypatch):
    recorded_chain(tmp_path)
    # A pending array not split into tasks yet (sacct prints the range), a requeued task waiting for its
    # begin time, and a job cancelled by root (sacct appends "by 0").
    fake_scheduler(
        monkeypatch,
        {"sacct": (0, "16_[0-1%2]|PENDING\n17|CANCELLED by 0\n", ""), "squeue": (0, "16_1|PENDING|BeginTime\n", "")},
    )
    score, report = slurm.jobs_status(tmp_path)["stages"]
    assert score["states"] == {"PENDING": 1, "PENDING (BeginTime)": 1} and score["alive"] == ["16_0", "16_1"]
    assert report["states"] == {"CANCELLED": 1} and report["failed"][0]["error"] is None
    assert slurm.earlier_jobs(tmp_path) == (["16_0", "16_1"], [])
    # Accounting disabled and the controller has forgotten the jobs: states unknown, nothing alive.
    fake_scheduler(
        monkeypatch,
        {
            "sacct": (1, "", "sacct: error: Slurm accounting storage is disabled"),
            "squeue": (1, "", "slurm_load_jobs error: Invalid job id specified"),
        },
    )
    jobs = slurm.jobs_status(tmp_path)
    assert jobs["reachable"] and [s["states"] for s in jobs["stages"]] == [{"UNKNOWN": 2}, {"UNKNOWN": 1}]
    assert slurm.earlier_jobs(tmp_path) == ([], [])
    # No scheduler at all (the run directory was copied to a laptop).
    fake_scheduler(monkeypatch, {"sacct": None, "squeue": None})
    jobs = slurm.jobs_status(tmp_path)
    assert jobs["reachable"] is False
    assert "no SLURM scheduler answers here" in "\n".join(_format_jobs(jobs, str(tmp_path)))


def test_a_running_marker_names_the_array_task_not_the_array(tmp_path, monkeypatch):
    """SLURM gives an array's last task the array's own SLURM_JOB_ID: `scancel` of that id stops every
    task, so the marker (what a user reads to find the job at work) names ARRAY_TASK."""
    from llmaudit.store.markers import running_marker

    monkeypatch.setenv("SLURM_JOB_ID", "9")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "9")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    with running_marker(tmp_path / "u.RUNNING.json") as marker:
        assert json.loads(marker.read_text())["job_id"] == "9_1"
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID")
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    with running_marker(tmp_path / "u.RUNNING.json") as marker:
        assert json.loads(marker.read_text())["job_id"] == "9"


def test_scoring_alone_before_the_runs_are_finished_is_refused_at_submit(tiny_cfg, run_dirs, threads_kept):
    """The scoring grid is the runs' checkpoints: with runs missing, score tasks would fail one by one on
    the cluster; `llmaudit submit score` says so at once, in one line, and names the command to use."""
    from llmaudit.finetune.experiment import prepare_experiment

    out = tiny_cfg.resolved_output_dir()
    run_dirs.append(out)  # were anything submitted
    prepare_experiment(tiny_cfg, RunStore(out), echo=lambda *_: None)  # the data draw, no runs
    code, _, err = run_cli(["submit", "score", str(out), "cluster.cluster=slurm", "--no-plan"], env=ENV)
    assert code == 2, err
    assert err.strip().splitlines()[-1] == (
        f"error: {out}: runs [0, 1, 2] are not finished, so the scoring grid is not known yet; "
        f"submit the whole chain instead: `llmaudit submit all {out}`"
    )
    assert slurm.read_submissions(out) == []
