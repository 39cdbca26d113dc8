"""Greedy generation: deterministic, equal to a slow one-sample no-cache argmax loop, stops where it should."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from llmaudit.score.generate import (
    MAX_NEW_TOKENS_FACTOR,
    generation_subset,
    greedy_generate,
    plan_generation,
    prompt_and_response,
    stop_token_ids,
)
from tests.tiny_models import tiny_causal_lm

VOCAB = 96


def _tiny_model(seed=0):
    return tiny_causal_lm(
        "llama",
        seed=seed,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.3,  # peaked next-token distributions: argmax ties are impossible in float32
        tie_word_embeddings=False,
    )


@torch.inference_mode()
def _slow_greedy(model, prompt, max_new, stop):
    """One sample, no cache, the full sequence re-run at every step, argmax of the last position."""
    seq = list(prompt)
    out = []
    for _ in range(max_new):
        logits = model(torch.tensor([seq])).logits[0, -1].double()
        token = int(logits.argmax())
        out.append(token)
        seq.append(token)
        if token in stop:
            break
    return out


def _prompts(seed=0, n=6):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, VOCAB, size=int(k)).tolist() for k in rng.integers(2, 15, size=n)]


def test_batched_cached_generation_equals_the_slow_loop_and_is_deterministic():
    model = _tiny_model()
    prompts = _prompts()
    unstopped = [_slow_greedy(model, p, 12, set()) for p in prompts]
    stop = [unstopped[0][3]]  # a token row 0 emits at step 4: that row stops there
    assert any(stop[0] not in row for row in unstopped)  # and some row never emits it
    fast = greedy_generate(model, prompts, max_new_tokens=12, stop_ids=stop, pad_id=0, token_budget=60)
    again = greedy_generate(model, prompts, max_new_tokens=12, stop_ids=stop, pad_id=0, token_budget=60)
    slow = [_slow_greedy(model, p, 12, set(stop)) for p in prompts]
    assert fast == slow
    assert fast == again  # deterministic: same model, same prompts, same text
    assert any(len(g) < 12 and g[-1] in stop for g in fast)  # some rows stop early, at a stop token
    assert any(len(g) == 12 for g in fast)  # others run to the limit
    assert all(t not in stop for g in fast for t in g[:-1])  # nothing after a stop token


def test_generation_subset_takes_the_tasks_in_turn_and_skips_plain_text():
    records = [{"task": "a"}] * 3 + [{"task": "b"}] * 2 + [{"task": "c", "format": "text"}] + [{"task": "a"}]
    assert generation_subset(records, 3) == [0, 1, 3]  # a, b, then a again
    assert generation_subset(records, 100) == [0, 1, 2, 3, 4, 6]  # the plain-text record is never chosen
    assert generation_subset(records, 0) == []


def test_plan_takes_prompts_through_the_chat_template_and_the_limit_from_the_data():
    from llmaudit.data.tokenize import format_record

    class Tok:  # the chat template path of format_record, with a tokenizer that maps characters to ids
        chat_template = "x"
        eos_token = "<|im_end|>"
        eos_token_id = 3

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return "U:" + messages[0]["content"] + "|A:"

        def __call__(self, text, add_special_tokens=False):
            return {
                "input_ids": [
                    3 if text[i:].startswith("<|im_end|>") else ord(c)
                    for i, c in enumerate(text.replace("<|im_end|>", "\x00"))
                ]
            }

        def get_vocab(self):
            return {"<|im_end|>": 3}

        def convert_tokens_to_ids(self, token):
            return 3

    tok = Tok()
    records = [
        {"task": "t", "input": "hi", "output": "abcd"},
        {"task": "u", "input": "q", "output": "xy"},
    ]
    prompt, response = prompt_and_response(tok, records[0])
    ids, mask, _ = format_record(tok, records[0])
    assert prompt == [ord(c) for c in "U:hi|A:"] and prompt + response == list(ids)
    assert len(response) == 5  # "abcd" + end of turn
    plan = plan_generation(tok, records, 2)
    assert plan.indices == (0, 1) and plan.max_new_tokens == int(np.ceil(MAX_NEW_TOKENS_FACTOR * 5))
    assert plan_generation(tok, records, 2, max_new_tokens=3).max_new_tokens == 3
    assert plan_generation(tok, records, 0) is None
    assert stop_token_ids(tok) == [3]


@pytest.mark.parametrize("budget", [16, 10_000])
def test_batching_never_changes_which_prompt_gets_which_answer(budget):
    model = _tiny_model(seed=1)
    prompts = _prompts(seed=3, n=5)
    got = greedy_generate(model, prompts, max_new_tokens=6, stop_ids=[], pad_id=0, token_budget=budget)
    assert got == [_slow_greedy(model, p, 6, set()) for p in prompts]


def _expanded_head_copies(model, prompts) -> list:
    """The profiler's allocations shaped [batch, hidden, vocabulary] during one greedy generation."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        greedy_generate(model, prompts, max_new_tokens=3, stop_ids=[], pad_id=0, token_budget=10_000)
    shape = [len(prompts), 32, VOCAB]
    return [e.name for e in prof.events() if any(list(s) == shape for s in e.input_shapes if s)]


def test_generation_never_expands_the_head_over_the_batch(monkeypatch):
    """A checkpoint whose parameters need no gradient (every merged, cast or quantized one) reads the first step's
    last position through a strided view; torch's matmul then copies the head's weight once per row (batch x hidden
    x vocabulary: 864 MiB on SmolLM2 for 16 prompts). With the head's input made contiguous it does not, and the
    text is the same."""
    import llmaudit.score.generate as generate

    model = _tiny_model().requires_grad_(False)
    prompts = _prompts(seed=3, n=5)
    assert _expanded_head_copies(model, prompts) == []
    fixed = greedy_generate(model, prompts, max_new_tokens=8, stop_ids=[], pad_id=0)
    monkeypatch.setattr(generate, "contiguous_head_input", lambda model: contextlib.nullcontext())
    assert _expanded_head_copies(model, prompts) != []  # the copy the fix removes (known truth: torch's matmul)
    assert greedy_generate(model, prompts, max_new_tokens=8, stop_ids=[], pad_id=0) == fixed
