"""The quantizers' error type."""

from __future__ import annotations

from llmaudit.common.errors import UserError


class QuantizationError(UserError):
    """A quantizer cannot do what was asked: bad option, missing library, impossible request."""
