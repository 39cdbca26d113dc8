"""A model's chat template rendered under a time and an output-size bound.

A chat template is Jinja code shipped with the model: a template with nested loops would hang `import` or
`finetune` on the first record, and one that repeats its input would fill memory. Each rendering gets
RENDER_SECONDS (a timer interrupts the Jinja loop: on Unix, in the main thread; elsewhere the rendering is not
timed) and may produce at most RENDER_CHARS characters; past either, DataError in one line naming the model.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from llmaudit.data.records import DataError

RENDER_SECONDS = 10.0
"""Wall time of one rendering: a real template renders a conversation in well under a millisecond."""
RENDER_CHARS = 4_000_000
"""Characters of one rendering: far beyond any record llmaudit reads (a JSONL line is at most 64 MiB of text,
and data.max_length caps the tokens scored)."""


class _Expired(Exception):
    pass


def _expire(signum: int, frame: Any) -> None:
    raise _Expired


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    """Raise _Expired in this block after `seconds` (main thread on Unix; elsewhere unbounded)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def render_chat(tokenizer: Any, messages: list[dict], **kwargs: Any) -> str:
    """`tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)` within the bounds above."""
    name = getattr(tokenizer, "name_or_path", None) or "the model"
    try:
        with _time_limit(RENDER_SECONDS):
            text = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except _Expired:
        raise DataError(
            f"the chat template of {name} did not finish rendering one record within {RENDER_SECONDS:g} s (a loop "
            "without bound?); fix the template (chat_template.jinja / tokenizer_config.json) or use --format raw"
        ) from None
    except MemoryError:
        text = None
    if text is None or len(text) > RENDER_CHARS:
        raise DataError(
            f"the chat template of {name} rendered more than {RENDER_CHARS:,} characters for one record; fix the "
            "template (chat_template.jinja / tokenizer_config.json) or use --format raw"
        )
    return text
