"""Where and how `llmaudit submit` sends shard jobs: the cluster section, every value that reaches a batch script
checked when the recipe loads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from llmaudit.common.sbatch import option_problem, path_problem, value_problem
from llmaudit.config.fields import (
    NODE_WHY,
    SHARDS_WHY,
    RecipeSection,
    size_field,
)


class ClusterConfig(RecipeSection):
    """Batch settings of `llmaudit submit`: where the shard jobs run and what each one asks for.

    Not part of the experiment identity: moving an experiment between a laptop and a cluster, or
    changing the shard count, never invalidates finished runs or scores."""

    cluster: Literal["local", "slurm"] = "local"
    """local = shard jobs run as processes on this machine (submitit's LocalExecutor); slurm = a SLURM array job."""
    partition: str | None = None
    """SLURM partition (slurm_partition); None = the cluster's default partition."""
    gpus_per_job: int = size_field(0, ge=0, le=64, why=NODE_WHY)
    """GPUs per shard job (gpus_per_node). With cluster=local, each running shard gets its own GPUs via CUDA_VISIBLE_DEVICES."""
    cpus_per_job: int = size_field(4, ge=1, le=4096, why=NODE_WHY)
    """CPU cores per shard job (cpus_per_task); also torch's thread count in the job unless LLMAUDIT_THREADS is set."""
    mem_gb: int | None = size_field(None, ge=1, le=65536, why=NODE_WHY)
    """Host memory per shard job in GB; None = the cluster's default."""
    time_minutes: int = size_field(240, ge=1, le=525_600, why="a year; a job that is cut off resumes from disk")
    """Wall-clock limit of one shard job. A job that hits it (or is preempted) is requeued and resumes from disk."""
    array_parallelism: int = size_field(16, ge=1, le=100_000, why=SHARDS_WHY)
    """Most shard jobs running at once (slurm_array_parallelism; with cluster=local, concurrent processes)."""
    shards: int = size_field(1, ge=1, le=100_000, why=SHARDS_WHY)
    """N: every stage is split round-robin into N shard jobs (`--shard I/N`); finetune uses at most train.runs of them."""
    slurm_additional_parameters: dict[str, Any] = Field(default_factory=dict, max_length=256)
    """Extra sbatch options, e.g. {account: my-project, qos: normal, constraint: a100}: only the options
    `llmaudit.common.sbatch.FIELD_FORMS` lists, each value in its option's form (nothing else reaches the script)."""
    gpu_model: Literal["h100", "h200", "a100", "l40s", "a6000"] | None = None
    """GPU model of the nodes, for the plan `llmaudit submit` prints (and `llmaudit plan --device`);
    None with gpus_per_job > 0 prices an H100."""
    log_dir: str | None = None
    """Where submitit writes job scripts, pickles and logs; default <output_dir>/jobs."""

    @field_validator("partition")
    @classmethod
    def _partition_form(cls, value: str | None) -> str | None:
        if value is not None and value_problem("partition", value):
            raise ValueError(value_problem("partition", value))
        return value

    @field_validator("log_dir")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and path_problem(value):
            raise ValueError(path_problem(value))
        return value

    @field_validator("slurm_additional_parameters")
    @classmethod
    def _allowed_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        problems = [f"{key}: {option_problem(key, v)}" for key, v in value.items() if option_problem(key, v)]
        if problems:
            raise ValueError("; ".join(problems))
        return value
