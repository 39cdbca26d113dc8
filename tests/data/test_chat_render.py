"""A chat template that loops without bound or repeats its input is refused in one line, in bounded time and
memory, when the first record is rendered."""

from __future__ import annotations

import time

import pytest

from llmaudit.data import chat_render
from llmaudit.data.records import DataError
from llmaudit.data.tokenize import format_record
from llmaudit.models.builtin import build_tokenizer

RECORD = {"sample_id": "s0", "input": "What is water?", "output": "H2O", "task": "molecule_captioning"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(["what is water h2o " * 20] * 20, 300)


def test_a_template_that_never_ends_is_stopped(tokenizer, monkeypatch):
    monkeypatch.setattr(chat_render, "RENDER_SECONDS", 1.0)
    tokenizer.chat_template = "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    t0 = time.monotonic()
    with pytest.raises(DataError, match="did not finish rendering one record within 1 s"):
        format_record(tokenizer, RECORD, include_prompt=False)
    assert time.monotonic() - t0 < 5


def test_a_template_that_repeats_its_input_is_refused(tokenizer, monkeypatch):
    monkeypatch.setattr(chat_render, "RENDER_CHARS", 100_000)
    tokenizer.chat_template = "{% for i in range(99999) %}{{ messages[0]['content'] }}{% endfor %}"
    with pytest.raises(DataError, match="rendered more than 100,000 characters"):
        format_record(tokenizer, RECORD, include_prompt=False)


def test_an_ordinary_template_renders(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    ids, mask, scored = format_record(tokenizer, RECORD, include_prompt=False)
    assert scored.startswith("H2O") and any(mask) and not all(mask)
