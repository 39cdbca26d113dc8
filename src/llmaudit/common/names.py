"""Names that become parts of paths: an experiment's name, a quantizer's name.

A name from a recipe, a manifest or a loss table must never reach outside the directory it names a file
in: one path component of letters, digits and `._+-`, starting with a letter or digit (so never `..`,
never absolute, never hidden), at most 100 characters.
"""

from __future__ import annotations

import re

from llmaudit.common.errors import UserError

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
SAFE_NAME_RULE = "letters, digits and . _ + - only, starting with a letter or digit, at most 100 characters"


def is_safe_name(value: object) -> bool:
    return isinstance(value, str) and SAFE_NAME.fullmatch(value) is not None


def check_safe_name(kind: str, value: object, *, where: str = "") -> str:
    """`value` if it is a safe path component, else UserError naming the `kind`, the value and the rule."""
    if not is_safe_name(value):
        source = f" in {where}" if where else ""
        raise UserError(f"{kind} {value!r}{source} is not allowed: use {SAFE_NAME_RULE}.")
    return value  # type: ignore[return-value]
