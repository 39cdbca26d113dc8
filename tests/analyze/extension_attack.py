"""An attack added in one module: its spec registers itself (docs/architecture.md, "Adding an attack").
A text's score is minus the mean of its largest token losses (the top fifth, at least one token): a member's
hardest tokens are the ones fine-tuning lowers most."""

from __future__ import annotations

import numpy as np

from llmaudit.attacks import AttackSpec, register

TOP_SHARE = 0.2


def top_token_loss(token_losses: np.ndarray, share: float = TOP_SHARE) -> float:
    """The mean of a text's largest token losses.

    Args:
        token_losses: the text's per-token losses.
        share: the fraction of its tokens averaged (at least one).

    Returns:
        The mean of the ``ceil(share * n)`` largest losses.
    """
    losses = np.sort(np.asarray(token_losses, dtype=float))[::-1]
    return float(losses[: max(1, int(np.ceil(share * len(losses))))].mean())


def _build(ctx) -> np.ndarray:
    return ctx.per_row(-np.array([top_token_loss(t) for t in ctx.target.rows["token_losses"]]))


SPEC = register(
    AttackSpec(
        "top_token_loss",
        1,
        _build,
        f"-mean(top {TOP_SHARE:g} of l_t)",
        "minus the mean of the text's largest token losses",
    )
)
