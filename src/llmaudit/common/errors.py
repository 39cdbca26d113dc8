"""The error every user-facing failure derives from.

A `UserError` is a problem with the user's input or machine (a missing file, a bad recipe value, a
tampered run directory, a GPU backend without a GPU): the command line prints its one-line message and
exits with code 2, without a traceback (LLMAUDIT_DEBUG=1 shows it). Anything else is a bug.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input or an impossible request; the message names the file or key and the fix."""
