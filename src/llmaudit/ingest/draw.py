"""The records of `llmaudit import`: the user's training and held-out files read and mapped, checked for
overlap, and drawn into the audited pool (members and non-members) and the validation records.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmaudit.data.formats import read_user_records
from llmaudit.data.records import dataset_fingerprint, record_fingerprint, record_format
from llmaudit.ingest.checkpoints import ImportInputError

MIN_HELDOUT = 4
"""Held-out records needed: 2 for validation and 2 non-members in the pool."""

MAX_VAL = 256
"""Held-out records that go to validation (utility, r_Q's trajectory): half of them, at most this many; the rest
are the pool's non-members, which a verdict at 1% FPR needs at least 1000 of (docs/science.md section 12)."""


@dataclass(frozen=True)
class ImportData:
    """The import's records: each run's training records, the held-out ones, the audited pool and validation
    records, membership [runs, pool] and notes on what was dropped or capped."""

    train_sets: list[list[dict]]
    heldout: list[dict]
    pool: list[dict]
    val: list[dict]
    masks: np.ndarray
    notes: list[str]


def rank_key(seed: int, purpose: str, sample_id: str) -> str:
    """A deterministic pseudo-random sort key of a sample (independent of file order)."""
    return hashlib.sha256(f"{seed}:{purpose}:{sample_id}".encode()).hexdigest()


def read_import_data(
    files: list[Path],
    heldout_path: Path,
    record_format_option: str,
    max_train: int | None,
    max_heldout: int | None,
    seed: int,
) -> ImportData:
    """The import's records (`ImportData`): every file read once and mapped, no record both trained on and held
    out (`check_overlap`), the pool/val split (`draw_pool`)."""
    per_file: dict[Path, tuple[list[dict], int]] = {}
    for path in dict.fromkeys([*files, heldout_path]):
        per_file[path] = read_user_records(path, record_format=record_format_option)
    train_sets = [per_file[f][0] for f in files]
    heldout = per_file[heldout_path][0]
    check_overlap(train_sets, files, heldout, heldout_path)
    pool, val, masks, data_notes = draw_pool(train_sets, heldout, max_train, max_heldout, seed)
    duplicates = {str(p): n for p, (_, n) in per_file.items() if n}
    if duplicates:
        data_notes.append(f"duplicate rows dropped (same content, same sample id): {duplicates}")
    return ImportData(train_sets, heldout, pool, val, masks, data_notes)


def check_overlap(train_sets: list[list[dict]], files: list[Path], heldout: list[dict], heldout_path: Path) -> None:
    """A record in a training file and in the held-out file would be a member and a non-member at once."""
    trained: dict[str, str] = {}
    trained_ids: dict[str, str] = {}
    for records in train_sets:
        for rec in records:
            trained.setdefault(record_fingerprint(rec), rec["sample_id"])
            trained_ids.setdefault(rec["sample_id"], record_fingerprint(rec))
    both = [rec["sample_id"] for rec in heldout if record_fingerprint(rec) in trained]
    if both:
        names = ", ".join(str(f) for f in dict.fromkeys(files))
        raise ImportInputError(
            f"{len(both)} record(s) of the held-out file {heldout_path} are also in the training file(s) {names} "
            f"(same content): {both[:5]}{' ...' if len(both) > 5 else ''}. A member cannot be a non-member: "
            "remove them from the held-out file (or pass a held-out file the model never trained on)."
        )
    clash = [r["sample_id"] for r in heldout if r["sample_id"] in trained_ids]
    if clash:
        raise ImportInputError(
            f"sample id(s) {clash[:5]} of the held-out file {heldout_path} name other records in the training "
            "file(s); sample ids must be unique across the files (drop the sample_id field to use content ids)."
        )


def draw_pool(
    train_sets: list[list[dict]], heldout: list[dict], max_train: int | None, max_heldout: int | None, seed: int
) -> tuple[list[dict], list[dict], np.ndarray, list[str]]:
    """(pool, val, membership [runs, pool], notes): the deterministic pool/val split of the records."""
    notes: list[str] = []
    union: dict[str, dict] = {}
    for records in train_sets:
        for rec in records:
            union.setdefault(rec["sample_id"], rec)
    train = list(union.values())
    if max_train is not None and len(train) > max_train:
        train = sorted(train, key=lambda r: rank_key(seed, "train", r["sample_id"]))[:max_train]
        notes.append(f"--max-train {max_train}: {max_train} of {len(union)} training records audited")
    held = list(heldout)
    if max_heldout is not None and len(held) > max_heldout:
        held = sorted(held, key=lambda r: rank_key(seed, "heldout", r["sample_id"]))[:max_heldout]
        notes.append(f"--max-heldout {max_heldout}: {max_heldout} of {len(heldout)} held-out records used")
    if len(held) < MIN_HELDOUT:
        raise ImportInputError(
            f"the held-out file has {len(held)} usable record(s); at least {MIN_HELDOUT} are needed "
            "(half are non-members in the pool, half validation samples)."
        )
    held = sorted(held, key=lambda r: rank_key(seed, "split", r["sample_id"]))
    n_pool = len(held) - min(len(held) - len(held) // 2, MAX_VAL)  # a plain half up to 2 * MAX_VAL records
    pool = sorted(train + held[:n_pool], key=lambda r: rank_key(seed, "pool", r["sample_id"]))
    val = held[n_pool:]
    member_fps = [{record_fingerprint(r) for r in records} for records in train_sets]
    pool_fps = [record_fingerprint(r) for r in pool]
    masks = np.array([[fp in fps for fp in pool_fps] for fps in member_fps], dtype=bool)
    empty = [r for r, row in enumerate(masks) if not row.any()]
    if empty:
        raise ImportInputError(
            f"run(s) {empty} have no training record in the audited pool (--max-train {max_train} drew none of "
            "them); raise --max-train."
        )
    return pool, val, masks, notes


def data_block(data: ImportData, files: list[Path], heldout_path: Path, fmt: str, seed: int) -> dict[str, Any]:
    """The manifest's data section of an import."""
    train_sets, heldout, pool, val = data.train_sets, data.heldout, data.pool, data.val
    n_train_distinct = len({r["sample_id"] for records in train_sets for r in records})
    return {
        "route": "import",
        "source": "local",
        "path": str(files[0]),
        "hub_id": None,
        "tasks": sorted({r["task"] for r in pool + val}),
        "train_files": [str(f) for f in files],
        "heldout_file": str(heldout_path),
        "record_format": fmt,
        "formats": sorted({record_format(r) for r in pool + val}),
        "n_available": n_train_distinct + len(heldout),
        "n_usable": len(pool) + len(val),
        "n_train_records": [len(records) for records in train_sets],
        "n_heldout_records": len(heldout),
        "seed": seed,
        "fingerprint": dataset_fingerprint(pool + val),
        "pool_ids": [r["sample_id"] for r in pool],
        "val_ids": [r["sample_id"] for r in val],
    }
