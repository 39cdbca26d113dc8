"""`llmaudit submit`: every stage as independent shard jobs, on SLURM (submitit) or as local processes.

A stage is a list of independent units, dealt round-robin to N shards (`shard_items`): shard I does the
units whose index is I mod N (`llmaudit.store.shards`), so N jobs cover the grid once, with no coordination between them.

    finetune   one unit per fine-tuning run            (runs/run-007/DONE.json when finished)
    score      one unit per (run, checkpoint, quantizer) (scores/run-007/step-000120/hqq-4.parquet)
    report     one unit: the analysis and the report    (report/report.json)

Resuming is the stages' own job (finished units are skipped, an interrupted run restarts from its
latest checkpoint), so a crashed, killed or preempted shard is simply run again. While a unit is being
worked on, a RUNNING marker sits beside it (runs/run-007/RUNNING.json, scores/.../hqq-4.RUNNING.json)
with the host and pid of its process and a heartbeat (the file's mtime); `llmaudit status` tells a live
marker from one left behind by a killed job (`llmaudit.store.markers`).

`llmaudit submit` sends the shards through submitit: a SLURM array job per stage (later stages wait for
earlier ones with `afterok` dependencies), or local processes with `cluster: local`. On SLURM, each
submission is recorded in RUN_DIR/jobs/slurm.jsonl (`llmaudit.jobs.slurm`): a new one is refused while an
earlier chain is alive, cancels the jobs of an earlier one that can never start, and skips the stages
and shards that have nothing left to do.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from llmaudit.common.runtime import THREADS_ENV, available_cores, env_threads, set_threads
from llmaudit.common.sbatch import check_script_parameters
from llmaudit.config import ExperimentConfig, config_from_dict
from llmaudit.finetune.experiment import prepare_experiment
from llmaudit.finetune.runs import finetune
from llmaudit.jobs.slurm import SlurmError, cancel, earlier_jobs, record_submission
from llmaudit.score.stage import score
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import shard_items
from llmaudit.store.units import plan_units

Stage = Literal["finetune", "score", "report"]

STAGES: tuple[Stage, ...] = ("finetune", "score", "report")


def job_threads(cfg: ExperimentConfig) -> int | None:
    """The CPU threads of one shard job.

    Args:
        cfg: the experiment's config (its cluster section).

    Returns:
        $LLMAUDIT_THREADS if set; on SLURM cluster.cpus_per_job; as a local process, this machine's cores divided
        among the jobs that run at once (they share the machine); None elsewhere (torch's default).
    """
    if env_threads():
        return env_threads()
    if os.environ.get("SLURM_JOB_ID"):
        return cfg.cluster.cpus_per_job
    if os.environ.get("SUBMITIT_LOCAL_JOB_ID"):
        return max(1, available_cores() // min(cfg.cluster.array_parallelism, cfg.cluster.shards))
    return None


def _set_threads(cfg: ExperimentConfig) -> None:
    threads = job_threads(cfg)
    if threads:
        os.environ[THREADS_ENV] = str(threads)  # also caps the scoring engine's CPU workers
        set_threads(threads)


def run_shard(
    stage: Stage, config: dict[str, Any], out: str, shard: tuple[int, int] | None, *, progress: bool = False
) -> dict[str, Any]:
    """Do one shard of a stage in this process: what `llmaudit STAGE ... --shard I/N` does.

    Takes the config as plain data so that it pickles for submitit; safe to run again after any crash.

    Args:
        stage: finetune, score or report.
        config: the experiment's config as plain data.
        out: the run directory.
        shard: (I, N), or None for the whole stage.
        progress: show progress bars.

    Returns:
        {"stage", "shard"} and what the stage did (runs done, units scored, the report's paths).

    Raises:
        ValueError: an unknown stage.
    """
    cfg = config_from_dict(config, source="(submitted job)")
    _set_threads(cfg)
    store = RunStore(out)
    if stage == "finetune":
        finetune(cfg, out=Path(out), shard=shard, progress=progress)
        return {"stage": stage, "shard": shard, "runs_done": sum(store.run_done(r) for r in range(cfg.train.runs))}
    if stage == "score":
        return {"stage": stage, "shard": shard, **score(cfg, store, shard=shard, progress=progress)}
    if stage == "report":  # imported here: a finetune or score task starts seconds sooner without them
        from llmaudit.analyze.store_analysis import analyze
        from llmaudit.report.write import write_report

        paths = write_report(store, analyze(store.config(), store))
        return {"stage": stage, "shard": None, "paths": paths}
    raise ValueError(f"unknown stage {stage!r}; allowed: {list(STAGES)}")


class ShardJob:
    """The callable each submitit job runs. On timeout or preemption submitit calls `checkpoint`, which
    requeues the same call: the stage resumes from what is on disk (duck-typed submitit Checkpointable,
    so that importing llmaudit never needs submitit)."""

    def __call__(self, stage: Stage, config: dict[str, Any], out: str, shard: tuple[int, int] | None) -> dict[str, Any]:
        return run_shard(stage, config, out, shard)

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """The same call, requeued by submitit on timeout or preemption (the stage resumes from what is on disk).

        Args:
            *args: the job's positional arguments.
            **kwargs: its keyword arguments.

        Returns:
            submitit's `DelayedSubmission` of this job.
        """
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def stage_shards(stage: Stage, cfg: ExperimentConfig) -> list[tuple[int, int] | None]:
    """The shard arguments of one stage's jobs.

    Args:
        stage: finetune, score or report.
        cfg: the experiment's config (cluster.shards, train.runs).

    Returns:
        [(I, N), ...]: finetune never gets more shards than runs; report is one job ([None]).
    """
    if stage == "report":
        return [None]
    n = min(cfg.cluster.shards, cfg.train.runs) if stage == "finetune" else cfg.cluster.shards
    return [(i, n) for i in range(n)]


def shard_has_work(stage: Stage, cfg: ExperimentConfig, store: RunStore, shard: tuple[int, int] | None) -> bool:
    """Whether a shard has anything left to do.

    Args:
        stage: finetune, score or report.
        cfg: the experiment's config.
        store: its run store.
        shard: (I, N), or None.

    Returns:
        True when a run or a unit of the shard is not done; always True for the report (it is cheap and reads
        every score).
    """

    if stage == "finetune":
        return any(not store.run_done(r) for r in shard_items(list(range(cfg.train.runs)), shard))
    if stage == "score":
        return any(
            not store.unit_path(u.run, u.step, u.quantizer).exists() for u in shard_items(plan_units(cfg, store), shard)
        )
    return True


def slurm_parameters(cfg: ExperimentConfig, stage: Stage, dependency: str | None = None) -> dict[str, Any]:
    """The submitit AutoExecutor parameters of one stage's array job, from the recipe's cluster section.

    Args:
        cfg: the experiment's config.
        stage: finetune, score or report.
        dependency: the SLURM dependency on the previous stage (`afterok:ID`), or None.

    Returns:
        The parameters (name, time, resources, the additional SLURM parameters).
    """
    c = cfg.cluster
    extra = dict(c.slurm_additional_parameters)
    if dependency:
        extra["dependency"] = dependency
    params: dict[str, Any] = {
        "name": f"llmaudit-{stage}-{cfg.name}",
        "timeout_min": c.time_minutes,
        "nodes": 1,
        "tasks_per_node": 1,
        "gpus_per_node": c.gpus_per_job,
        "cpus_per_task": c.cpus_per_job,
        "slurm_array_parallelism": c.array_parallelism,
    }
    if c.partition:
        params["slurm_partition"] = c.partition
    if c.mem_gb:
        params["mem_gb"] = c.mem_gb
    if extra:
        params["slurm_additional_parameters"] = extra
    return params


def _log_dir(cfg: ExperimentConfig, out: Path) -> Path:
    return Path(cfg.cluster.log_dir) if cfg.cluster.log_dir else out / "jobs"


def _array_id(job: Any) -> str:
    return str(job.job_id).split("_")[0]


def _stages_to_submit(
    cfg: ExperimentConfig, stages: list[Stage], store: RunStore, echo
) -> list[tuple[Stage, list[tuple[int, int] | None]]]:
    """The shards of each stage that need a job. While every earlier stage is finished, a stage's remaining
    work is on disk, so only its shards with work are sent and a finished stage is skipped (resubmitting a
    chain after a failure redoes nothing); after a stage that is sent, every shard of the later ones is."""
    out: list[tuple[Stage, list[tuple[int, int] | None]]] = []
    for stage in stages:
        shards = stage_shards(stage, cfg)
        if not out and stage != "report":
            unfinished = [r for r in range(cfg.train.runs) if not store.run_done(r)]
            if stage == "score" and unfinished:
                raise SlurmError(
                    f"{store.root}: runs {unfinished} are not finished, so the scoring grid is not known yet; "
                    f"submit the whole chain instead: `llmaudit submit all {store.root}`"
                )
            shards = [shard for shard in shards if shard_has_work(stage, cfg, store, shard)]
            if not shards:
                echo(f"[submit] {stage}: nothing left to do")
                continue
        out.append((stage, shards))
    return out


def _clear_earlier_chain(out: Path, echo) -> None:
    """Before a new chain: refuse while jobs of an earlier submission are alive (the new chain would not
    wait for them: its report could start before they finish); cancel those that can never start (they
    wait with afterok for a task that failed), so that they do not sit in the queue for good."""
    live, never = earlier_jobs(out)
    if live:
        raise SlurmError(
            f"{out}: {len(live)} job(s) of an earlier `llmaudit submit` are still queued or running "
            f"({', '.join(live[:6])}{', ...' if len(live) > 6 else ''}); wait for them (`llmaudit status {out}`), "
            f"or cancel them (`scancel {' '.join(sorted({t.split('_')[0] for t in live}))}`), then submit again."
        )
    if never:
        cancel(sorted({t.split("_")[0] for t in never}))
        echo(
            f"[submit] cancelled {len(never)} job(s) of an earlier submission that could never start: {', '.join(never)}"
        )


def _submit_stage(executor: Any, stage: Stage, cfg: ExperimentConfig, out: Path, shards: list) -> list[Any]:
    config = cfg.model_dump(mode="json")
    n = len(shards)
    said = io.StringIO()  # submitit prints a refused sbatch's stderr itself; it goes into our one line instead
    try:
        with contextlib.redirect_stderr(said):
            return executor.map_array(ShardJob(), [stage] * n, [config] * n, [str(out)] * n, shards)
    except Exception as exc:  # submitit's FailedJobError carries sbatch's own message
        if type(exc).__name__ != "FailedJobError":
            sys.stderr.write(said.getvalue())
            raise
        lines = [line for line in str(exc).splitlines() if line.strip()]
        why = "; ".join(" ".join(line.split()) for line in lines) or "no message"
        raise SlurmError(
            f"sbatch refused the {stage} job of {out}: {why}; fix the cluster.* setting it names "
            "(partition, time_minutes, cpus_per_job, mem_gb, gpus_per_job, slurm_additional_parameters) and submit again."
        ) from None


def submit_slurm(
    cfg: ExperimentConfig,
    stages: list[Stage],
    out: Path,
    *,
    executor_factory: Callable[..., Any] | None = None,
    echo=print,
) -> list[Any]:
    """One SLURM array job per stage that has work, each waiting (afterok) for the previous one.

    The submission is recorded in RUN_DIR/jobs/slurm.jsonl (`llmaudit status` reads it), even when a later stage
    is refused. Returns without waiting.

    Args:
        cfg: the experiment's config.
        stages: the stages, in order.
        out: the run directory.
        executor_factory: builds the submitit executor (tests pass a fake one); None: submitit's AutoExecutor.
        echo: where progress lines go.

    Returns:
        The submitted jobs.

    Raises:
        SlurmError: an earlier chain is alive, sbatch refused a job (the cluster.* setting to fix named), or a
            job that can never start could not be cancelled.
    """
    if executor_factory is None:
        import submitit

        executor_factory = submitit.AutoExecutor
    _clear_earlier_chain(out, echo)
    all_jobs: list[Any] = []
    record: list[dict[str, Any]] = []
    dependency = None
    try:
        for stage, shards in _stages_to_submit(cfg, stages, RunStore(out), echo):
            folder = _log_dir(cfg, out) / stage
            executor = executor_factory(folder=str(folder), cluster="slurm")
            params = slurm_parameters(cfg, stage, dependency)
            check_script_parameters(params, folder)  # the last gate before submitit writes the script
            executor.update_parameters(**params)
            jobs = _submit_stage(executor, stage, cfg, out, shards)
            job_id, array = _array_id(jobs[0]), "_" in str(jobs[0].job_id)
            echo(
                f"[submit] {stage}: SLURM {'array job' if array else 'job'} {job_id} with {len(jobs)} task(s)"
                + (f", after {dependency.replace(':', ' of ')}" if dependency else "")
            )
            record.append(
                {
                    "stage": stage,
                    "job_id": job_id,
                    "array": array,
                    "tasks": len(jobs),
                    "shards": shards,
                    "dependency": dependency,
                    "log_dir": str(folder),
                }
            )
            dependency = f"afterok:{job_id}"
            all_jobs.extend(jobs)
    finally:
        if record:  # what was submitted, even when a later stage was refused: status and scancel need it
            record_submission(out, record)
    return all_jobs


def _local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _local_slots(cfg: ExperimentConfig, echo) -> int:
    """Local jobs that run at once: cluster.array_parallelism, at most as many as this machine's GPUs can give
    cluster.gpus_per_job each (refused when it has fewer than one job's)."""
    gpus = cfg.cluster.gpus_per_job
    slots = cfg.cluster.array_parallelism
    if gpus:
        available = _local_gpu_count()
        if available < gpus:
            raise RuntimeError(
                f"cluster.gpus_per_job={gpus} but this machine has {available} GPU(s); set cluster.gpus_per_job=0 for CPU"
            )
        slots = min(slots, available // gpus)
    elif _local_gpu_count():
        echo(
            "[submit] note: cluster.gpus_per_job=0, so the jobs see no GPU (CUDA_VISIBLE_DEVICES is empty); set it to 1 to use this machine's GPUs"
        )
    return slots


def _run_local_stage(cfg: ExperimentConfig, stage: Stage, out: Path, slots: int, poll_s: float) -> list[Any]:
    """The stage's shard jobs that have work, through submitit's LocalExecutor, at most `slots` at once (each
    with its own GPUs); blocks until every one has finished and returns them."""
    import submitit

    config = cfg.model_dump(mode="json")
    gpus = cfg.cluster.gpus_per_job
    executor = submitit.LocalExecutor(folder=str(_log_dir(cfg, out) / stage))
    # Stages run one after the other here, so shards whose units are all on disk need no process at all.
    pending = [shard for shard in stage_shards(stage, cfg) if shard_has_work(stage, cfg, RunStore(out), shard)]
    running: dict[int, Any] = {}  # slot -> job
    finished: list[Any] = []
    while pending or running:
        # A job's result file appears before its process has finished exiting (torch teardown is slow).
        for slot in [s for s, job in running.items() if job.paths.result_pickle.exists() or job.done()]:
            finished.append(running.pop(slot))
        for slot in [s for s in range(slots) if s not in running]:
            if not pending:
                break
            executor.update_parameters(
                timeout_min=cfg.cluster.time_minutes,
                gpus_per_node=gpus,
                visible_gpus=list(range(slot * gpus, (slot + 1) * gpus)),
            )
            running[slot] = executor.submit(ShardJob(), stage, config, str(out), pending.pop(0))
        time.sleep(poll_s if running else 0)
    return finished


def submit_local(
    cfg: ExperimentConfig, stages: list[Stage], out: Path, *, echo=print, poll_s: float = 0.5
) -> list[dict[str, Any]]:
    """Run every stage's shard jobs as local processes through submitit's LocalExecutor, stage after stage.

    At most cluster.array_parallelism jobs run at once; with gpus_per_job > 0 each concurrent job gets its own GPUs
    (CUDA_VISIBLE_DEVICES), so one node with G GPUs trains G runs side by side. Blocks until done: local jobs are
    children of this process.

    Args:
        cfg: the experiment's config.
        stages: the stages, in order.
        out: the run directory.
        echo: where progress lines go.
        poll_s: seconds between looks at the running jobs.

    Returns:
        Every finished job's result (`run_shard`).

    Raises:
        RuntimeError: a job failed (its log named), or more GPUs per job are asked for than this machine has.
    """
    import submitit  # noqa: F401  (fails here, before any stage, when submitit is missing)

    slots = _local_slots(cfg, echo)
    results: list[dict[str, Any]] = []
    for stage in stages:
        finished = _run_local_stage(cfg, stage, out, slots, poll_s)
        for job in finished:
            try:
                results.append(job.result())
            except Exception as exc:  # submitit wraps the job's traceback; the log path is what helps
                raise RuntimeError(f"{stage} job {job.job_id} failed; its log: {job.paths.stderr}\n{exc}") from None
        skipped = len(stage_shards(stage, cfg)) - len(finished)
        echo(
            f"[submit] {stage}: {len(finished)} local job(s) finished"
            + (f"; {skipped} shard(s) had nothing left to do" if skipped else "")
        )
    return results


def submit(
    cfg: ExperimentConfig,
    stage: Literal["finetune", "score", "report", "all"],
    *,
    echo=print,
    executor_factory: Callable[..., Any] | None = None,
) -> list[Any]:
    """Send a stage (or all three, in order) to the cluster the recipe names.

    The run directory is prepared first (data draw, manifest), so that the shard jobs never race to create it.

    Args:
        cfg: the experiment's config; its `cluster` section says where and how many shards.
        stage: `finetune`, `score`, `report`, or `all` (the three in order).
        echo: where progress lines go.
        executor_factory: builds the submitit executor (tests pass a fake one); None: submitit's.

    Returns:
        The submitted jobs (SLURM), or the finished local jobs' results (`cluster.cluster: local`).

    Raises:
        UserError: the run directory belongs to another experiment, or an earlier chain is still alive.
        RuntimeError: a local job failed (its log is named).
    """
    out = cfg.resolved_output_dir().resolve()
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    stages: list[Stage] = list(STAGES) if stage == "all" else [stage]
    if stages[0] == "finetune":
        prepare_experiment(cfg, RunStore(out), echo=echo)
    else:
        RunStore(out).check_identity(cfg)
    echo(
        f"[submit] {', '.join(stages)} of {cfg.name} on {cfg.cluster.cluster}; run directory {out}; logs in {_log_dir(cfg, out)}"
    )
    if cfg.cluster.cluster == "slurm":
        return submit_slurm(cfg, stages, out, executor_factory=executor_factory, echo=echo)
    return submit_local(cfg, stages, out, echo=echo)
