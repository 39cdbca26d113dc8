"""The per-token shift of the log-probability from a reference model to the target (docs/science.md section 4),
read by EZ-MIA (`ez_mia.py`) and WBC (`wbc.py`):
`delta_t = log p_target(x_t) - log p_ref(x_t) = l_ref,t - l_target,t` (token losses in nats), where the
reference is the base model's own loss table (the reference unit, run -1) or, in the `*_qbase` variants,
the base model quantized like the target.
"""

from __future__ import annotations

import numpy as np

from llmaudit.common.ragged import sizes


def paired_texts(target_token_losses, reference_token_losses) -> list[tuple[np.ndarray, np.ndarray]]:
    """Pair the target's and the reference's token losses text by text, checking they match.

    Args:
        target_token_losses (Sequence[np.ndarray]): n texts' per-token losses under the target.
        reference_token_losses (Sequence[np.ndarray]): the same texts' under the reference.
    Returns:
        list[tuple[np.ndarray, np.ndarray]]: (target, reference) float64 arrays per text.
    Raises:
        ValueError: when the counts differ or a text is empty or scored on different tokens.
    """
    target = [np.asarray(t, dtype=np.float64).ravel() for t in target_token_losses]
    reference = [np.asarray(r, dtype=np.float64).ravel() for r in reference_token_losses]
    if len(target) != len(reference):
        raise ValueError(f"{len(target)} target texts but {len(reference)} reference texts.")
    for i, (t, r) in enumerate(zip(target, reference)):
        if t.size == 0 or t.size != r.size:
            raise ValueError(
                f"text {i}: {t.size} target token losses but {r.size} reference ones; both models must score "
                "the same tokens, at least one."
            )
    return list(zip(target, reference))


def log_prob_shift(target_losses: np.ndarray, reference_losses: np.ndarray) -> np.ndarray:
    """Compute delta_t = l_ref,t - l_target,t = log p_target(x_t) - log p_ref(x_t).

    Args:
        target_losses (np.ndarray): [T] token losses under the target, in nats.
        reference_losses (np.ndarray): [T] under the reference.
    Returns:
        np.ndarray: [T] shifts.
    """
    return np.asarray(reference_losses, dtype=np.float64) - np.asarray(target_losses, dtype=np.float64)


def flat_shifts(target_token_losses, reference_token_losses) -> tuple[np.ndarray, np.ndarray]:
    """Compute the shifts of every text, concatenated, with `paired_texts`' checks.

    Args:
        target_token_losses (Sequence[np.ndarray]): n texts' per-token losses under the target.
        reference_token_losses (Sequence[np.ndarray]): the same texts' under the reference.
    Returns:
        tuple[np.ndarray, np.ndarray]: (delta of every text concatenated [sum T], lengths [n]).
    Raises:
        ValueError: when the counts differ or a text is empty or scored on different tokens.
    """
    if len(target_token_losses) != len(reference_token_losses):
        raise ValueError(f"{len(target_token_losses)} target texts but {len(reference_token_losses)} reference texts.")
    if len(target_token_losses) == 0:
        return np.zeros(0), np.zeros(0, dtype=np.int64)
    n_t, n_r = sizes(target_token_losses), sizes(reference_token_losses)
    bad = np.flatnonzero((n_t == 0) | (n_t != n_r))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"text {i}: {n_t[i]} target token losses but {n_r[i]} reference ones; both models must score "
            "the same tokens, at least one."
        )
    target = np.concatenate(list(target_token_losses), axis=None).astype(np.float64)
    reference = np.concatenate(list(reference_token_losses), axis=None).astype(np.float64)
    return log_prob_shift(target, reference), n_t
