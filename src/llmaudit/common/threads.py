"""The CPU thread count a user asks for ($LLMAUDIT_THREADS), read without importing torch: the command line checks
it before any command runs (`llmaudit --help` stays free of torch); `common.runtime` gives it to torch."""

from __future__ import annotations

import os

from llmaudit.common.errors import UserError

THREADS_ENV = "LLMAUDIT_THREADS"


def env_threads() -> int | None:
    """$LLMAUDIT_THREADS as a positive int, or None when unset.

    Returns:
        The thread count, or None when the variable is unset or blank.

    Raises:
        UserError: the value is not a whole number of at least 1.
    """
    env = os.environ.get(THREADS_ENV, "").strip()
    if not env:
        return None
    try:
        value = int(env)
    except ValueError:
        raise UserError(
            f"{THREADS_ENV}={env!r} is not a whole number; set it to the CPU threads to use (e.g. 2) or unset it."
        ) from None
    if value < 1:
        raise UserError(f"{THREADS_ENV}={env!r} must be at least 1.")
    return value
