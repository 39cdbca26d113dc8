"""Structures read from a store or a user's file, parsed by a typed schema with bounds: a failure is one line naming
the file and the field (`parse_or_refuse`), never a KeyError, a TypeError or an overflow deep in the code that
reads them.

The schemas themselves live beside what reads them (`store.records`: the manifest's blocks, markers and records;
`report.models`: report.json); their fields use the bounded types below.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from llmaudit.common.errors import UserError
from llmaudit.common.safe_text import escape_controls

M = TypeVar("M", bound=BaseModel)

MAX_STEP = 1_000_000_000
"""The largest training step a record may hold (a checkpoint-N directory of a larger N is refused on import)."""

Step = Annotated[int, Field(strict=True, ge=0, le=MAX_STEP)]
"""A training step: a JSON whole number (never a string, a float or a bool) from 0 to MAX_STEP."""
Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
"""A sha256 digest: 64 lowercase hex characters."""
ShortText = Annotated[str, StringConstraints(max_length=4096)]
"""A recorded string (a path, a host name, a reason): at most 4,096 characters."""


class Record(BaseModel):
    """A record read back from a file: keys it does not name are kept (written by a newer llmaudit), every named
    field typed and bounded, floats finite."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False, protected_namespaces=())


def describe_errors(exc: ValidationError, *, prefix: str = "", limit: int = 3) -> str:
    """The first `limit` problems of a validation error as 'field = value: what is wrong', '; '-separated.

    Args:
        exc: the pydantic error.
        prefix: the dotted name of the structure inside its file (e.g. ``imported``), put before each field.
        limit: how many problems to name.

    Returns:
        One line, its values shortened and their control characters escaped.
    """
    parts = []
    for err in exc.errors()[:limit]:
        loc = ".".join(str(p) for p in (prefix, *err["loc"]) if str(p) != "") or "(top level)"
        if err["type"] == "missing":
            parts.append(f"{loc} is missing")
            continue
        value = repr(err.get("input"))
        value = value if len(value) <= 80 else value[:80] + "..."
        msg = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{loc} = {escape_controls(value)}: {msg}")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def parse_or_refuse(
    model: type[M],
    data: Any,
    *,
    where: str,
    fix: str,
    prefix: str = "",
    error: type[UserError] = UserError,
    context: dict[str, Any] | None = None,
) -> M:
    """`data` parsed as `model`, or `error` naming the file, the field, the value and the fix.

    Args:
        model: the schema.
        data: what was read (JSON's plain data).
        where: the file (or file and place) the data came from, named first in the message.
        fix: what repairs it, ending the message.
        prefix: the dotted name of `data` inside its file (named before each field).
        error: the UserError subclass raised.
        context: pydantic's validation context.

    Returns:
        The parsed model.

    Raises:
        error: when `data` does not fit the schema.
    """
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(f"{where}: {describe_errors(exc, prefix=prefix)}; {fix}") from None


def in_read_order(written: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """A model's keys as written, put back in the order they were read (keys not read last, as written), so that a
    file read and written again is the same file.

    Args:
        written: the serialized keys and values.
        order: the keys in the order they were read (empty: keep ``written`` as it is).

    Returns:
        The keys of ``written`` in that order.
    """
    if not order:
        return written
    return {k: written[k] for k in order if k in written} | {k: v for k, v in written.items() if k not in order}
