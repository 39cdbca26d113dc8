"""What a scoring unit's quantizer is given besides the checkpoint: the calibration text of a calibrated quantizer
(by its ``calibration_source``, llmaudit.quantize.calibration), and the user's own quantized model of a run's final
checkpoint (``llmaudit import --quantized``, llmaudit.quantize.given)."""

from __future__ import annotations

from typing import Any

import numpy as np

from llmaudit.common.errors import UserError
from llmaudit.data.records import record_text
from llmaudit.quantize.base import Quantizer
from llmaudit.quantize.given import GivenFile
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import Unit


def calibration_texts(inputs: Any, quantizer: Quantizer, run: int) -> list[str]:
    """The calibration text of a calibrated quantizer's unit, chosen by its calibration_source (quantize.calibration).

    Args:
        inputs (Any): the scoring inputs of the store (its records and settings).
        quantizer (Quantizer): the calibrated quantizer.
        run (int): the run whose unit is scored (the base model takes run 0's records).

    Returns:
        list[str]: the store's validation records (heldout), the run's own training records (members), or the user's
            file (file).

    Raises:
        UserError: calibration_source=file without score.calibration_file.
    """
    source = quantizer.options["calibration_source"]
    if source == "members":
        return [record_text(inputs.pool_records[i]) for i in np.flatnonzero(inputs.masks[max(run, 0)])]
    if source == "file":
        if inputs.calibration_file is None:
            raise UserError(f"{quantizer.name}: calibration_source=file needs score.calibration_file=PATH")
        return list(inputs.calibration_file[0])
    return [record_text(r) for r in inputs.store.read_records("val")]


def calibration_record(inputs: Any, quantizer: Quantizer) -> dict[str, Any] | None:
    """What a calibrated quantizer's record says about its calibration text.

    Args:
        inputs (Any): the scoring inputs of the store.
        quantizer (Quantizer): the quantizer.

    Returns:
        dict[str, Any] | None: the calibration source (and the file's sha256); None for a quantizer that does not
            calibrate.
    """
    if not quantizer.calibrated:
        return None
    source = quantizer.options["calibration_source"]
    record: dict[str, Any] = {"source": source}
    if source == "file" and inputs.calibration_file is not None:
        record.update(file=str(inputs.cfg.score.calibration_file), sha256=inputs.calibration_file[1])
    return record


def check_recorded_calibration(store: RunStore, quantizers: dict[str, Quantizer], digest: str | None) -> None:
    """Check that a quantizer that calibrated on a file in this store calibrates on the same file (its recorded sha256).

    The units of one quantizer are never calibrated on two texts.

    Args:
        store (RunStore): the run store.
        quantizers (dict[str, Quantizer]): the quantizers to score, by name.
        digest (str | None): the sha256 of score.calibration_file, None without one.

    Raises:
        UserError: a quantizer's record names another file; the message names the record and the fix.
    """
    for name, quantizer in quantizers.items():
        if not quantizer.calibrated or quantizer.options.get("calibration_source") != "file":
            continue
        recorded = store.quantizer_record(name)
        calibration = (recorded or {}).get("calibration") or {}
        expected = calibration.get("sha256")
        if expected is not None and expected != digest:
            raise UserError(
                f"{store.quantizer_info_path(name)}: {name} calibrated its units on a file of sha256 {str(expected)[:16]}..., "
                f"score.calibration_file has sha256 {str(digest)[:16]}...; fix: pass the file it calibrated on"
            )


def given_file(store: RunStore, unit: Unit) -> GivenFile | None:
    """The user's own quantized model of this unit (`llmaudit import --quantized`: a run's final checkpoint).

    Args:
        store (RunStore): the run store.
        unit (Unit): the scoring unit.

    Returns:
        GivenFile | None: the imported model of the unit, None where there is none.
    """
    imported = store.manifest().get("imported") or {}
    for record in imported.get("quantized") or []:
        given = GivenFile.from_dict(record)
        if (given.run, given.step, given.quantizer) == (unit.run, unit.step, unit.quantizer):
            return given
    return None
