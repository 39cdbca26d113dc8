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
earlier ones with `afterok` dependencies), or local processes with `cluster: local`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from llmaudit.analyze.experiment import analyze
from llmaudit.common.runtime import THREADS_ENV, available_cores, env_threads, set_threads
from llmaudit.config import ExperimentConfig, config_from_dict
from llmaudit.finetune.experiment import prepare_experiment
from llmaudit.finetune.runs import finetune
from llmaudit.jobs.plan import format_plan, make_plan
from llmaudit.report.write import write_report
from llmaudit.score.stage import score
from llmaudit.store.run_store import RunStore
from llmaudit.store.shards import shard_items
from llmaudit.store.units import plan_units

T = TypeVar("T")

Stage = Literal["finetune", "score", "report"]

STAGES: tuple[Stage, ...] = ("finetune", "score", "report")


def job_threads(cfg: ExperimentConfig) -> int | None:
    """CPU threads of one shard job: $LLMAUDIT_THREADS if set; on SLURM cluster.cpus_per_job; as a local
    process, this machine's cores divided among the jobs that run at once (they share the machine);
    None = torch's default."""
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
    """Do shard `shard` of `stage` in this process: what `llmaudit STAGE ... --shard I/N` does.

    Takes the config as plain data so that it pickles for submitit; safe to run again after any crash."""
    cfg = config_from_dict(config, source="(submitted job)")
    _set_threads(cfg)
    store = RunStore(out)
    if stage == "finetune":
        finetune(cfg, out=Path(out), shard=shard, progress=progress)
        return {"stage": stage, "shard": shard, "runs_done": sum(store.run_done(r) for r in range(cfg.train.runs))}
    if stage == "score":
        return {"stage": stage, "shard": shard, **score(cfg, store, shard=shard, progress=progress)}
    if stage == "report":
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
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, *args, **kwargs)


def stage_shards(stage: Stage, cfg: ExperimentConfig) -> list[tuple[int, int] | None]:
    """The shard arguments of one stage's jobs: finetune never gets more shards than runs; report is one job."""
    if stage == "report":
        return [None]
    n = min(cfg.cluster.shards, cfg.train.runs) if stage == "finetune" else cfg.cluster.shards
    return [(i, n) for i in range(n)]


def shard_has_work(stage: Stage, cfg: ExperimentConfig, store: RunStore, shard: tuple[int, int] | None) -> bool:
    """Whether a shard has anything left to do (the report is always redone: it is cheap and reads every score)."""

    if stage == "finetune":
        return any(not store.run_done(r) for r in shard_items(list(range(cfg.train.runs)), shard))
    if stage == "score":
        return any(
            not store.unit_path(u.run, u.step, u.quantizer).exists() for u in shard_items(plan_units(cfg, store), shard)
        )
    return True


def slurm_parameters(cfg: ExperimentConfig, stage: Stage, dependency: str | None = None) -> dict[str, Any]:
    """submitit AutoExecutor parameters of one stage's array job, from the recipe's cluster section."""
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


def submit_slurm(
    cfg: ExperimentConfig,
    stages: list[Stage],
    out: Path,
    *,
    executor_factory: Callable[..., Any] | None = None,
    echo=print,
) -> list[Any]:
    """One SLURM array job per stage, each waiting (afterok) for the previous one. Returns without waiting."""
    if executor_factory is None:
        import submitit

        executor_factory = submitit.AutoExecutor
    config = cfg.model_dump(mode="json")
    all_jobs: list[Any] = []
    dependency = None
    for stage in stages:
        shards = stage_shards(stage, cfg)
        executor = executor_factory(folder=str(_log_dir(cfg, out) / stage), cluster="slurm")
        executor.update_parameters(**slurm_parameters(cfg, stage, dependency))
        jobs = executor.map_array(
            ShardJob(), [stage] * len(shards), [config] * len(shards), [str(out)] * len(shards), shards
        )
        echo(
            f"[submit] {stage}: SLURM array job {_array_id(jobs[0])} with {len(jobs)} task(s)"
            + (f", after {dependency}" if dependency else "")
        )
        dependency = f"afterok:{_array_id(jobs[0])}"
        all_jobs.extend(jobs)
    return all_jobs


def _local_gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def submit_local(
    cfg: ExperimentConfig, stages: list[Stage], out: Path, *, echo=print, poll_s: float = 0.5
) -> list[dict[str, Any]]:
    """Run every stage's shard jobs as local processes through submitit's LocalExecutor, stage after stage.

    At most cluster.array_parallelism jobs run at once; with gpus_per_job > 0 each concurrent job gets its
    own GPUs (CUDA_VISIBLE_DEVICES), so one node with G GPUs trains G runs side by side. Blocks until done:
    local jobs are children of this process. Raises if a job fails (its log is in the log directory)."""
    import submitit

    config = cfg.model_dump(mode="json")
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
    results: list[dict[str, Any]] = []
    for stage in stages:
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
    show_plan: bool = False,
) -> list[Any]:
    """Send a stage (or all three, in order) to the cluster the recipe names. Prepares the run directory
    first (data draw, manifest) so that the shard jobs never race to create it; with `show_plan`, prints
    the plan of the whole audit (`llmaudit plan`) on the cluster's devices first."""
    out = cfg.resolved_output_dir().resolve()
    cfg = cfg.model_copy(update={"output_dir": str(out)})
    stages: list[Stage] = list(STAGES) if stage == "all" else [stage]
    if show_plan:
        device = cfg.cluster.gpu_model or ("h100" if cfg.cluster.gpus_per_job else "cpu")
        echo(format_plan(make_plan(cfg, device=device, jobs=cfg.cluster.shards, echo=echo)))
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
