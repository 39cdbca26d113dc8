"""Batch jobs: `llmaudit submit`'s shard jobs on SLURM through submitit (`submit`, `slurm`) or as local
processes (`submit`, `local`: `score.processes`)."""
