"""The llama.cpp scoring engine (``score.engine: llama.cpp``): a GGUF quantizer's unit scored from the logits llama.cpp
computes with the quantized file itself, the file a llama.cpp user runs (docs/science.md section 3, "Two scoring
engines").

Per unit: llmaudit's own GGUF quantizer writes the checkpoint as a runnable GGUF and quantizes it with
``llama_model_quantize`` (``GGUFQuantizer.quantize_to_file``, the same bytes the torch engine dequantizes); a user's
own ``.gguf`` (``llmaudit import --quantized``) is checked against the checkpoint as for the torch engine and used as
it is. llama.cpp evaluates the unit's samples, the same token ids under the same chat template the torch engine
scores (llama.cpp never tokenizes them), and returns the logits at every scored position; from them the loss
table's columns are computed by the torch engine's own head formulas (``bounded_head_scores``: per-token NLL, top-1
flags, the vocabulary mean and standard deviation of log p that Min-K%++ reads; zlib bytes come from the text as
always). At a run's final checkpoint the KL and same-top columns compare llama.cpp's logits with the unquantized
checkpoint's (torch, the reference as for every quantizer), and the greedy answers are llama.cpp's own greedy
continuations. The reference quantizer (fp32) stays torch's: the paired comparison is llama.cpp's quantized model
against torch's full precision. The unit file records ``llmaudit.engine = llama.cpp`` in its parquet metadata.
"""

from __future__ import annotations

import copy
import hashlib
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from llmaudit.quantize.base import Quantizer
from llmaudit.quantize.gguf_runtime import MAX_SEQUENCES, LlamaCppModel
from llmaudit.quantize.given import GivenFile, load_given
from llmaudit.score.calibration import calibration_record, calibration_texts, given_file
from llmaudit.score.engine import HEAD_LOGITS_BYTES, TokenScores, bounded_head_scores, length_sorted_batches
from llmaudit.score.unit_scoring import (
    CheckpointWork,
    ScoreInputs,
    ScoringError,
    _engine,
    _record_quantizer,
    token_budget,
    unit_examples,
    unit_rows,
)
from llmaudit.score.utility import UtilityWork, nonfinite_divergence
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.units import Unit

ENGINE_METADATA_KEY = b"llmaudit.engine"
"""Parquet schema metadata of every unit file: the engine that computed its losses (torch or llama.cpp)."""
TORCH, LLAMA_CPP = "torch", "llama.cpp"


def engine_of(quantizer: Quantizer) -> str:
    """The engine that scores a quantizer's units: its ``engine`` option (GGUF quantizers), else torch.

    Args:
        quantizer (Quantizer): the quantizer.

    Returns:
        str: the engine's name.
    """
    return str(quantizer.options.get("engine", TORCH))


def engine_metadata(quantizer: Quantizer) -> dict[bytes, bytes]:
    """The parquet metadata that records which engine scored a unit file.

    Args:
        quantizer (Quantizer): the unit's quantizer.

    Returns:
        dict[bytes, bytes]: {ENGINE_METADATA_KEY: the engine's name}.
    """
    return {ENGINE_METADATA_KEY: engine_of(quantizer).encode()}


def _groups(lengths: Sequence[int], counts: Sequence[int], budget: int, vocab: int) -> list[list[int]]:
    """Examples grouped for the hook and the logits held at once: length-sorted, at most `budget` padded tokens,
    MAX_SEQUENCES examples and HEAD_LOGITS_BYTES of float32 logits (a longer example goes alone). Each example is
    still evaluated in a llama_decode call of its own (see EngineModel)."""
    groups = []
    for batch in length_sorted_batches(lengths, budget):
        current: list[int] = []
        for i in batch:
            logits = 4 * vocab * (sum(counts[j] for j in current) + counts[i])
            if current and (len(current) >= MAX_SEQUENCES or logits > HEAD_LOGITS_BYTES):
                groups.append(current)
                current = []
            current.append(i)
        groups.append(current)
    return groups


def _token_scores(logits: torch.Tensor, targets: torch.Tensor, vocab_stats: bool) -> TokenScores:
    nll, mean, std, top = bounded_head_scores(torch.nn.Identity(), logits, targets, vocab_stats=vocab_stats)
    nll_np = np.maximum(nll.numpy(), 0.0)  # the rounding of logsumexp - logit, never a real value (engine.py)
    return TokenScores(
        nll_np.astype(np.float32),
        None if mean is None else mean.numpy().astype(np.float32),
        None if std is None else std.numpy().astype(np.float32),
        (top == targets).numpy(),
    )


class EngineModel:
    """A unit's model for llama.cpp scoring: what the stage hands the engine, the utility's divergence (whose
    hook receives logits, so the quantized side's head is the identity) and its generation.

    Every example is evaluated alone (one llama_decode call, llama.cpp's physical batches of 512 tokens): llama.cpp
    picks its matrix kernels by the rows of each physical batch, so samples evaluated side by side can differ from
    the same samples evaluated alone in the last bits, which a peaked model carries through its layers. Alone, a
    sample's scores never depend on the other samples of its unit, and equal what llama.cpp gives for that sample by
    itself."""

    logits_head = torch.nn.Identity()

    def __init__(self, runtime: LlamaCppModel, *, vocab_stats: bool, budget: int, device: torch.device):
        self.runtime, self.vocab_stats, self.budget, self.device = runtime, vocab_stats, budget, device

    def score(
        self, examples: Sequence[tuple[Sequence[int], Sequence[bool]]], hook: Callable | None = None
    ) -> list[TokenScores]:
        """Scores of each (input_ids, loss_mask) example, in input order.

        Args:
            examples (Sequence[tuple[Sequence[int], Sequence[bool]]]): (input_ids, loss_mask) per example.
            hook (Callable | None): hook(batch, logits, targets) sees each decode group's logits at its scored positions
                (on the scoring device), as the torch engine's hidden_hook sees hidden states.

        Returns:
            list[TokenScores]: one per example.
        """
        counts = [int(sum(bool(m) for m in mask[1:])) for _, mask in examples]
        out: list[TokenScores | None] = [None] * len(examples)
        for group in _groups([len(ids) for ids, _ in examples], counts, self.budget, self.runtime.n_vocab):
            ids = [list(examples[i][0]) for i in group]
            wanted = [[bool(m) for m in examples[i][1][1:]] + [False] for i in group]
            rows = self.runtime.logits(ids, wanted, per_call=1)
            targets = [torch.as_tensor(np.asarray(t)[1:][np.asarray(w[:-1], bool)], dtype=torch.long)
                       for t, w in zip(ids, wanted)]  # fmt: skip
            if hook is not None:
                hook(group, torch.from_numpy(np.concatenate(rows)).to(self.device), torch.cat(targets).to(self.device))
            for i, logits, target in zip(group, rows, targets):
                out[i] = _token_scores(torch.from_numpy(logits), target, self.vocab_stats)
        return out  # type: ignore[return-value]

    def greedy_answers(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stop_ids: Sequence[int]):
        """llama.cpp's greedy continuations of the prompts (llmaudit.score.generate's rules).

        Args:
            prompts (Sequence[Sequence[int]]): the prompts' token ids.
            max_new_tokens (int): the most tokens generated per prompt.
            stop_ids (Sequence[int]): tokens that end a generation.

        Returns:
            list[list[int]]: the new tokens of each prompt, up to and including the first stop token.
        """
        return self.runtime.greedy(prompts, max_new_tokens=max_new_tokens, stop_ids=stop_ids)


def _dispatch(inputs: ScoreInputs, model: Any, examples: list, hook: Any = None) -> list[TokenScores]:
    """The stage's engine call for either kind of model: llama.cpp's, or the torch engine for a torch model (the
    reference pass of the utility columns)."""
    if isinstance(model, EngineModel):
        return model.score([(e.input_ids, e.loss_mask) for e in examples], hook)
    return _engine(inputs, model, examples, hook)


def _unit_scores(inputs: ScoreInputs, unit: Unit, work: CheckpointWork, model: EngineModel):
    """The unit's scores (validation, then the pool at a final checkpoint) with the utility columns where they
    apply (unit_scoring._unit_scores' order and passes)."""

    def engine(m: Any, examples: list, hook: Any = None) -> list[TokenScores]:
        return _dispatch(inputs, m, examples, hook)

    if not inputs.utility.applies(unit):
        return engine(model, unit_examples(inputs.val, inputs.pool, unit)), None, None
    reference = work.reference(inputs.dtype)
    scores, extra, uwork = inputs.utility.score_val(unit, reference, model, engine, inputs.device)
    scores += engine(model, inputs.pool) if unit.final else []
    return scores, extra, uwork


def gguf_file(inputs: ScoreInputs, quantizer: Any, work: CheckpointWork, unit: Unit, given: GivenFile | None,
              directory: Path) -> Path:  # fmt: skip
    """The unit's quantized GGUF file.

    Args:
        inputs (ScoreInputs): the store's scoring inputs.
        quantizer (Any): the GGUF quantizer.
        work (CheckpointWork): the unit's checkpoint, loaded.
        unit (Unit): the scoring unit.
        given (GivenFile | None): the user's own quantized file of the unit, if any.
        directory (Path): where llama.cpp writes the file it quantizes.

    Returns:
        Path: the user's own file (checked against the checkpoint first), or the checkpoint quantized by llama.cpp into
            `directory` (an importance matrix computed first for an -imatrix quantizer).
    """
    if given is not None:
        load_given(given, copy.deepcopy(work.model), torch.device("cpu"))  # the same refusals as the torch engine
        return Path(given.path)
    imatrix = None
    if quantizer.calibrated:
        texts = calibration_texts(inputs, quantizer, unit.run)
        imatrix = quantizer.importance_matrix(work.model, tokenizer=inputs.tok, calibration_texts=texts)
    return quantizer.quantize_to_file(work.model, directory / f"{quantizer.name}.gguf", imatrix)


def file_digest16(path: Path) -> str:
    """The first 16 hex digits of the file's sha1: the unit's point_id (equal files, the same quantized point).

    Args:
        path (Path): the file.

    Returns:
        str: 16 hex digits.
    """
    h = hashlib.sha1()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def _check_finite(unit: Unit, examples: list, scores: list[TokenScores], extra: dict | None) -> None:
    where = f"unit run={unit.run} step={unit.step} quantizer={unit.quantizer} (llama.cpp engine)"
    bad = [e.sample_id for e, s in zip(examples, scores, strict=True) if not np.isfinite(s.token_losses).all()]
    if bad:
        raise ScoringError(f"{where}: non-finite losses on {len(bad)} sample(s) (e.g. {bad[:3]}): the quantized "
                           "model diverges. Remove this quantizer from score.quantizers, or score it with "
                           "score.engine=torch; the units scored so far are kept.")  # fmt: skip
    if extra is not None and nonfinite_divergence(extra):
        raise ScoringError(f"{where}: non-finite KL divergence on {nonfinite_divergence(extra)} validation "
                           "sample(s). Remove this quantizer from score.quantizers, or set score.divergence=false; "
                           "the units scored so far are kept.")  # fmt: skip


def score_unit(inputs: ScoreInputs, unit: Unit, work: CheckpointWork) -> tuple[pd.DataFrame, UtilityWork | None]:
    """The loss table of one GGUF unit scored by llama.cpp (module docstring).

    Args:
        inputs (ScoreInputs): the store's scoring inputs.
        unit (Unit): the scoring unit.
        work (CheckpointWork): the unit's checkpoint, loaded.

    Returns:
        tuple[pd.DataFrame, UtilityWork | None]: the loss table (the same columns, rows and checks as
            unit_scoring.score_unit's, point_id the quantized file's digest) and the utility work of a final unit.
    """
    quantizer = inputs.quantizers[unit.quantizer]
    given = given_file(inputs.store, unit)
    examples = unit_examples(inputs.val, inputs.pool, unit)
    with tempfile.TemporaryDirectory(prefix="llmaudit-llamacpp-") as tmp:
        path = gguf_file(inputs, quantizer, work, unit, given, Path(tmp))
        if given is None:
            _record_quantizer(inputs.store, quantizer, work.model, calibration_record(inputs, quantizer))
        with LlamaCppModel(path, threads=max(1, torch.get_num_threads())) as runtime:
            model = EngineModel(runtime, vocab_stats=inputs.cfg.score.vocab_stats,
                                budget=token_budget(inputs.cfg, torch.device("cpu")), device=inputs.device)  # fmt: skip
            scores, extra, uwork = _unit_scores(inputs, unit, work, model)
        point_id = file_digest16(path)
    _check_finite(unit, examples, scores, extra)
    members = (
        set()
        if unit.run == REFERENCE_RUN
        else {inputs.pool[i].sample_id for i in np.flatnonzero(inputs.masks[unit.run])}
    )
    return unit_rows(unit, examples, scores, members, point_id, extra), uwork
