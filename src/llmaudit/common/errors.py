"""The error every user-facing failure derives from.

A `UserError` is a problem with the user's input or machine (a missing file, a bad recipe value, a
tampered run directory, a GPU backend without a GPU): the command line prints its one-line message and
exits with code 2, without a traceback (LLMAUDIT_DEBUG=1 shows it). Anything else is a bug.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

GATE_EXIT_CODE = 3
"""The exit code of `--gate` when the quantizer to ship is not cleared (2 is bad input, 1 a bug, 130 an interrupt)."""


class UserError(ValueError):
    """Bad input or an impossible request; the message names the file or key and the fix."""


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest of `choices` to a misspelt `word`, '' when none is close."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
