"""The utility columns of a run's final scoring units: per-token divergence from the unquantized checkpoint
(`token_kl`, `token_same_top`, llmaudit.score.divergence) and greedy answers on a held-out subset (`generated`,
llmaudit.score.generate), added to the validation rows of every final unit of a fine-tuning run.

The reference is the unquantized model of the SAME checkpoint (the LoRA adapter merged, before any quantizer).
Its final hidden states at the validation set's scored positions are computed once per checkpoint and process and
kept in memory (one checkpoint at a time: hidden x scored validation tokens in the model's dtype): captured for
free while the identity quantizer (fp32 of an fp32 checkpoint) scores its unit, otherwise by one extra validation
pass of the unquantized model. Each quantized unit then compares its own hidden states with them batch by batch,
in the same engine pass that computes its losses, so the divergence costs two vocabulary passes over the validation
positions and no extra forward pass of the quantized model.

Each such unit file records the settings its utility columns were made with (`settings_of`) in its parquet
metadata; `llmaudit score --refresh-utility` rescores the final units whose settings differ from the recipe's
(or that recorded none), and the report refuses to compare units made with different settings.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import Example
from llmaudit.models.layers import decoder_and_head
from llmaudit.score.divergence import (
    DivergenceCollector,
    ReferenceStates,
    TokenDivergence,
    identical_divergence,
    scored_counts,
)
from llmaudit.score.engine import TokenScores
from llmaudit.score.generate import GenerationPlan, decode_answers, greedy_generate, plan_generation, stop_token_ids
from llmaudit.store.losstable import REFERENCE_RUN, UTILITY_METADATA_KEY, unit_metadata
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import Unit

Engine = Callable[[Any, list[Example], Any], list[TokenScores]]
"""score_examples of the stage's settings: (model, examples, hidden_hook or None) -> scores in input order."""


@dataclass
class UtilityWork:
    """What a unit did beyond scoring its samples (fields of its work-log record)."""

    reference_tokens: int = 0
    """Tokens of an extra validation pass of the unquantized checkpoint (0 when its states were in memory)."""
    divergence_positions: int = 0
    """Positions compared with the reference (two vocabulary passes each)."""
    generation_prompt_tokens: int = 0
    generated_tokens: int = 0


def settings_of(cfg: ExperimentConfig, plan: GenerationPlan | None, val_records: Sequence[dict]) -> dict[str, Any]:
    """The utility settings a recipe asks for (what a unit file records and the report compares).

    Args:
        cfg (ExperimentConfig): the experiment's configuration.
        plan (GenerationPlan | None): the generation plan, None without generations.
        val_records (Sequence[dict]): the validation records.

    Returns:
        dict[str, Any]: the settings, as JSON data.
    """
    return {
        "divergence": bool(cfg.score.divergence),
        "generation": None if plan is None else plan.settings(val_records),
    }


def encode_settings(settings: dict[str, Any]) -> bytes:
    """The settings as a unit file's parquet metadata value.

    Args:
        settings (dict[str, Any]): what `settings_of` gives.

    Returns:
        bytes: canonical JSON (sorted keys).
    """
    return json.dumps(settings, sort_keys=True).encode()


def recorded_settings(path: str | Path) -> dict[str, Any] | None:
    """The utility settings a unit file recorded.

    Args:
        path (str | Path): the unit file.

    Returns:
        dict[str, Any] | None: the settings; None without utility columns, from a store that did not record them, or for
            a record that does not have the shape settings_of gives (a file from elsewhere is data, never trusted).
    """
    raw = unit_metadata(path).get(UTILITY_METADATA_KEY)
    try:
        settings = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None
    return settings if _well_formed(settings) else None


def _well_formed(settings: Any) -> bool:
    if not isinstance(settings, dict) or not isinstance(settings.get("divergence"), bool):
        return False
    generation = settings.get("generation")
    if generation is None:
        return True
    return (
        isinstance(generation, dict)
        and isinstance(generation.get("sample_ids"), list)
        and all(isinstance(s, str) for s in generation["sample_ids"])
        and isinstance(generation.get("max_new_tokens"), int)
        and isinstance(generation.get("decoding"), str)
    )


class UnitUtility:
    """Per scoring process: which units get utility columns, the reference states of the checkpoint in hand,
    and the generation plan (the subset is the same for every unit)."""

    def __init__(self, cfg: ExperimentConfig, store: RunStore, tokenizer: Any, val: list[Example], val_records: list):
        self.store, self.tokenizer, self.val = store, tokenizer, val
        self.divergence = bool(cfg.score.divergence)
        self.generation = plan_generation(
            tokenizer, val_records, cfg.score.generation_samples, cfg.score.generation_max_new_tokens
        )
        self.settings = settings_of(cfg, self.generation, val_records)
        self._reference: tuple[tuple[int, int], ReferenceStates] | None = None
        self._last: dict[int, int] = {}
        index = {e.sample_id: i for i, e in enumerate(val)}
        self._generated_rows = (
            [] if self.generation is None else [index[val_records[i]["sample_id"]] for i in self.generation.indices]
        )

    @property
    def enabled(self) -> bool:
        """True when any utility column is asked for."""
        return self.divergence or self.generation is not None

    def applies(self, unit: Unit) -> bool:
        """Whether a unit carries the utility columns.

        Args:
            unit (Unit): the unit.

        Returns:
            bool: True for a fine-tuning run's last checkpoint (never the base model) when any utility column is asked
                for.
        """
        if not self.enabled or unit.run == REFERENCE_RUN:
            return False
        if unit.run not in self._last:
            self._last[unit.run] = self.store.checkpoints(unit.run)[-1]
        return unit.step == self._last[unit.run]

    def stale(self, unit: Unit, path: Path) -> bool:
        """Whether a finished final unit's utility columns were made with other settings (or never).

        Args:
            unit (Unit): the unit.
            path (Path): its unit file.

        Returns:
            bool: True when it must be rescored for its utility columns.
        """
        return self.applies(unit) and recorded_settings(path) != self.settings

    def metadata(self) -> dict[bytes, bytes]:
        """The parquet metadata a unit file with utility columns records.

        Returns:
            dict[bytes, bytes]: {UTILITY_METADATA_KEY: the encoded settings}.
        """
        return {UTILITY_METADATA_KEY: encode_settings(self.settings)}

    def score_val(
        self, unit: Unit, model: Any, qmodel: Any, engine: Engine, device: Any
    ) -> tuple[list[TokenScores], dict[str, list], UtilityWork]:
        """The validation scores of `qmodel` and its utility columns.

        Args:
            unit (Unit): the unit.
            model (Any): the unit's checkpoint, unquantized.
            qmodel (Any): the checkpoint quantized.
            engine (Engine): the engine that scores the unit.
            device (Any): the scoring device.

        Returns:
            tuple[list[TokenScores], dict[str, list], UtilityWork]: the scores and the utility columns, one entry per
                validation example (None where a column does not apply), and what they cost.
        """
        work = UtilityWork()
        columns: dict[str, list] = {}
        if self.divergence:
            scores, divergence = self._with_divergence(unit, model, qmodel, engine, work)
            columns["token_kl"] = [d.kl for d in divergence]
            columns["token_same_top"] = [d.same_top for d in divergence]
        else:
            scores = engine(qmodel, self.val, None)
        if self.generation is not None:
            columns["generated"] = self._generate(qmodel, device, work)
        return scores, columns, work

    def _with_divergence(
        self, unit: Unit, model: Any, qmodel: Any, engine: Engine, work: UtilityWork
    ) -> tuple[list[TokenScores], list[TokenDivergence]]:
        key = (unit.run, unit.step)
        pairs = [(e.input_ids, e.loss_mask) for e in self.val]
        if qmodel is model:  # the identity quantizer: its own pass is the reference
            reference = ReferenceStates(pairs)
            scores = engine(qmodel, self.val, reference.hook)
            self._reference = (key, reference)
            return scores, identical_divergence(scored_counts(pairs))
        if self._reference is None or self._reference[0] != key:
            reference = ReferenceStates(pairs)
            engine(model, self.val, reference.hook)
            self._reference = (key, reference)  # one checkpoint at a time: the previous one's states are dropped
            work.reference_tokens = sum(len(e.input_ids) for e in self.val)
        collector = DivergenceCollector(self._reference[1], decoder_and_head(model)[1], _hook_head(qmodel))
        scores = engine(qmodel, self.val, collector.hook)
        work.divergence_positions = sum(self._reference[1].counts)
        return scores, list(collector.results)  # type: ignore[arg-type]

    def _generate(self, qmodel: Any, device: Any, work: UtilityWork) -> list[str | None]:
        plan = self.generation
        assert plan is not None
        own = getattr(qmodel, "greedy_answers", None)  # an engine with its own decoding (llama.cpp's)
        if own is not None:
            new = own(plan.prompts, max_new_tokens=plan.max_new_tokens, stop_ids=stop_token_ids(self.tokenizer))
        else:
            new = greedy_generate(
                qmodel,
                plan.prompts,
                max_new_tokens=plan.max_new_tokens,
                stop_ids=stop_token_ids(self.tokenizer),
                pad_id=self.tokenizer.pad_token_id,
                device=device,
            )
        work.generation_prompt_tokens = plan.prompt_tokens
        work.generated_tokens = sum(len(g) for g in new)
        out: list[str | None] = [None] * len(self.val)
        for row, text in zip(self._generated_rows, decode_answers(self.tokenizer, new)):
            out[row] = text
        return out


def _hook_head(qmodel: Any) -> Any:
    """What turns the states the engine hands its hook into logits: the model's output head, or the identity for
    an engine that hands the logits themselves (llmaudit.score.llama_cpp_engine)."""
    head = getattr(qmodel, "logits_head", None)
    return head if head is not None else decoder_and_head(qmodel)[1]


def nonfinite_divergence(columns: dict[str, list]) -> int:
    """Validation rows whose per-token KL is not finite (a quantized model whose logits overflow).

    Args:
        columns (dict[str, list]): the utility columns.

    Returns:
        int: the number of such rows.
    """
    return sum(1 for v in columns.get("token_kl") or [] if v is not None and not np.isfinite(v).all())


def work_fields(work: UtilityWork | None) -> dict[str, int]:
    """The cost of the utility columns as work-log fields.

    Args:
        work (UtilityWork | None): what the columns cost, None without them.

    Returns:
        dict[str, int]: the fields of `work` (empty without it).
    """
    return {} if work is None else asdict(work)
