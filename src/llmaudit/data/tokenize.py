"""Records to token ids through the model's chat template, with the loss mask (response tokens by
default), and the right-padded batches both training and scoring feed to a model.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

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
    """Token ids of prompt + response through the model's chat template, and the loss mask.

    Prompt and response are tokenised separately and concatenated, so the boundary is exact."""
    messages = [{"role": "user", "content": rec["input"]}]
    if getattr(tokenizer, "chat_template", None):
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        eos_text = getattr(tokenizer, "eos_token", None) or ""
        if "<|im_end|>" in (tokenizer.chat_template or ""):
            eos_text = "<|im_end|>"
    else:
        prompt = f"Instruction: {rec['input']}\nResponse: "
        eos_text = tokenizer.eos_token or ""
    response = rec["output"] + eos_text
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    ids = list(prompt_ids) + list(response_ids)
    mask = [False] * len(prompt_ids) + [True] * len(response_ids)
    if include_prompt:
        mask = [False] + [True] * (len(ids) - 1)
    scored = (prompt + response) if include_prompt else response
    return ids, mask, scored


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
