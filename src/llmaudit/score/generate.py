"""Greedy generation on a held-out subset, for the task metrics (docs/science.md section 11).

Each record's prompt goes through the model's chat template exactly as training and scoring render it
(`llmaudit.data.tokenize.format_record`); the model continues it greedily (argmax at every step, no sampling, no
beam search, no repetition penalty: a fresh GenerationConfig, never the model's shipped one) with a key/value
cache, in left-padded batches, until every row has produced an end-of-turn or end-of-sequence token or
`max_new_tokens` tokens. The same model and subset give the same text on every call.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from llmaudit.data.records import record_format
from llmaudit.data.tokenize import format_record
from llmaudit.score.engine import length_sorted_batches

GENERATION_TOKEN_BUDGET = 16384
"""Prompt plus new tokens per generation batch (rows x longest row): bounds the key/value cache;
decoding reads every weight once per step whatever the batch, so wide batches pay."""

MAX_NEW_TOKENS_FACTOR = 1.5
"""max_new_tokens from the data: this times the longest reference response of the subset (in tokens, the
end-of-turn included), so an answer spelled with more tokens than its reference (a SMILES written another way)
still fits."""


@dataclass(frozen=True)
class GenerationPlan:
    """What one final unit generates: the subset (positions in the validation records), each prompt, and the
    number of new tokens allowed."""

    indices: tuple[int, ...]
    prompts: tuple[tuple[int, ...], ...]
    max_new_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """Tokens of all the prompts together."""
        return sum(len(p) for p in self.prompts)

    def settings(self, records: Sequence[dict]) -> dict[str, Any]:
        """The recorded settings (scores/utility.json): the subset's sample ids and the decoding.

        Args:
            records (Sequence[dict]): the validation records the subset indexes.

        Returns:
            dict[str, Any]: the settings, as JSON data.
        """
        return {
            "sample_ids": [records[i]["sample_id"] for i in self.indices],
            "max_new_tokens": self.max_new_tokens,
            "decoding": "greedy (argmax, no sampling, no beam search), key/value cache, the model's chat template",
        }


def generation_subset(records: Sequence[dict], n: int) -> list[int]:
    """Up to n validation records, chosen deterministically: the tasks in turn (each task's records in file order).

    A subset smaller than the set still covers every task. Plain-text records (format "text") have no prompt to answer
    and are never chosen.

    Args:
        records (Sequence[dict]): the validation records.
        n (int): the most records to choose.

    Returns:
        list[int]: indices into `records`.
    """
    by_task: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        if record_format(rec) != "text":
            by_task.setdefault(str(rec.get("task")), []).append(i)
    queues = list(by_task.values())
    chosen: list[int] = []
    depth = 0
    while len(chosen) < n and any(depth < len(q) for q in queues):
        chosen += [q[depth] for q in queues if depth < len(q)][: n - len(chosen)]
        depth += 1
    return sorted(chosen)


def prompt_and_response(tokenizer: Any, rec: dict) -> tuple[list[int], list[int]]:
    """The prompt's token ids (up to where the answer starts) and the reference response's.

    Args:
        tokenizer (Any): the model's tokenizer.
        rec (dict): one chat record.

    Returns:
        tuple[list[int], list[int]]: (prompt ids, response ids), as the record is rendered for training and scoring.
    """
    ids, mask, _ = format_record(tokenizer, rec, include_prompt=False)
    start = mask.index(True) if True in mask else len(ids)
    return list(ids[:start]), list(ids[start:])


def plan_generation(
    tokenizer: Any, records: Sequence[dict], n: int, max_new_tokens: int | None = None
) -> GenerationPlan | None:
    """The subset, prompts and token limit of `n` generations.

    Args:
        tokenizer (Any): the model's tokenizer.
        records (Sequence[dict]): the validation records.
        n (int): the number of generations.
        max_new_tokens (int | None): the token limit (None: MAX_NEW_TOKENS_FACTOR x the subset's longest reference
            response).

    Returns:
        GenerationPlan | None: the plan; None when n is 0 or no record has a prompt.
    """
    indices = generation_subset(records, n) if n > 0 else []
    if not indices:
        return None
    pairs = [prompt_and_response(tokenizer, records[i]) for i in indices]
    limit = max_new_tokens or max(1, math.ceil(MAX_NEW_TOKENS_FACTOR * max(len(r) for _, r in pairs)))
    return GenerationPlan(tuple(indices), tuple(tuple(p) for p, _ in pairs), int(limit))


def stop_token_ids(tokenizer: Any) -> list[int]:
    """End-of-sequence and end-of-turn ids (ChatML's <|im_end|> when the template uses it).

    Args:
        tokenizer (Any): the model's tokenizer.

    Returns:
        list[int]: the stop token ids.
    """
    ids = []
    for token in (getattr(tokenizer, "eos_token", None), "<|im_end|>"):
        if token and token in tokenizer.get_vocab():
            ids.append(int(tokenizer.convert_tokens_to_ids(token)))
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.append(int(tokenizer.eos_token_id))
    return sorted(set(ids))


@contextlib.contextmanager
def contiguous_head_input(model: Any) -> Iterator[None]:
    """Within the block, the output head's input is made contiguous before it is read (a forward pre-hook).

    At the first step of a generation, a causal LM applies its head to the last position only, ``hidden[:, -1:, :]``:
    a [batch, 1, hidden] view with the stride of the whole prompt. For a model whose parameters do not require
    gradients (every checkpoint llmaudit merges, casts or quantizes), torch's matmul cannot fold such a view into one
    matrix product and expands the head's weight over the batch instead: a batch x hidden x vocabulary copy for one
    step. The contiguous input holds the same values: the same logits from one matrix product.

    Args:
        model (Any): the causal LM (its hook is removed on exit).

    Yields:
        None: while the hook is in place.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(_contiguous_first)
    try:
        yield
    finally:
        handle.remove()


def _contiguous_first(module: Any, args: tuple) -> tuple:
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return args


def _until_stop(row: list[int], stop: set[int]) -> list[int]:
    for j, token in enumerate(row):
        if token in stop:
            return row[: j + 1]
    return row


@torch.inference_mode()
def greedy_generate(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    stop_ids: Sequence[int],
    pad_id: int,
    device: torch.device | str = "cpu",
    token_budget: int = GENERATION_TOKEN_BUDGET,
) -> list[list[int]]:
    """The new tokens of each prompt, in input order, up to and including the first stop token.

    Batches: length-sorted, left-padded, at most `token_budget` prompt + new tokens.

    Args:
        model (Any): the causal LM.
        prompts (Sequence[Sequence[int]]): the prompts' token ids.
        max_new_tokens (int): the most tokens generated per prompt.
        stop_ids (Sequence[int]): tokens that end a generation.
        pad_id (int): the padding token id.
        device (torch.device | str): where the model runs.
        token_budget (int): prompt plus new tokens per batch (rows x longest row).

    Returns:
        list[list[int]]: the new tokens of each prompt (at most max_new_tokens).
    """
    from transformers import GenerationConfig

    device = torch.device(device)
    config = GenerationConfig(
        do_sample=False,
        num_beams=1,
        max_new_tokens=int(max_new_tokens),
        eos_token_id=list(stop_ids) or None,
        pad_token_id=int(pad_id),
        use_cache=True,
    )
    out: list[list[int] | None] = [None] * len(prompts)
    for batch in length_sorted_batches([len(p) + max_new_tokens for p in prompts], token_budget):
        width = max(len(prompts[i]) for i in batch)
        ids = torch.full((len(batch), width), int(pad_id), dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, width - len(prompts[i]) :] = torch.as_tensor(list(prompts[i]), dtype=torch.long)
            attention[row, width - len(prompts[i]) :] = 1
        with contiguous_head_input(model):
            sequences = model.generate(
                input_ids=ids.to(device), attention_mask=attention.to(device), generation_config=config
            )
        for row, i in enumerate(batch):
            out[i] = _until_stop(sequences[row, width:].tolist(), set(stop_ids))
    return out  # type: ignore[return-value]


def decode_answers(tokenizer: Any, generated: Sequence[Sequence[int]]) -> list[str]:
    """The generated texts without special tokens, stripped.

    Args:
        tokenizer (Any): the model's tokenizer.
        generated (Sequence[Sequence[int]]): the new tokens of each generation.

    Returns:
        list[str]: one text per generation.
    """
    return [tokenizer.decode(list(g), skip_special_tokens=True).strip() for g in generated]
