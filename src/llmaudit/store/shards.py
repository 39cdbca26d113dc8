"""The deterministic round-robin split of a stage's units over N shard jobs (`--shard I/N`)."""

from __future__ import annotations

from llmaudit.common.errors import UserError


def shard_items(items: list, shard: tuple[int, int] | None) -> list:
    """Deterministic round-robin split: item i belongs to shard i mod N (0-based I of N)."""
    if shard is None:
        return list(items)
    index, count = shard
    if not (count >= 1 and 0 <= index < count):
        raise UserError(f"shard {index}/{count} is invalid: need 0 <= I < N")
    return [item for i, item in enumerate(items) if i % count == index]


def parse_shard(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise UserError(f"--shard {text!r} must look like I/N (e.g. 0/4), with 0 <= I < N") from None
    if not (n >= 1 and 0 <= i < n):
        raise UserError(f"--shard {text!r}: need 0 <= I < N")
    return i, n
