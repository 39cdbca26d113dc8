"""The run store's manifest (`manifest.json`): what it holds, the digest of its defining content, and the checks
every read of it makes (`check_manifest`). `llmaudit.store.run_store.RunStore` reads and writes it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np

from llmaudit import __version__
from llmaudit.common.errors import UserError
from llmaudit.common.names import is_safe_name
from llmaudit.common.schema import parse_or_refuse
from llmaudit.config import MAX_MASK_CELLS, MAX_QUANTIZERS, MAX_RUNS, ExperimentConfig, without_runner_settings
from llmaudit.store.records import DataBlock, ImportedBlock

MANIFEST_VERSION = 4
DIGESTED_KEYS_V2 = ("identity_hash", "identity", "data", "membership", "imported", "model_source")
DIGESTED_KEYS_V3 = (*DIGESTED_KEYS_V2, "compute", "score_compute")
DIGESTED_KEYS = (*DIGESTED_KEYS_V3, "config")
"""The manifest content that defines an experiment and its numbers: its digest is checked on every read. Version 3
added the compute dtype the store trains in (`compute`, decided once when the store is created) and scores in
(`score_compute`, decided by the first `score`); version 4 the recorded settings (`config` without the runner's
settings, `config.without_runner_settings`: what is scored, attacked and judged). An older manifest is digested
over its own keys (its settings are then not covered: `status` and `report` say so)."""
REQUIRED_KEYS = ("name", "identity_hash", "identity", "config", "data", "membership")
REPAIR = "restore the run directory from its source, or recreate it with `llmaudit finetune` (or `llmaudit import`)"

BASE_LIBRARIES = (
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
)
"""The distributions whose versions every manifest records; each quantizer class adds its own
(`llmaudit.quantize.tracked_libraries`)."""


class StoreError(UserError):
    """The run store is missing, damaged, tampered with, or belongs to another experiment."""


def digested_keys(manifest: dict[str, Any]) -> tuple[str, ...]:
    """The keys a manifest's digest covers (DIGESTED_KEYS; those of its version for an older manifest)."""
    version = manifest.get("manifest_version")
    version = version if isinstance(version, int) and not isinstance(version, bool) else 2
    return DIGESTED_KEYS if version >= 4 else DIGESTED_KEYS_V3 if version == 3 else DIGESTED_KEYS_V2


def settings_covered(manifest: dict[str, Any]) -> bool:
    """Whether the manifest's digest covers its recorded settings (a version-4 manifest)."""
    return "config" in digested_keys(manifest)


SETTINGS_NOT_COVERED = (
    "digests: this manifest was written by an older llmaudit, whose digest does not cover the recorded settings "
    "(what is scored, attacked and judged: score.*, attack.*, report.*); an edit there is not detected until "
    "this version writes the manifest again (`llmaudit score RUN_DIR` does, and scores only what is missing)"
)


def content_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the manifest's defining content (`digested_keys`), canonical JSON; of the config, the settings a
    run directory decides (`config.without_runner_settings`)."""
    content = {k: manifest.get(k) for k in digested_keys(manifest)}
    if "config" in content and isinstance(content["config"], dict):
        content["config"] = without_runner_settings(content["config"])
    blob = json.dumps(content, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def library_versions() -> dict[str, str | None]:
    """The versions a new manifest records.

    Returns:
        Python's, llmaudit's, and each of `BASE_LIBRARIES` and the registered quantizers' tracked libraries
        (None where one is not installed).
    """
    from llmaudit.quantize import tracked_libraries  # imports torch: only when a store is created

    out: dict[str, str | None] = {"python": platform.python_version(), "llmaudit": __version__}
    for name in dict.fromkeys((*BASE_LIBRARIES, *tracked_libraries())):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def check_manifest(manifest: Any, path: Path) -> dict[str, Any]:
    """The manifest read from `path`, checked: a JSON object with every required key, its digest matching its content,
    safe quantizer names, and a membership block that agrees with itself (`check_membership`)."""
    if not isinstance(manifest, dict):
        raise StoreError(f"{path} is not a JSON object; {REPAIR}.")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise StoreError(f"{path} lacks the key(s) {missing}: the manifest is damaged; {REPAIR}.")
    recorded = manifest.get("content_digest")
    if recorded is not None and recorded != content_digest(manifest):
        raise StoreError(
            f"{path} was modified after llmaudit wrote it: its content digest does not match "
            f"its {'/'.join(digested_keys(manifest))} sections (an edited pool size, membership mask or data id changes "
            f"every attack). Restore the original manifest; {REPAIR}."
        )
    quantizers = manifest.get("quantizers") or []
    if not isinstance(quantizers, list) or len(quantizers) > MAX_QUANTIZERS:
        raise StoreError(f"{path}: quantizers is not a list of at most {MAX_QUANTIZERS} names; {REPAIR}.")
    bad = [q for q in quantizers if not is_safe_name(q)]
    if bad:
        raise StoreError(f"{path}: quantizer name(s) {bad[:3]} are not allowed (they would name paths); {REPAIR}.")
    parse_or_refuse(DataBlock, manifest["data"], where=str(path), fix=REPAIR, prefix="data", error=StoreError)
    check_membership(manifest, path)
    check_imported(manifest, path)
    return manifest


def check_imported(manifest: dict[str, Any], path: Path) -> None:
    """Refuse an `imported` block that does not fit its schema (`store.records.ImportedBlock`: steps whole numbers,
    paths absolute, recorded names single file names with sha256 digests) or lists another number of runs than the
    membership block."""
    if manifest.get("imported") is None:
        return
    block = parse_or_refuse(
        ImportedBlock, manifest["imported"], where=str(path), fix=REPAIR, prefix="imported", error=StoreError
    )
    runs = manifest["membership"]["runs"]
    if len(block.runs) != runs:
        raise StoreError(f"{path}: imported lists {len(block.runs)} run(s), membership.runs = {runs}; {REPAIR}.")


def check_membership(manifest: dict[str, Any], path: Path) -> None:
    """Refuse a membership block that contradicts itself or the manifest (masks, runs, pool size, counts, fpc)."""
    mem, data = manifest["membership"], manifest["data"]
    where = f"{path}: membership"
    try:
        rows = mask_rows(mem["masks"], where)
        problems = []
        if any(((row != ord("0")) & (row != ord("1"))).any() for row in rows):
            problems.append("masks hold characters other than 0 and 1")
        if len(rows) != mem["runs"]:
            problems.append(f"runs = {mem['runs']} but {len(rows)} masks")
        identity_runs = ((manifest.get("identity") or {}).get("train") or {}).get("runs")
        if identity_runs is not None and identity_runs != mem["runs"]:
            problems.append(f"runs = {mem['runs']} but the experiment's identity says train.runs = {identity_runs}")
        widths = {len(r) for r in rows}
        if widths != {mem["pool_size"]}:
            problems.append(f"pool_size = {mem['pool_size']} but the masks hold {sorted(widths)[:5]} samples")
        if "pool_ids" in data and len(data["pool_ids"]) != mem["pool_size"]:
            problems.append(f"pool_size = {mem['pool_size']} but data.pool_ids lists {len(data['pool_ids'])}")
        counts = [int((r == ord("1")).sum()) for r in rows]
        if counts != list(mem["n_train"]):
            problems.append(f"n_train = {str(mem['n_train'])[:100]} but the masks count {str(counts)[:100]}")
        if counts and mem["pool_size"] and abs(mem["fpc"] - (1 - np.mean(counts) / mem["pool_size"])) > 1e-9:
            problems.append(f"fpc = {mem['fpc']} does not equal 1 - mean(n_train) / pool_size")
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{where} is incomplete ({exc!r} missing or malformed); {REPAIR}.") from None
    if problems:
        raise StoreError(f"{where} contradicts itself: {'; '.join(problems)}; {REPAIR}.")


def new_manifest(
    cfg: ExperimentConfig,
    data: dict[str, Any],
    membership: np.ndarray,
    *,
    imported: dict[str, Any] | None,
    model_source: dict[str, Any] | None,
    compute: dict[str, Any] | None,
) -> dict[str, Any]:
    """A new store's manifest (before its digest: `RunStore.write_manifest` adds it), as JSON reads it back."""
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "name": cfg.name,
        "origin": "import" if imported else "finetune",
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
        "imported": imported,
        "model_source": model_source,
        "compute": compute,
        "score_compute": None,
        "quantizers": [],
    }
    return jsonable(manifest)


def mask_rows(masks: Any, where: str) -> list[np.ndarray]:
    """The membership masks as byte arrays ('0'/'1'), refused before any is expanded when they are not a list of
    strings or hold more runs or characters than a valid experiment can (`config.MAX_RUNS`, `MAX_MASK_CELLS`)."""
    if not isinstance(masks, list) or not all(isinstance(row, str) for row in masks):
        raise TypeError("masks must be a list of strings of 0 and 1")
    cells = sum(len(row) for row in masks)
    if len(masks) > MAX_RUNS or cells > MAX_MASK_CELLS:
        raise StoreError(
            f"{where}: {len(masks):,} masks of {cells:,} characters are more than any experiment holds (at most "
            f"{MAX_RUNS:,} runs and {MAX_MASK_CELLS:,} characters); {REPAIR}."
        )
    return [np.frombuffer(row.encode("utf-8"), dtype=np.uint8) for row in masks]


def jsonable(obj: Any) -> Any:
    """The value as JSON would read it back (tuples to lists, numpy to Python)."""
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def no_manifest(root: Path) -> StoreError:
    """The refusal of a directory that holds no manifest.json (not a run store).

    Args:
        root: the directory given as a run directory.

    Returns:
        The error to raise, naming the directory and the commands that make a run directory.
    """
    return StoreError(
        f"{root} holds no manifest.json: not an llmaudit run directory. "
        "Run `llmaudit finetune RECIPE` (or `llmaudit import`) first, or point to the directory it printed."
    )
