"""The checks of `report.release_sets` (files of one fine-tune published together, judged as one release): each set
names two or more different quantizers, and every name is one the recipe scores."""

from __future__ import annotations

from collections.abc import Sequence

from llmaudit.common.errors import did_you_mean
from llmaudit.common.names import SAFE_NAME_RULE, is_safe_name
from llmaudit.config.fields import FULL_PLACEHOLDER

FULL_NAMES = ("fp32", "bf16", "fp16")
"""The names the placeholder quantizer `full` takes once the store's compute dtype is known."""

MAX_SETS = 32
"""Release sets one recipe may judge (each is judged like a quantizer with all its files' attacks)."""


def check_set_shapes(sets: list[list[str]]) -> list[list[str]]:
    """The sets as given, refused (ValueError naming the set) when one holds fewer than two names, repeats a name,
    holds a name that could not be a quantizer's, or repeats another set."""
    seen: set[frozenset[str]] = set()
    for files in sets:
        bad = [name for name in files if not is_safe_name(name)]
        if bad:
            raise ValueError(f"release set {files}: names {bad} are not allowed: use {SAFE_NAME_RULE}")
        if len(files) < 2 or len(set(files)) != len(files):
            raise ValueError(f"release set {files}: a set names two or more different quantizers")
        if frozenset(files) in seen:
            raise ValueError(f"release set {files} is given twice")
        seen.add(frozenset(files))
    return sets


def unknown_set_names(sets: Sequence[Sequence[str]], quantizers: Sequence[str]) -> str | None:
    """The problem with the first name of a set that `quantizers` (score.quantizers) does not score, with the
    closest one; None when every name is scored. With the placeholder `full` among them, fp32, bf16 and fp16 are
    accepted (whichever the store's dtype makes it)."""
    known = list(quantizers) + (list(FULL_NAMES) if FULL_PLACEHOLDER in quantizers else [])
    for files in sets:
        for name in files:
            if name not in known:
                return (
                    f"release set {list(files)}: {name!r} is not among score.quantizers{did_you_mean(name, known)}; "
                    f"scored: {', '.join(quantizers)}"
                )
    return None
