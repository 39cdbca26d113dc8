"""`llmaudit import` end to end: the run store from the user's training outputs (`llmaudit.ingest`), then
the blind baseline on its pool (`llmaudit.analyze.blind`), printed and kept in results/blind_baseline.json."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmaudit.analyze.attacks.registry import registered_attacks
from llmaudit.analyze.blind import blind_baseline_for_pool
from llmaudit.common.io import atomic_write_json, read_json
from llmaudit.ingest.build import ImportRequest, ImportResult, describe_import, import_training
from llmaudit.planning.sizing import sizing_report


def run_import(
    request: ImportRequest | Sequence[str | Path], *, echo: Callable[[str], Any] = print, **options: Any
) -> ImportResult:
    """`import_training(request)`, then what its records can decide and the blind baseline, reporting each step.

    Args:
        request: an `ImportRequest`, or (the command line's call) the training directories, with the request's
            other fields as keywords (`options`).
        echo: where the lines go.
        **options: the `ImportRequest` fields besides `training_dirs`, when `request` is a list of directories.

    Returns:
        The import's result (its store, config and sizes).

    Raises:
        UserError: an input is refused (named, with its fix), before the store is written.
    """
    if not isinstance(request, ImportRequest):
        request = ImportRequest(training_dirs=list(request), **options)
    if request.attack_names is None:
        request = dataclasses.replace(request, attack_names=registered_attacks())
    seed = request.seed
    result = import_training(request, echo=echo)
    store = result.store
    for line in describe_import(result):
        echo(f"[import] {line}")
    reach, lines = sizing_report(result.cfg, store, unit="held-out record")
    heldout = reach.design.nonmembers + result.val_size
    lines.insert(1, f"{reach.design.nonmembers} of the {heldout} held-out records are the non-members the attacks see "
                 f"(the other {result.val_size} measure utility)")  # fmt: skip
    for line in lines:  # before any model is scored: what these records can decide
        echo(f"[import] sizing: {line}")
    if not reach.verdict_reachable:
        echo("[import] WARNING: no release verdict is within reach of these records; add held-out records first")
    elif not reach.pass_reachable:
        echo("[import] WARNING: a PASS is out of reach of these records (a FAIL is not); add held-out records for one")
    path = store.results_dir / "blind_baseline.json"
    if result.created or not path.exists():
        echo("[import] blind baseline (text-only classifier of members vs non-members, no model) ...")
        blind = blind_baseline_for_pool(store.read_records("pool"), store.membership(), seed=seed)
        atomic_write_json(path, blind)
    else:
        blind = read_json(path, what="blind baseline")
    for entry in blind["per_run"]:
        if entry["auroc"] is None:
            echo(f"[import] blind baseline, run {entry['run']}: not measured ({entry['reason']})")
        else:
            echo(
                f"[import] blind baseline, run {entry['run']}: AUROC {entry['auroc']:.3f} "
                f"[{entry['ci_low']:.3f}, {entry['ci_high']:.3f}] ({entry['n_in']} members vs {entry['n_out']} "
                f"non-members, {entry['folds']}-fold)"
            )
    if blind.get("warning"):
        echo(f"[import] WARNING: {blind['warning']}")
    echo(f"[import] wrote {store.root}; next: `llmaudit score {store.root}` then `llmaudit report {store.root}`")
    return result
