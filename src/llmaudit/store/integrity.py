"""One verdict on a run store: is everything it claims to hold there, complete and consistent?

`verify_store` checks a store against its manifest:
- the manifest itself (valid JSON, every key, its content digest, identity hash and membership block:
  `RunStore.manifest`), and the data files against the ids and fingerprint it records;
- every finished run has every checkpoint of its recorded trajectory, each file that changes a number as
  recorded (`store.digests`: configurations always, weights when deep) and none added; a run whose final
  checkpoint is gone is never reported from an earlier step;
- every scoring unit on disk is a readable parquet file for exactly its (run, checkpoint, quantizer),
  holding exactly its samples (validation samples; plus the pool at a run's final checkpoint), with the
  membership flags of the manifest and finite losses (deep: finite per-token losses and statistics too).

`shallow` reads manifests, directory listings and a few parquet columns (what `score` and `status` need
on every start); `deep` reads everything (what `report` needs anyway). A failed unit counts as not done:
`llmaudit score` moves it aside (scores/quarantine/, nothing is deleted) and scores it again; `report`
refuses a store with any problem, naming the files and the command that repairs them.
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from llmaudit.common.bounded import read_parquet_bounded
from llmaudit.common.errors import UserError
from llmaudit.config import ExperimentConfig
from llmaudit.data.records import dataset_fingerprint
from llmaudit.store.digests import PICKLED_WEIGHTS, check_digests, legacy_files
from llmaudit.store.losstable import REFERENCE_RUN, LossTableError, read_parquet_file, validate_loss_table
from llmaudit.store.manifest import SETTINGS_NOT_COVERED, settings_covered
from llmaudit.store.run_store import RunStore, StoreError
from llmaudit.store.units import Unit, plan_units

KEY_COLUMNS = ["run", "checkpoint", "quantizer", "sample_id", "split", "member", "loss", "n_tokens"]
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors", "model.safetensors.index.json")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a store: the file, what is wrong, and the command or action that repairs it."""

    path: str
    problem: str
    fix: str
    run: int | None = None
    """The fine-tuning run the problem belongs to, if any."""

    def line(self) -> str:
        return f"{self.path}: {self.problem} (fix: {self.fix})"


@dataclass
class StoreVerdict:
    """The result of `verify_store`: store-level problems and the state of every expected unit."""

    problems: list[Problem] = field(default_factory=list)
    units: dict[Unit, str] = field(default_factory=dict)
    """Each planned unit: "done", "missing", or "invalid: <reason>"."""
    deep: bool = False
    notes: list[str] = field(default_factory=list)
    """What the verification could not cover (e.g. checkpoints recorded by an older llmaudit), for status lines."""

    @property
    def invalid_units(self) -> dict[Unit, str]:
        return {u: s for u, s in self.units.items() if s.startswith("invalid")}

    @property
    def ok(self) -> bool:
        return not self.problems and not self.invalid_units

    def done(self, unit: Unit) -> bool:
        return self.units.get(unit) == "done"

    def all_problems(self, store: RunStore) -> list[Problem]:
        unit_problems = [
            Problem(
                str(store.unit_path(u.run, u.step, u.quantizer)),
                s.removeprefix("invalid: "),
                _rescore(store, self.deep),
            )
            for u, s in sorted(self.invalid_units.items())
        ]
        return self.problems + unit_problems

    def message(self, store: RunStore, *, limit: int = 5) -> str:
        """One line naming the files at fault and the repair (for a refusal)."""
        problems = self.all_problems(store)
        listed = "; ".join(p.line() for p in problems[:limit])
        more = (
            f"; ... and {len(problems) - limit} more (`llmaudit status {store.root}` lists them)"
            if len(problems) > limit
            else ""
        )
        return f"run directory {store.root} is inconsistent ({len(problems)} problem(s)): {listed}{more}"


def _rescore(store: RunStore, deep: bool) -> str:
    return f"`llmaudit score {store.root}{' --deep-verify' if deep else ''}` scores the unit again"


def verify_store(store: RunStore, cfg: ExperimentConfig | None = None, *, deep: bool = False) -> StoreVerdict:
    """Check the store against its manifest (see the module docstring). Raises StoreError only when the
    manifest itself is unusable; everything else is reported in the verdict."""
    manifest = store.manifest()
    cfg = cfg or store.config()
    verdict = StoreVerdict(deep=deep)
    verdict.problems += _check_data(store, manifest)
    run_problems, broken_runs = _check_runs(store, cfg, deep=deep)
    verdict.problems += run_problems
    done_runs = [r for r in range(cfg.train.runs) if r not in broken_runs and store.run_done(r)]
    verdict.notes += [n for n in [legacy_coverage(store, done_runs)] if n]
    if not settings_covered(manifest):
        verdict.notes.append(SETTINGS_NOT_COVERED)
    if any(p.problem.startswith("data") for p in verdict.problems):
        return verdict
    pool_ids = list(manifest["data"].get("pool_ids") or [])
    val_ids = list(manifest["data"].get("val_ids") or [])
    masks = store.membership()
    for unit in plan_units(cfg, store):
        if unit.run in broken_runs:
            continue
        path = store.unit_path(unit.run, unit.step, unit.quantizer)
        if not path.exists():
            verdict.units[unit] = "missing"
            continue
        why = check_unit_file(path, unit, pool_ids, val_ids, masks, deep=deep)
        verdict.units[unit] = "done" if why is None else f"invalid: {why}"
    return verdict


def _check_data(store: RunStore, manifest: dict) -> list[Problem]:
    data = manifest["data"]
    problems = []
    records = {}
    for split in ("pool", "val"):
        path = store.root / "data" / f"{split}.jsonl"
        try:
            records[split] = store.read_records(split)
        except StoreError as exc:
            problems.append(
                Problem(str(path), f"data file unreadable ({exc})", "restore it from the source run directory")
            )
            continue
        ids = [r.get("sample_id") for r in records[split]]
        if f"{split}_ids" in data and ids != list(data[f"{split}_ids"]):
            problems.append(
                Problem(
                    str(path),
                    f"data: its sample ids differ from the manifest's {split}_ids",
                    "restore the original file",
                )
            )
    if not problems and "fingerprint" in data:
        try:
            actual = dataset_fingerprint(records["pool"] + records["val"])
        except (KeyError, TypeError, AttributeError):
            actual = None
        if actual != data["fingerprint"]:
            problems.append(
                Problem(
                    str(store.root / "data"),
                    "data: the records do not match the manifest's fingerprint",
                    "restore the original files",
                )
            )
    return problems


def _check_runs(store: RunStore, cfg: ExperimentConfig, *, deep: bool) -> tuple[list[Problem], set[int]]:
    """Problems of the finished runs' checkpoints, and the runs that have any."""
    problems: list[Problem] = []
    broken: set[int] = set()
    imported = store.manifest().get("imported")
    for run in range(cfg.train.runs):
        if not store.run_done(run):
            continue
        try:
            steps = store.checkpoints(run)
        except UserError as exc:
            problems.append(
                Problem(str(store.run_done_path(run)), str(exc), f"retrain run {run}: `llmaudit finetune`", run)
            )
            broken.add(run)
            continue
        if not steps:
            problems.append(
                Problem(str(store.run_dir(run)), "a finished run without checkpoints", f"retrain run {run}")
            )
            broken.add(run)
        for step in steps:
            directory = store.checkpoint_dir(run, step)
            try:
                why = check_checkpoint_dir(store, run, step, directory, deep=deep)
            except StoreError as exc:  # a record that is not data (a path for a file name, a bad digest)
                why = str(exc)
            if why:
                retrain = f"`llmaudit finetune {store.root}` retrains run {run} (its checkpoints are deterministic)"
                fix = (
                    f"restore {directory} (the imported training output) or import again"
                    if imported
                    else retrain
                    if why.startswith("checkpoint step")
                    else f"restore it from the source run directory, or delete {directory}: then {retrain}"
                )
                problems.append(Problem(str(directory), why, fix, run))
                broken.add(run)
    return problems, broken


def check_checkpoint_dir(
    store: RunStore, run: int, step: int, directory: Path, *, expected_sha256: str | None = None, deep: bool = False
) -> str | None:
    """Why a checkpoint cannot be loaded (missing, no safetensors weights, a refused pickle, a file that changed
    since it was recorded or was added since: `store.digests.check_digests`), or None when it is the one
    recorded. Configurations are re-digested on every call, weights when `deep` (loading a checkpoint for
    scoring, `llmaudit score --deep-verify`). expected_sha256: the adapter's digest, for a checkpoint the store has no record of."""
    if not directory.is_dir():
        return f"checkpoint step {step} of run {run} is missing"
    pickled = sorted(p.name for p in directory.iterdir() if PICKLED_WEIGHTS.match(p.name))
    weights = [directory / f for f in WEIGHT_FILES if (directory / f).exists()]
    if pickled and not weights:
        return f"holds only pickled weights {pickled[:3]}, which llmaudit never loads: convert them to safetensors"
    if pickled:
        return (
            f"holds pickled weights {pickled[:3]} beside its safetensors weights; llmaudit never loads a pickle (it "
            "could run code): delete them"
        )
    if not weights and not list(directory.glob("model-*-of-*.safetensors")):
        return "holds no safetensors weights (adapter_model.safetensors or model.safetensors)"
    recorded, complete = store.checkpoint_record(run, step)
    if not recorded and expected_sha256 and weights:
        recorded = {weights[0].name: expected_sha256}
    return check_digests(directory, recorded, complete=complete, deep=deep)


def legacy_coverage(store: RunStore, runs: list[int]) -> str | None:
    """The status line of checkpoints recorded by an older llmaudit (digests of their weights only), naming the
    files they leave without a digest; None when every record covers every file that changes a number."""
    uncovered: set[str] = set()
    count = 0
    for run in runs:
        for step in store.checkpoints(run):
            recorded, complete = store.checkpoint_record(run, step)
            if complete:
                continue
            count += 1
            uncovered.update(legacy_files(store.checkpoint_dir(run, step), recorded))
    if not count:
        return None
    files = ", ".join(sorted(uncovered)) or "no other file that changes a number"
    return (
        f"digests: {count} checkpoint(s) were recorded by an older llmaudit, which recorded the digests of their "
        f"weights only: {files} not covered (an edit there is not detected); they are verified as far as their "
        "record goes. A store written by this version covers every file that changes a number."
    )


def check_unit_file(
    path: Path, unit: Unit, pool_ids: list[str], val_ids: list[str], masks: np.ndarray, *, deep: bool = False
) -> str | None:
    """Why a scoring unit's parquet file is not a complete, consistent result for `unit`, or None."""
    try:
        if deep:
            frame = validate_loss_table(read_parquet_file(path), source=str(path))
        else:
            frame = read_parquet_bounded(path, what="loss table", columns=KEY_COLUMNS).to_pandas()
    except (LossTableError, pa.ArrowException, OSError, ValueError, KeyError) as exc:
        return str(exc).splitlines()[0][:300]
    want_ids = list(val_ids) + (list(pool_ids) if unit.final else [])
    if sorted(frame["sample_id"].astype(str)) != sorted(want_ids):
        return f"holds {len(frame)} samples, expected the {len(want_ids)} {'validation + pool' if unit.final else 'validation'} samples"
    if (
        set(frame["run"]) != {unit.run}
        or set(frame["checkpoint"]) != {unit.step}
        or set(frame["quantizer"]) != {unit.quantizer}
    ):
        return "its run / checkpoint / quantizer columns do not match its path"
    if not np.isfinite(frame["loss"].to_numpy(dtype=np.float64)).all():
        return "holds non-finite losses"
    split = dict(zip(frame["sample_id"].astype(str), frame["split"], strict=True))
    if any(split[s] != "val" for s in val_ids) or any(split[s] != "pool" for s in (pool_ids if unit.final else [])):
        return "its split column does not match the manifest's pool and validation ids"
    member = dict(zip(frame["sample_id"].astype(str), frame["member"].astype(bool), strict=True))
    expected = dict.fromkeys(val_ids, False)
    if unit.final:
        row = masks[unit.run] if unit.run != REFERENCE_RUN else np.zeros(len(pool_ids), bool)
        expected.update({s: bool(m) for s, m in zip(pool_ids, row, strict=True)})
    if any(member[s] != m for s, m in expected.items()):
        return "its member flags contradict the manifest's membership masks"
    return None


def quarantine(store: RunStore, path: Path) -> Path:
    """Move a failed unit file aside (scores/quarantine/..., suffix .invalid) instead of deleting it."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    rel = path.relative_to(store.scores_dir)
    target = store.scores_dir / "quarantine" / rel.parent / f"{rel.name}.{stamp}.invalid"
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    return target
