"""Records to token ids through the model's chat template (or as plain text, for records whose `format`
says so), with the loss mask (response tokens by default), and the right-padded batches both training
and scoring feed to a model.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from llmaudit.data.chat_render import render_chat
from llmaudit.data.records import DataError, prompt_messages, record_format, response_role

TrainExample = tuple[Sequence[int], Sequence[bool]]
"""(input_ids, loss_mask): what the training loop and the scoring engine take."""


@dataclass(frozen=True)
class Example:
    """One tokenised record. `loss_mask[t]` says whether token t is scored (predicted from t-1)."""

    sample_id: str
    split: str  # "pool" or "val"
    input_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    scored_text: str

    @property
    def n_scored(self) -> int:
        return sum(self.loss_mask)

    @property
    def zlib_bytes(self) -> int:
        return len(zlib.compress(self.scored_text.encode("utf-8")))


def format_record(tokenizer: Any, rec: dict, *, include_prompt: bool = False) -> tuple[list[int], list[bool], str]:
    """Token ids of prompt + response, the loss mask and the scored text, tokenised the way the record's
    format says (`llmaudit.data.records`), i.e. the way a trainer fed it to the model:

    chat (default): the prompt through the model's chat template (from `prompt_messages` when the record has
        them, else one user message holding input), then output + end-of-turn; response tokens scored;
    raw: tok(input) + tok(output + eos), as TRL's prompt-completion format; completion tokens scored;
    text: tok(input + output + eos), every token after the first scored.

    Prompt and response are tokenised separately and concatenated, so the boundary is exact.
    include_prompt: score every token after the first (prompt too)."""
    fmt = record_format(rec)
    if fmt == "text":
        text = (rec.get("input") or "") + rec["output"]
        ids = _with_eos(tokenizer, tokenizer(text)["input_ids"])
        return ids, [False] + [True] * (len(ids) - 1), text + _eos_text(tokenizer)
    if fmt == "raw":
        prompt, response = rec["input"], rec["output"] + _eos_text(tokenizer)
        prompt_ids = tokenizer(prompt)["input_ids"]  # special tokens (a BOS) as the trainer's tokenizer adds them
        response_ids = _with_eos(tokenizer, tokenizer(rec["output"], add_special_tokens=False)["input_ids"])
    else:
        prompt, eos_text = _chat_prompt(tokenizer, rec)
        response = rec["output"] + eos_text
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    ids = list(prompt_ids) + list(response_ids)
    mask = [False] * len(prompt_ids) + [True] * len(response_ids)
    if include_prompt:
        mask = [False] + [True] * (len(ids) - 1)
    scored = (prompt + response) if include_prompt else response
    return ids, mask, scored


RESPONSE_MARK = "\ue000llmaudit-response\ue000"
"""Stands in for the response when a chat template renders a final turn of another role than the assistant's:
the prompt is the rendering up to it (a private-use character no tokenizer or record holds)."""


def _chat_prompt(tokenizer: Any, rec: dict) -> tuple[str, str]:
    """The chat prompt (ending where the assistant's answer starts) and the end-of-turn text.

    A final turn of another role (`response_role`, e.g. ShareGPT's "gpt") is rendered by the template as that
    role, as a trainer fed it: the prompt is the template's rendering of the conversation up to its content."""
    given = prompt_messages(rec)
    messages = given or [{"role": "user", "content": rec["input"]}]
    role = response_role(rec)
    if getattr(tokenizer, "chat_template", None) and role != "assistant":
        full = render_chat(tokenizer, [*messages, {"role": role, "content": RESPONSE_MARK}])
        if full.count(RESPONSE_MARK) != 1:
            raise DataError(
                f"record {rec.get('sample_id')!r}: the chat template does not render a final turn of role {role!r} "
                "with its content as given, so its response cannot be located; use role 'assistant'."
            )
        prompt = full[: full.index(RESPONSE_MARK)]
        eos_text = getattr(tokenizer, "eos_token", None) or ""
        if "<|im_end|>" in (tokenizer.chat_template or ""):
            eos_text = "<|im_end|>"
    elif getattr(tokenizer, "chat_template", None):
        prompt = render_chat(tokenizer, messages, add_generation_prompt=True)
        eos_text = getattr(tokenizer, "eos_token", None) or ""
        if "<|im_end|>" in (tokenizer.chat_template or ""):
            eos_text = "<|im_end|>"
    elif given or role != "assistant":
        prompt = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + f"{role}: "
        eos_text = tokenizer.eos_token or ""
    else:
        prompt = f"Instruction: {rec['input']}\nResponse: "
        eos_text = tokenizer.eos_token or ""
    return prompt, eos_text


def _eos_text(tokenizer: Any) -> str:
    return getattr(tokenizer, "eos_token", None) or ""


def _with_eos(tokenizer: Any, ids: Sequence[int]) -> list[int]:
    """`ids` ending with the tokenizer's eos token (added once: a tokenizer that appends it already keeps one)."""
    ids = list(ids)
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if eos_id is not None and (not ids or ids[-1] != eos_id):
        ids.append(int(eos_id))
    return ids


def tokenize_records(
    tokenizer: Any, records: list[dict], split: str, *, include_prompt: bool, max_length: int
) -> list[Example]:
    out = []
    for rec in records:
        ids, mask, scored = format_record(tokenizer, rec, include_prompt=include_prompt)
        if len(ids) > max_length:
            continue
        out.append(Example(rec["sample_id"], split, tuple(ids), tuple(mask), scored))
    return out


def collate(
    examples: Sequence[TrainExample], pad_id: int, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, ...]:
    """Right-padded input_ids [B, T], attention_mask [B, T], loss_mask [B, T] (True = scored token).

    Right padding with a causal mask leaves every real token's logits unchanged."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.bool)
    for i, (seq, m) in enumerate(examples):
        ids[i, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long)
        attn[i, : len(seq)] = 1
        mask[i, : len(seq)] = torch.as_tensor(list(m), dtype=torch.bool)
    mask[:, 0] = False  # nothing predicts the first token
    return ids.to(device), attn.to(device), mask.to(device)
