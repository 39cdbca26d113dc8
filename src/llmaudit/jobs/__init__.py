"""Batch jobs: `llmaudit status` (what is done, running, missing) and `llmaudit submit` (shard jobs on
SLURM through submitit, or as local processes).
"""
