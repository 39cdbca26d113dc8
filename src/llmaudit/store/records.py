"""The schemas of what a store records besides its loss tables: the manifest's `imported` block (an imported
fine-tune's checkpoints and the user's own quantized models), a finished run's DONE.json, the RUNNING markers and a
quantizer's record (`QuantizerRecord`). Each is parsed once where it is read (`common.schema.parse_or_refuse`): a field of the wrong
kind or out of its bounds is refused in one line naming the file and the field, exit code 2.

Paths a record names hold no control character (a quantized model's are absolute); the names of the files recorded in a checkpoint
or a quantized model's directory are single path components (never a path: a record cannot send a read outside
the directory it names), with a sha256 digest each.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StrictInt, model_validator

from llmaudit.common.names import is_safe_name
from llmaudit.common.safe_text import has_controls
from llmaudit.common.schema import Record, Sha256, ShortText, Step
from llmaudit.config import MAX_POOL, MAX_QUANTIZERS, MAX_RUNS

MAX_CHECKPOINTS = 10_000
"""Checkpoints a run may record (config.TrainConfig: at most 10,000 per run)."""
MAX_PID = 2**31 - 1
"""The largest process id a marker may name (Linux: pid_max is at most 2^22)."""
GIVEN_WEIGHTS = (".safetensors",)
GIVEN_FILE_SUFFIXES = (".json", ".safetensors", ".gguf")
"""What a user's quantized model is recorded with: configurations, safetensors weights, or the .gguf file."""


def _recorded_path(value: str) -> str:
    if not value or has_controls(value) or "\x00" in value:
        raise ValueError("must be a path without control characters")
    return value


def _absolute_path(value: str) -> str:
    if not os.path.isabs(_recorded_path(value)) or ".." in PurePosixPath(value).parts:
        raise ValueError("must be an absolute path without '..'")
    return value


def _file_name(value: str) -> str:
    if not is_safe_name(value):
        raise ValueError("must be a file name (letters, digits and . _ + -), never a path")
    return value


AbsolutePath = Annotated[str, Field(max_length=4096), AfterValidator(_absolute_path)]
RecordedPath = Annotated[str, Field(max_length=4096), AfterValidator(_recorded_path)]
"""Where an imported checkpoint is: as `llmaudit import` recorded it (absolute since this version; a store imported
earlier may hold a path relative to where the command runs)."""
FileName = Annotated[str, AfterValidator(_file_name)]
QuantizerName = Annotated[str, AfterValidator(_file_name)]
RunIndex = Annotated[int, Field(strict=True, ge=0, lt=MAX_RUNS)]


class ImportedCheckpoint(Record):
    """An imported run's checkpoint: its step, where it is, and the digests of its files (`store.digests`)."""

    step: Step
    path: RecordedPath
    format: ShortText | None = None
    files: dict[FileName, Sha256] = Field(default_factory=dict, max_length=10_000)
    digest_scope: ShortText | None = None


class ImportedRun(Record):
    """One imported fine-tuning run: its checkpoints in trajectory order (steps unique)."""

    checkpoints: list[ImportedCheckpoint] = Field(min_length=1, max_length=MAX_CHECKPOINTS)
    source: ShortText | None = None
    train_file: ShortText | None = None
    train_sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _unique_steps(self) -> ImportedRun:
        steps = [c.step for c in self.checkpoints]
        if len(set(steps)) != len(steps):
            raise ValueError(f"checkpoint steps repeat: {sorted(steps)[:10]}")
        return self


class GivenRecord(Record):
    """A user's quantized model of a run's final checkpoint (`quantize.given.GivenFile`): a .gguf file, or a
    checkpoint directory recorded by its configurations and safetensors weights (never a pickle)."""

    run: RunIndex
    step: Step
    quantizer: QuantizerName
    path: AbsolutePath
    kind: Literal["gguf", "checkpoint"]
    files: dict[FileName, Sha256] = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _files_fit_the_kind(self) -> GivenRecord:
        names = list(self.files)
        if self.kind == "gguf":
            name = PurePosixPath(self.path).name
            if not name.endswith(".gguf") or names != [name]:
                raise ValueError(f"a gguf record names one .gguf file, its path's ({name!r}); it names {names[:3]}")
            return self
        odd = [n for n in names if not n.endswith(GIVEN_FILE_SUFFIXES[:2])]
        if odd:
            raise ValueError(f"a checkpoint record names .json and .safetensors files only, not {odd[:3]}")
        if not any(n.endswith(GIVEN_WEIGHTS) for n in names):
            raise ValueError("a checkpoint record names its safetensors weights")
        return self


class ImportedBlock(Record):
    """The manifest's `imported` block: the runs' checkpoints and the user's quantized models."""

    runs: list[ImportedRun] = Field(min_length=1, max_length=MAX_RUNS)
    quantized: list[GivenRecord] = Field(default_factory=list, max_length=MAX_RUNS * MAX_QUANTIZERS)
    heldout_file: ShortText | None = None
    heldout_sha256: Sha256 | None = None

    @model_validator(mode="after")
    def _given_for_recorded_checkpoints(self) -> ImportedBlock:
        seen = set()
        for given in self.quantized:
            if given.run >= len(self.runs) or given.step not in {c.step for c in self.runs[given.run].checkpoints}:
                raise ValueError(f"quantized {given.quantizer}: run {given.run} step {given.step} is not imported")
            key = (given.run, given.step, given.quantizer)
            if key in seen:
                raise ValueError(f"quantized {given.quantizer}: run {given.run} step {given.step} is given twice")
            seen.add(key)
        return self


class DoneRecord(Record):
    """A finished run's DONE.json: its trajectory's steps and the digests of its checkpoints' files."""

    steps: list[Step] = Field(max_length=MAX_CHECKPOINTS)
    adapter_sha256: list[Sha256 | None] | None = Field(default=None, max_length=MAX_CHECKPOINTS)
    checkpoint_files: list[dict[ShortText, Any] | None] | None = Field(default=None, max_length=MAX_CHECKPOINTS)
    digest_scope: ShortText | None = None

    @model_validator(mode="after")
    def _unique_steps(self) -> DoneRecord:
        if len(set(self.steps)) != len(self.steps):
            raise ValueError(f"steps repeat: {sorted(self.steps)[:10]}")
        return self


class DataBlock(Record):
    """The manifest's `data` block: the audited samples' ids (pool and validation) and their fingerprint."""

    pool_ids: list[Annotated[str, Field(max_length=1000)]] | None = Field(default=None, max_length=MAX_POOL)
    val_ids: list[Annotated[str, Field(max_length=1000)]] | None = Field(default=None, max_length=MAX_POOL)
    fingerprint: ShortText | None = None


class QuantizerRecord(Record):
    """A quantizer's record (scores/quantizers/NAME.json): its options, bits and size, and its calibration text."""

    name: QuantizerName | None = None
    family: ShortText | None = None
    bits: Annotated[float, Field(ge=0, le=64)] | None = None
    effective_bits: Annotated[float, Field(ge=0, le=64)] | None = None
    model_size_bytes: Annotated[int, Field(strict=True, ge=0, le=2**50)] | None = None
    options: dict[ShortText, Any] = Field(default_factory=dict, max_length=256)
    calibration: dict[ShortText, Any] | None = None


class Marker(Record):
    """A RUNNING marker (`store.markers`): the host and process of the job working on a unit or run."""

    host: Annotated[str, Field(max_length=255)]
    pid: Annotated[StrictInt, Field(ge=1, le=MAX_PID)]
    started: ShortText | None = None
    job_id: ShortText | None = None
