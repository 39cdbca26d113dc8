"""The run store: one directory per experiment, self-describing, written atomically.

    OUT/
      manifest.json            identity, resolved config, versions, seeds, data fingerprint, membership,
                               the quantizers scored so far (add-only) and a digest of its own content
      config.yaml              the resolved recipe
      data/pool.jsonl          the audited records (candidate members) ...
      data/val.jsonl           ... and the validation records (never trained on)
      runs/run-000/checkpoints/step-000012/   adapter_model.safetensors, adapter_config.json, checkpoint.json,
                                              trainer_state.safetensors + trainer_state.json (newest only)
      runs/run-000/DONE.json   written last: the run's trajectory (steps, the digests of every checkpoint file)
      scores/base/fp32.parquet                 the base model (run -1) on pool + val
      scores/run-000/step-000012/hqq-4.parquet one scoring unit (loss-table format)
      scores/quantizers/hqq-4.json             the quantizer's options, effective bits and model size
      scores/worklog.jsonl     one line per unit scored: who, when, how long (append-only)
      locks/                   file locks that let several processes share the store
      results/                 indicator.json, attacks.json, memorization.json, result.json
      report/                  report.json, report.md, report.html, plots/*.png

An imported experiment (`llmaudit import`) has the same layout without runs/: its manifest lists each
run's checkpoints by path (they stay where the user's training wrote them) with the digests of every file
in them that changes a number (`store.digests`), checked whenever the store is verified or a checkpoint loaded.

Everything a store holds is data: JSON, JSONL, safetensors and parquet. Nothing in it is ever executed
or unpickled, and `trust_remote_code` is never taken from a manifest (docs/architecture.md, "Trust").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.common.bounded import InputLimitError, JsonLineError, read_jsonl
from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json, atomic_write_text, read_json
from llmaudit.common.io import file_digest as file_digest  # re-exported: callers import it from here
from llmaudit.common.names import check_safe_name
from llmaudit.common.runtime import (
    DTYPE_NAMES,
    SHORT_DTYPE_NAMES,
    ComputeChoice,
    check_can_compute,
    dtype_name,
    legacy_dtype,
)
from llmaudit.common.schema import parse_or_refuse
from llmaudit.config import ExperimentConfig, RecipeError, config_from_dict, dump_config, without_runner_settings
from llmaudit.store.confine import check_store_tree
from llmaudit.store.digests import DIGEST_SCOPE, parse_record
from llmaudit.store.manifest import (
    MANIFEST_VERSION,
    REPAIR,
    check_manifest,
    jsonable,
    mask_rows,
    new_manifest,
    no_manifest,
)
from llmaudit.store.manifest import StoreError as StoreError  # re-exported: imported from here across llmaudit
from llmaudit.store.manifest import content_digest as content_digest  # re-exported, as StoreError
from llmaudit.store.records import DoneRecord, QuantizerRecord


class RunStore:
    """One experiment's directory: paths, the manifest (checked on every read), runs and records.

    `manifest()` refuses a manifest that is not valid JSON, lacks a key, whose content digest or identity
    hash does not match its content, or whose membership block contradicts itself; the error names the
    file, what is wrong and how to repair it. `config()` never takes `trust_remote_code` from the
    manifest: only the command line (`--trust-remote-code`) can turn it on for a run directory.

    Opening a store applies its link policy (`store.confine`): a directory below the root that holds a symbolic
    link, a special file or a hard-linked file is refused before anything in it is read or written."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        check_store_tree(self.root)  # the link policy (store/confine.py), before any path below is used

    # ---------------------------------------------------------------- paths
    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def run_dir(self, run: int) -> Path:
        return self.root / "runs" / f"run-{int(run):03d}"

    def own_checkpoint_dir(self, run: int, step: int) -> Path:
        """Where `llmaudit finetune` writes a checkpoint of this store."""
        return self.run_dir(run) / "checkpoints" / f"step-{int(step):06d}"

    def checkpoint_dir(self, run: int, step: int) -> Path:
        """The checkpoint's directory: inside the store, or where an imported run's training wrote it."""
        imported = self.imported_checkpoint(run, step)
        return Path(imported["path"]) if imported else self.own_checkpoint_dir(run, step)

    def run_done_path(self, run: int) -> Path:
        return self.run_dir(run) / "DONE.json"

    def unit_path(self, run: int, step: int, quantizer: str) -> Path:
        check_safe_name("quantizer name", quantizer)
        if run < 0:
            return self.root / "scores" / "base" / f"{quantizer}.parquet"
        return self.root / "scores" / f"run-{int(run):03d}" / f"step-{int(step):06d}" / f"{quantizer}.parquet"

    def quantizer_info_path(self, quantizer: str) -> Path:
        return self.scores_dir / "quantizers" / f"{check_safe_name('quantizer name', quantizer)}.json"

    def quantizer_record(self, quantizer: str) -> dict[str, Any] | None:
        """The quantizer's record (scores/quantizers/NAME.json) as written, parsed by `store.records.QuantizerRecord`
        (StoreError naming the file and the field); None before its first unit is scored."""
        path = self.quantizer_info_path(quantizer)
        if not path.exists():
            return None
        fix = f"delete it and score {quantizer} again (`llmaudit score` writes it with its first unit)"
        record = read_json(path, what="quantizer record", fix=fix)
        parse_or_refuse(QuantizerRecord, record, where=str(path), fix=fix, error=StoreError)
        return record

    def lock_path(self, *parts: str) -> Path:
        """A lock file under locks/ (never beside the files it protects: listings stay clean)."""
        return self.root.joinpath("locks", *parts).with_suffix(".lock")

    @property
    def worklog_path(self) -> Path:
        return self.scores_dir / "worklog.jsonl"

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
        """The manifest, checked: valid JSON, every required key, its digest and identity hash, membership."""
        if not self.exists():
            raise no_manifest(self.root)
        manifest = read_json(self.manifest_path, what="run-store manifest", fix=REPAIR + ".")
        return check_manifest(manifest, self.manifest_path)

    def config(self, *, trust_remote_code: bool = False) -> ExperimentConfig:
        """The experiment's resolved config, with the runner's settings (`config.RUNNER_SETTINGS`) at their defaults:
        `model.trust_remote_code` is the caller's (False unless the user passed --trust-remote-code), never the
        manifest's: a received run directory cannot run code; the cluster section, the devices, batch sizes and
        process counts, and the calibration file are the runner's (the command line sets them), never the
        manifest's: a run directory cannot make a command read a file outside it or start more processes."""
        manifest = self.manifest()
        if not isinstance(manifest["config"], dict):
            raise StoreError(f"{self.manifest_path}: its config section is not a mapping; {REPAIR}.")
        raw = without_runner_settings(json.loads(json.dumps(manifest["config"])))
        try:
            raw.setdefault("model", {})["trust_remote_code"] = bool(trust_remote_code)
            cfg = config_from_dict(raw, source=str(self.manifest_path), received=True)
        except (RecipeError, AttributeError, TypeError) as exc:
            raise StoreError(f"{self.manifest_path}: its config section is invalid ({exc}); {REPAIR}.") from None
        if cfg.identity_hash() != manifest["identity_hash"] or cfg.identity() != jsonable(manifest["identity"]):
            raise StoreError(
                f"{self.manifest_path}: the config section no longer matches the experiment's identity (model, data, "
                f"LoRA and training settings were edited); {REPAIR}."
            )
        return cfg

    @property
    def pending_path(self) -> Path:
        """Written before the first file of a new store, removed with its manifest: a directory that holds it is a
        store being created (its data files are llmaudit's, and a rerun of the same experiment may go on)."""
        return self.root / ".llmaudit-creating.json"

    def begin_create(self, cfg: ExperimentConfig) -> None:
        """Claim the output directory for a new store of `cfg` (check_identity has accepted it)."""
        self.check_identity(cfg)
        atomic_write_json(self.pending_path, {"identity_hash": cfg.identity_hash(), "name": cfg.name})

    def _check_foreign_files(self, cfg: ExperimentConfig) -> None:
        """An output directory without a manifest must be new, empty, or a store of `cfg` being created: anything
        else holds someone's files, which a new store would overwrite (config.yaml, data/pool.jsonl)."""
        if not self.root.exists():
            return
        if not self.root.is_dir():
            raise StoreError(f"output directory {self.root} is a file; choose a new directory (--out).")
        entries = sorted(p.name for p in self.root.iterdir())
        if not entries:
            return
        try:
            claimed = read_json(self.pending_path, what="store claim").get("identity_hash") == cfg.identity_hash()
        except (UserError, OSError, AttributeError):
            claimed = False
        if not claimed:
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise StoreError(
                f"output directory {self.root} is not empty ({shown}) and holds no llmaudit store of this "
                "experiment: its files would be overwritten. Choose a new or empty directory (--out)."
            )

    def check_identity(self, cfg: ExperimentConfig) -> None:
        """Refuse to mix two experiments in one directory, or to write a store over files that are not one."""
        if not self.exists():
            self._check_foreign_files(cfg)
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
        """Write the manifest with a fresh content digest (only llmaudit's own writes go through here)."""
        manifest = dict(manifest)
        # llmaudit's own writes bring an older manifest to the current version (its digest then covers the
        # compute records too; a manifest without them has compute = None: see `train_dtype`).
        manifest["manifest_version"] = max(int(manifest.get("manifest_version") or 0), MANIFEST_VERSION)
        manifest.setdefault("compute", None)
        manifest.setdefault("score_compute", None)
        manifest["content_digest"] = content_digest(manifest)
        atomic_write_json(self.manifest_path, manifest)

    def create(
        self,
        cfg: ExperimentConfig,
        data: dict[str, Any],
        membership: np.ndarray,
        *,
        imported: dict[str, Any] | None = None,
        model_source: dict[str, Any] | None = None,
        compute: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new store's manifest. `compute`: the dtype it trains and scores in and why (`ComputeChoice.to_record`),
        decided once here so that every later process, shard or machine computes in the same dtype."""
        manifest = new_manifest(cfg, data, membership, imported=imported, model_source=model_source, compute=compute)
        self.write_manifest(manifest)
        atomic_write_text(self.root / "config.yaml", dump_config(cfg))
        self.pending_path.unlink(missing_ok=True)
        return self.manifest()

    # ---------------------------------------------------------------- compute dtype
    def train_dtype(self, requested: str, device: torch.device) -> torch.dtype:
        """The dtype this store's runs train in: recorded when the store was created (`compute`). A store whose
        manifest has no compute record keeps the rule such stores were made under (auto = float32 on a CPU, bfloat16
        on a GPU)."""
        record = self.manifest().get("compute")
        if record is None:
            return legacy_dtype(requested, device)
        return self._recorded_dtype(record, "compute")

    def scoring_choice(self, requested: str, device: torch.device) -> ComputeChoice:
        """The dtype every unit of this store is scored in, decided by the first `score` and recorded
        (`score_compute`), so that no store is scored half in one precision and half in another.
        requested = score.dtype: auto = the store's compute dtype; an explicit dtype must match the recorded one
        (a fresh copy of the store without scores/ may be scored in another)."""
        manifest = self.manifest()
        recorded = manifest.get("score_compute")
        if recorded is not None and requested != "auto" and not self.has_scored_units():
            recorded = None  # nothing scored yet (e.g. a copy without its scores/): the dtype may be chosen anew
        if recorded is not None:
            dtype = self._recorded_dtype(recorded, "score_compute")
            if requested != "auto" and DTYPE_NAMES.get(requested) != dtype:
                raise StoreError(
                    f"{self.root} is scored in {dtype_name(dtype)} (recorded by its first `score`); score.dtype={requested} "
                    "would mix two precisions in one grid. Keep score.dtype=auto, or copy the run directory without its "
                    "scores/ and score the copy in the other dtype."
                )
            choice = ComputeChoice(dtype, str(recorded.get("reason") or ""))
        else:
            choice = self._first_scoring_choice(manifest, requested, device)
            manifest["score_compute"] = {**choice.to_record(), "device": device.type}
            self.write_manifest(manifest)
        check_can_compute(choice.dtype, device, what=f"run directory {self.root}")
        return choice

    def has_scored_units(self) -> bool:
        """Whether any loss table of this store's grid is on disk (scores/quarantine/ does not count)."""
        if not self.scores_dir.is_dir():
            return False
        return any(
            p for p in self.scores_dir.rglob("*.parquet") if "quarantine" not in p.relative_to(self.scores_dir).parts
        )

    def reference_name(self, device: torch.device | None = None) -> str:
        """The name the placeholder quantizer `full` takes in this store: the short name (fp32, bf16, fp16) of the
        dtype it is scored in (recorded by its first `score`), else of the dtype it was created with."""
        manifest = self.manifest()
        for key in ("score_compute", "compute"):
            if manifest.get(key) is not None:
                return SHORT_DTYPE_NAMES[self._recorded_dtype(manifest[key], key)]
        requested = manifest["config"].get("model", {}).get("dtype", "auto")
        return SHORT_DTYPE_NAMES[legacy_dtype(requested, device or torch.device("cpu"))]

    def _first_scoring_choice(self, manifest: dict[str, Any], requested: str, device: torch.device) -> ComputeChoice:
        if requested != "auto":
            return ComputeChoice(DTYPE_NAMES[requested], f"score.dtype={requested}")
        record = manifest.get("compute")
        if record is None:  # a manifest without a compute record: the rule its units were scored under
            dtype = legacy_dtype(manifest["config"].get("model", {}).get("dtype", "auto"), device)
            return ComputeChoice(dtype, f"{dtype_name(dtype)}: the rule of stores made before llmaudit 0.3")
        dtype = self._recorded_dtype(record, "compute")
        return ComputeChoice(dtype, f"the store's compute dtype ({record.get('reason')})")

    def _recorded_dtype(self, record: Any, key: str) -> torch.dtype:
        name = record.get("dtype") if isinstance(record, dict) else None
        if name not in DTYPE_NAMES:
            raise StoreError(
                f"{self.manifest_path}: {key}.dtype = {name!r} is not one of {list(DTYPE_NAMES)}; {REPAIR}."
            )
        return DTYPE_NAMES[name]

    def membership(self) -> np.ndarray:
        """[runs, pool_size] booleans: run r trained on pool sample j."""
        rows = mask_rows(self.manifest()["membership"]["masks"], f"{self.manifest_path}: membership")
        return np.stack(rows).reshape(len(rows), -1) == ord("1")

    def scored_quantizers(self) -> list[str]:
        """Every quantizer scored in this store so far, in the order they were first asked for (add-only)."""
        manifest = self.manifest()
        names = list(manifest.get("quantizers") or manifest["config"]["score"]["quantizers"])
        if "full" in names:  # the placeholder of a recipe (ScoreConfig.with_reference): named for this store's dtype
            names = list(dict.fromkeys(self.reference_name() if q == "full" else q for q in names))
        return names

    def update_config(self, cfg: ExperimentConfig) -> ExperimentConfig:
        """Record score/attack/report settings (the identity must match). Add-only: the quantizers already
        scored stay in the manifest's list, the new ones are appended, so that no earlier result disappears
        from a later report. Returns the config as recorded (its score.quantizers is that union)."""
        self.check_identity(cfg)
        manifest = self.manifest()
        union = list(dict.fromkeys([*self.scored_quantizers(), *cfg.score.quantizers]))
        recorded = cfg.model_copy(update={"score": cfg.score.model_copy(update={"quantizers": union})})
        dumped = recorded.model_dump(mode="json")
        dumped["model"]["trust_remote_code"] = manifest["config"].get("model", {}).get("trust_remote_code", False)
        manifest["config"], manifest["quantizers"] = dumped, union
        self.write_manifest(manifest)
        atomic_write_text(self.root / "config.yaml", dump_config(recorded))
        return recorded

    # ---------------------------------------------------------------- runs
    def imported_checkpoint(self, run: int, step: int) -> dict[str, Any] | None:
        """An imported run's checkpoint record {step, path, format, files: {name: sha256}}, or None."""
        imported = self._imported()
        if imported is None:
            return None
        for entry in imported["runs"][int(run)]["checkpoints"]:
            if int(entry["step"]) == int(step):
                return entry
        return None

    def _imported(self) -> dict[str, Any] | None:
        if not self.exists():
            return None
        return self.manifest().get("imported")

    def checkpoint_record(self, run: int, step: int) -> tuple[dict[str, str], bool]:
        """({file name: sha256} recorded for the checkpoint, whether the record covers every file that changes a
        number (`store.digests.DIGEST_SCOPE`) or is an older one that covers the weights (and, imported, the
        configuration) only). ({}, False) for a checkpoint with no record (an unfinished run)."""
        imported = self.imported_checkpoint(run, step)
        if imported is not None:
            where = f"{self.manifest_path}: run {run} step {step}"
            try:
                return parse_record(imported.get("files") or {}, where), imported.get("digest_scope") == DIGEST_SCOPE
            except ValueError as exc:
                raise StoreError(f"{exc}; {REPAIR}.") from None
        record = self.done_record(run)
        if record is None:
            return {}, False
        steps = [str(s) for s in record["steps"]]
        where = f"{self.run_done_path(run)}: step {step}"
        fix = f"delete it to retrain run {run} (`llmaudit finetune`)."
        try:
            if record.get("digest_scope") == DIGEST_SCOPE:
                files = dict(zip(steps, record.get("checkpoint_files") or [], strict=True))
                return parse_record(files.get(str(step), {}), where), True
            legacy = dict(zip(steps, record.get("adapter_sha256") or [], strict=False)).get(str(step))
            return (parse_record({"adapter_model.safetensors": legacy}, where) if legacy else {}), False
        except (ValueError, TypeError) as exc:
            raise StoreError(f"{' '.join(str(exc).split())[:300]}; {fix}") from None

    def done_record(self, run: int) -> dict[str, Any] | None:
        """DONE.json of a finished run (its trajectory: steps and adapter digests), None if unfinished."""
        path = self.run_done_path(run)
        if not path.exists():
            return None
        fix = f"delete it to retrain run {run} (`llmaudit finetune`)."
        record = read_json(path, what="run record", fix=fix)
        if not isinstance(record, dict) or not isinstance(record.get("steps"), list):
            raise StoreError(f"{path} is damaged (no list of steps); {fix}")
        parse_or_refuse(DoneRecord, record, where=str(path), fix=fix, error=StoreError)
        return record

    def checkpoints(self, run: int) -> list[int]:
        """Steps of a run's trajectory, ascending: for a finished (or imported) run the steps it recorded
        (a deleted checkpoint is then missing, never silently replaced by an earlier one); for an
        unfinished run, the complete checkpoints on disk (where training resumes)."""
        imported = self._imported()
        if imported is not None:
            return sorted(int(c["step"]) for c in imported["runs"][int(run)]["checkpoints"])
        record = self.done_record(run)
        if record is not None:
            return sorted(int(s) for s in record["steps"])
        return self.checkpoints_on_disk(run)

    def checkpoints_on_disk(self, run: int) -> list[int]:
        """Steps of the complete checkpoints in this store's runs/ directory."""
        root = self.run_dir(run) / "checkpoints"
        if not root.is_dir():
            return []
        steps = []
        for p in root.glob("step-*"):
            suffix = p.name.split("-", 1)[1]
            if suffix.isdigit() and (p / "checkpoint.json").exists():
                steps.append(int(suffix))
        return sorted(steps)

    def run_done(self, run: int) -> bool:
        return self._imported() is not None or self.run_done_path(run).exists()

    def read_records(self, split: str) -> list[dict]:
        path = self.root / "data" / f"{split}.jsonl"
        if not path.exists():
            raise StoreError(f"{path} is missing; {REPAIR}.")
        records = []
        try:
            for where, record in read_jsonl(path, what="data file"):
                if not isinstance(record, dict):
                    raise StoreError(f"{where} is not a JSON object (a record); {REPAIR}.")
                records.append(record)
        except JsonLineError as exc:
            raise StoreError(f"{exc}; {REPAIR}.") from None
        except InputLimitError as exc:
            raise StoreError(f"{exc} {REPAIR[0].upper()}{REPAIR[1:]}.") from None
        return records
