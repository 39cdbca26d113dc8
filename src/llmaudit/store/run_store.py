"""The run store: one directory per experiment, self-describing, written atomically.

OUT/
  manifest.json            identity, resolved config, versions, seeds, data fingerprint, membership
  config.yaml              the resolved recipe
  data/pool.jsonl          the audited records (candidate members) ...
  data/val.jsonl           ... and the validation records (never trained on)
  runs/run-000/checkpoints/step-000012/   adapter_model.safetensors, adapter_config.json, checkpoint.json
  runs/run-000/DONE.json   written last: the run is complete
  scores/base/fp32.parquet                 the base model (run -1) on pool + val
  scores/run-000/step-000012/hqq-4.parquet one scoring unit (loss-table format)
  results/                 indicator.json, attacks.json, memorization.json, plots
  report/                  report.json, report.md, report.html
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from llmaudit import __version__
from llmaudit.common.io import atomic_write_json, atomic_write_text, read_json
from llmaudit.config import ExperimentConfig, config_from_dict, dump_config

MANIFEST_VERSION = 1

TRACKED_LIBRARIES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "safetensors",
    "tokenizers",
    "datasets",
    "numpy",
    "scipy",
    "scikit-learn",
    "pandas",
    "pyarrow",
    "hqq",
    "bitsandbytes",
    "gptqmodel",
    "optimum",
)


class StoreError(ValueError):
    """The run store is missing, damaged, or belongs to another experiment."""


def library_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version(), "llmaudit": __version__}
    for name in TRACKED_LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


class RunStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    # ---------------------------------------------------------------- paths
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def run_dir(self, run: int) -> Path:
        return self.root / "runs" / f"run-{run:03d}"

    def checkpoint_dir(self, run: int, step: int) -> Path:
        return self.run_dir(run) / "checkpoints" / f"step-{step:06d}"

    def run_done_path(self, run: int) -> Path:
        return self.run_dir(run) / "DONE.json"

    def unit_path(self, run: int, step: int, quantizer: str) -> Path:
        if run < 0:
            return self.root / "scores" / "base" / f"{quantizer}.parquet"
        return self.root / "scores" / f"run-{run:03d}" / f"step-{step:06d}" / f"{quantizer}.parquet"

    @property
    def scores_dir(self) -> Path:
        return self.root / "scores"

    @property
    def results_dir(self) -> Path:
        return self.root / "results"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    # ---------------------------------------------------------------- manifest
    def exists(self) -> bool:
        return self.manifest_path.exists()

    def manifest(self) -> dict[str, Any]:
        if not self.exists():
            raise StoreError(
                f"{self.root} holds no manifest.json: not an llmaudit run directory. "
                "Run `llmaudit finetune RECIPE` first (or point to the directory it printed)."
            )
        return read_json(self.manifest_path)

    def config(self) -> ExperimentConfig:
        return config_from_dict(self.manifest()["config"], source=str(self.manifest_path))

    def check_identity(self, cfg: ExperimentConfig) -> None:
        """Refuse to mix two experiments in one directory."""
        if not self.exists():
            return
        theirs = self.manifest()
        if theirs.get("identity_hash") != cfg.identity_hash():
            mine, other = cfg.identity(), theirs.get("identity", {})
            diff = sorted(
                f"{section}.{key}"
                for section in set(mine) | set(other)
                for key in set(mine.get(section, {})) | set(other.get(section, {}))
                if mine.get(section, {}).get(key) != other.get(section, {}).get(key)
            )
            raise StoreError(
                f"output directory {self.root} holds another experiment's manifest "
                f"(experiment {theirs.get('name')!r}; differs in {diff[:8]}). Choose a new output_dir "
                "(--out) or delete that directory; score-only settings (quantizers, attacks) may change freely."
            )

    def write_manifest(self, manifest: dict[str, Any]) -> None:
        atomic_write_json(self.manifest_path, manifest)

    def create(self, cfg: ExperimentConfig, data: dict[str, Any], membership: np.ndarray) -> dict[str, Any]:
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "name": cfg.name,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "identity_hash": cfg.identity_hash(),
            "identity": cfg.identity(),
            "config": cfg.model_dump(mode="json"),
            "versions": library_versions(),
            "seeds": {"data": cfg.data.seed, "train": cfg.train.seed, "builtin_model": cfg.model.builtin.seed},
            "data": data,
            "membership": {
                "runs": int(membership.shape[0]),
                "pool_size": int(membership.shape[1]),
                "n_train": [int(x) for x in membership.sum(axis=1)],
                "fpc": float(1 - membership.sum(axis=1).mean() / membership.shape[1]),
                "masks": ["".join("1" if m else "0" for m in row) for row in membership],
            },
        }
        self.write_manifest(manifest)
        atomic_write_text(self.root / "config.yaml", dump_config(cfg))
        return manifest

    def membership(self) -> np.ndarray:
        masks = self.manifest()["membership"]["masks"]
        return np.array([[c == "1" for c in row] for row in masks], dtype=bool)

    def update_config(self, cfg: ExperimentConfig) -> None:
        """Record score/attack/report settings that changed (identity must match)."""
        self.check_identity(cfg)
        manifest = self.manifest()
        manifest["config"] = cfg.model_dump(mode="json")
        self.write_manifest(manifest)
        atomic_write_text(self.root / "config.yaml", dump_config(cfg))

    # ---------------------------------------------------------------- runs
    def checkpoints(self, run: int) -> list[int]:
        """Steps of the complete checkpoints of a run, ascending."""
        root = self.run_dir(run) / "checkpoints"
        if not root.is_dir():
            return []
        steps = [int(p.name.split("-")[1]) for p in root.glob("step-*") if (p / "checkpoint.json").exists()]
        return sorted(steps)

    def run_done(self, run: int) -> bool:
        return self.run_done_path(run).exists()

    def read_records(self, split: str) -> list[dict]:
        path = self.root / "data" / f"{split}.jsonl"
        if not path.exists():
            raise StoreError(f"{path} is missing; rerun `llmaudit finetune` to recreate the data files.")
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
