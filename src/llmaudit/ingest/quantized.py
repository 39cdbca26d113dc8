"""`llmaudit import --quantized NAME=PATH`: the quantized models a user already made of their fine-tune, per
quantizer, scored as given in place of llmaudit's own quantization of each run's final checkpoint
(llmaudit.quantize.given says what each family takes).

``NAME`` is a quantizer of the registry (`llmaudit quantizers`), ``PATH`` its model of a run's final checkpoint: a
``.gguf`` for gguf-*, a checkpoint directory for gptq-*, awq-4 and bnb-*. With several runs, repeat ``--quantized
NAME=PATH`` once per run, in run order. The other checkpoints of the trajectory (r_Q's validation units) are quantized
by llmaudit's own quantizer of that name, and the quantizer's record says which units are the user's.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from llmaudit.common.bounded import magic_problem
from llmaudit.config import ExperimentConfig
from llmaudit.ingest.checkpoints import ImportInputError, TrainingOutput
from llmaudit.models.loading import load_base_model, load_checkpoint_model
from llmaudit.quantize import FULL_PRECISION_NAMES, QUANTIZER_NAMES, QuantizationError
from llmaudit.quantize.given import GivenFile, describe, load_given, pickled_files


def parse_quantized(specs: Sequence[str], n_runs: int) -> list[tuple[int, str, Path]]:
    """[(run, quantizer, path)] of the ``--quantized NAME=PATH`` options; ImportInputError naming the option and the
    fix before anything is loaded."""
    per_name: dict[str, list[Path]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not path.strip():
            raise ImportInputError(f"--quantized {spec!r}: write NAME=PATH (e.g. gguf-q4_k_m=my-model.Q4_K_M.gguf)")
        if name not in QUANTIZER_NAMES or name in FULL_PRECISION_NAMES:
            raise ImportInputError(
                f"--quantized {spec!r}: {name!r} is not a quantizer (`llmaudit quantizers` lists them)"
            )
        file = Path(path.strip()).expanduser()
        if not file.exists():
            raise ImportInputError(f"--quantized {spec!r}: {file} does not exist")
        _check_given_path(spec, name, file)
        per_name.setdefault(name, []).append(file)
    out = []
    for name, paths in per_name.items():
        if len(paths) != n_runs:
            raise ImportInputError(
                f"--quantized {name}=... is given {len(paths)} time(s) for {n_runs} run(s); fix: give it once per run, "
                "in run order"
            )
        out += [(run, name, path) for run, path in enumerate(paths)]
    return out


def _check_given_path(spec: str, name: str, file: Path) -> None:
    """Before any model is loaded: a gguf-* quantizer's file is a GGUF file (not a Git LFS pointer), another
    quantizer's a checkpoint directory with config.json and no pickled weights."""
    if name.startswith("gguf-"):
        if not (file.is_file() and file.suffix == ".gguf"):
            raise ImportInputError(f"--quantized {spec!r}: a gguf-* quantizer takes a .gguf file")
        why = magic_problem(file, b"GGUF", "GGUF")
        if why:
            raise ImportInputError(f"--quantized {spec!r}: {file} {why}")
        return
    if not (file / "config.json").is_file():
        raise ImportInputError(f"--quantized {spec!r}: a checkpoint directory with config.json is needed for {name}")
    pickled = pickled_files(file)
    if pickled:
        raise ImportInputError(
            f"--quantized {spec!r}: {file} holds pickled {pickled[:3]}, which llmaudit never loads (it could run "
            "code); fix: save the quantized model with safe_serialization=True into a directory without them"
        )


def check_quantized(
    cfg: ExperimentConfig, runs: list[TrainingOutput], specs: list[tuple[int, str, Path]], echo: Callable[[str], Any]
) -> list[GivenFile]:
    """Every given model digested and loaded once against its run's final checkpoint (shapes, architecture, and a
    quantization of THAT checkpoint): the records for the manifest."""
    if not specs:
        return []
    device = torch.device("cpu")
    base = load_base_model(cfg.model, device, dtype=torch.float32)
    given = []
    for run, name, path in specs:
        final = runs[run].checkpoints[-1]
        echo(f"[import] checking {path} as {name} of run {run} (step {final.step}) ...")
        try:
            record = describe(run, final.step, name, path)
            checkpoint = load_checkpoint_model(base, final.path, device)
            load_given(record, copy.deepcopy(checkpoint), device)
        except QuantizationError as exc:
            raise ImportInputError(str(exc)) from None
        del checkpoint
        gc.collect()
        given.append(record)
    return given


def with_quantizers(cfg: ExperimentConfig, given: list[GivenFile]) -> ExperimentConfig:
    """``cfg`` with every quantizer a file was given for among score.quantizers."""
    names = list(dict.fromkeys([*cfg.score.quantizers, *(g.quantizer for g in given)]))
    return cfg.model_copy(update={"score": cfg.score.model_copy(update={"quantizers": names})})
