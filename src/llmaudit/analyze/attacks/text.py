"""Text attacks: one membership score per sample from its token losses (higher = more likely a member)."""

from __future__ import annotations

import math

import numpy as np

from llmaudit.common.ragged import flatten, largest_means, smallest_means
from llmaudit.common.stats import ROUNDING_ULPS, rounding_tolerance

TEXT_ATTACKS = ("loss", "min_k", "min_k_plus_plus", "zlib", "ref", "loss+zlib", "loss+ref", "loss+zlib+ref")


def _token_arrays(token_losses) -> list[np.ndarray]:
    arrays = [np.asarray(t, dtype=np.float64).ravel() for t in token_losses]
    if any(a.size == 0 for a in arrays):
        raise ValueError("every sample needs at least one token loss.")
    return arrays


def min_k_count(n_tokens: int, k: float) -> int:
    """Count the tokens min-k% averages over: floor(k * T), k * T rounded to 9 decimals first, at least 1.

    floor is the published convention (the Min-K%++ authors' and mimir's int(k * T)); where k * T < 1 they average
    no token (undefined), llmaudit takes the least likely one.

    Args:
        n_tokens (int): the text's length T.
        k (float): the fraction, in (0, 1].
    Returns:
        int: the count.
    Raises:
        ValueError: when k is outside (0, 1].
    """
    if not 0 < k <= 1:
        raise ValueError(f"k is a fraction in (0, 1]; got {k}.")
    return max(1, math.floor(round(k * n_tokens, 9)))


def loss_score(token_losses) -> np.ndarray:
    """Score LOSS: -L(x) = -mean_t l_t.

    Args:
        token_losses (Sequence[np.ndarray]): n texts' per-token NLLs in nats.
    Returns:
        np.ndarray: [n] scores.
    Raises:
        ValueError: when a text has no token.
    """
    return np.array([-a.mean() for a in _token_arrays(token_losses)])


def _flat_tokens(token_losses) -> tuple[np.ndarray, np.ndarray]:
    flat, lengths = flatten(token_losses)
    if (lengths == 0).any():
        raise ValueError("every sample needs at least one token loss.")
    return flat, lengths


def _min_k_counts(lengths: np.ndarray, k: float) -> np.ndarray:
    """`min_k_count` of every text, computed once per distinct length."""
    values, where = np.unique(lengths, return_inverse=True)
    return np.array([min_k_count(int(t), k) for t in values], dtype=np.int64)[where].reshape(lengths.shape)


def min_k_score(token_losses, k: float = 0.2) -> np.ndarray:
    """Score min-k%: the mean log p (= -l_t) over the min_k_count(T, k) lowest-probability tokens.

    All texts at once (`largest_means` of l_t: the largest losses are the lowest probabilities).

    Args:
        token_losses (Sequence[np.ndarray]): n texts' per-token NLLs in nats.
        k (float): the fraction of tokens, in (0, 1].
    Returns:
        np.ndarray: [n] scores.
    Raises:
        ValueError: when a text has no token or k is outside (0, 1].
    """
    flat, lengths = _flat_tokens(token_losses)
    if lengths.size == 0:
        return np.zeros(0)
    return -largest_means(flat, lengths, _min_k_counts(lengths, k))


def min_k_plus_plus_score(token_losses, token_vocab_mean, token_vocab_std, k: float = 0.2) -> np.ndarray:
    """Score Min-K%++: per token (log p_t - mu_t) / sigma_t, then the mean of the lowest min_k_count(T, k).

    A position with sigma_t = 0 contributes 0. All texts at once.

    Args:
        token_losses (Sequence[np.ndarray]): n texts' per-token NLLs in nats.
        token_vocab_mean (Sequence[np.ndarray] | None): per text and position, E[log p] under the model's
            next-token distribution (the loss-table column of that name).
        token_vocab_std (Sequence[np.ndarray] | None): the sd of log p under that distribution.
        k (float): the fraction of tokens, in (0, 1].
    Returns:
        np.ndarray: [n] scores.
    Raises:
        ValueError: when the vocabulary statistics are absent, mismatched or negative (sd).
    """
    if token_vocab_mean is None or token_vocab_std is None:
        raise ValueError(
            "Min-K%++ needs the per-position mean and std of log p over the vocabulary (loss-table columns "
            "'token_vocab_mean' and 'token_vocab_std'); this table has none. Rescore with vocabulary "
            "statistics or leave 'min_k_plus_plus' out of the attacks."
        )
    a, lengths = _flat_tokens(token_losses)
    (mu, n_mu), (sd, n_sd) = flatten(token_vocab_mean), flatten(token_vocab_std)
    if not lengths.size == n_mu.size == n_sd.size:
        raise ValueError("token_losses, token_vocab_mean and token_vocab_std hold different numbers of samples.")
    bad = np.flatnonzero((n_mu != lengths) | (n_sd != lengths))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"sample {i}: {lengths[i]} token losses but {n_mu[i]} vocab means and {n_sd[i]} stds.")
    if (sd < 0).any():
        i = int(np.searchsorted(np.cumsum(lengths), np.flatnonzero(sd < 0)[0], side="right"))
        raise ValueError(f"sample {i}: negative vocabulary standard deviation.")
    if lengths.size == 0:
        return np.zeros(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        z = np.where(sd > 0, (-a - mu) / np.where(sd > 0, sd, 1.0), 0.0)
    return smallest_means(z, lengths, _min_k_counts(lengths, k))


def zlib_score(token_losses, zlib_bytes) -> np.ndarray:
    """Score zlib: -L(x) / zlib_bytes(x), the mean NLL in nats per token over the compressed length.

    Args:
        token_losses (Sequence[np.ndarray]): n texts' per-token NLLs in nats.
        zlib_bytes (np.ndarray): [n] zlib-compressed lengths of the texts in bytes.
    Returns:
        np.ndarray: [n] scores.
    Raises:
        ValueError: on a non-positive length or mismatched counts.
    """
    zlib_bytes = np.asarray(zlib_bytes, dtype=np.float64).ravel()
    if (zlib_bytes <= 0).any() or not np.isfinite(zlib_bytes).all():
        raise ValueError("zlib_bytes must be positive byte counts.")
    loss = -loss_score(token_losses)
    if loss.size != zlib_bytes.size:
        raise ValueError(f"{loss.size} samples but {zlib_bytes.size} zlib lengths.")
    return -loss / zlib_bytes


def ref_score(target_loss, reference_losses, reference_mask=None) -> np.ndarray:
    """Score the reference attack: -(L_target - mean_i L_ref_i).

    Equal losses give exactly 0 (docs/science.md section 4, ties).

    Args:
        target_loss (np.ndarray): [n] the target's mean losses.
        reference_losses (np.ndarray): [R, n] (or [n] for one reference) the references' mean losses.
        reference_mask (np.ndarray | None): [R, n] bool, True where reference i may be used for sample j.
    Returns:
        np.ndarray: [n] scores, NaN where a sample has no usable reference.
    Raises:
        ValueError: when the shapes do not match.
    """
    target = np.asarray(target_loss, dtype=np.float64)
    refs = np.atleast_2d(np.asarray(reference_losses, dtype=np.float64))
    if refs.shape[1:] != target.shape:
        raise ValueError(f"reference_losses {refs.shape} do not match target_loss {target.shape}.")
    mask = np.ones(refs.shape, bool) if reference_mask is None else np.atleast_2d(np.asarray(reference_mask, bool))
    n = mask.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_ref = np.where(n > 0, np.where(mask, refs, 0.0).sum(0) / n, np.nan)
    diff = target - mean_ref
    # equal losses give exactly 0: the mean of k equal losses can differ from them by rounding, and k (the
    # references a sample has) depends on membership (docs/science.md section 4, ties)
    tol = ROUNDING_ULPS * np.finfo(np.float64).eps * np.maximum(np.abs(target), np.abs(mean_ref))
    return -np.where(np.abs(diff) <= tol, 0.0, diff)


def combine_scores(*components, axis: int = -1) -> np.ndarray:
    """Combine components with equal weights: z-score each along `axis` (the samples), then sum.

    NaN entries are ignored in the mean and sd and stay NaN in the sum. A component constant but for rounding along
    `axis` (sd within ROUNDING_ULPS of its values) contributes 0 instead of amplified rounding.

    Args:
        *components (np.ndarray): arrays of the same shape, e.g. [M, N].
        axis (int): the samples' axis (-1: z-scored per target model over its samples).
    Returns:
        np.ndarray: the sum, same shape.
    Raises:
        ValueError: without a component.
    """
    if not components:
        raise ValueError("combine_scores needs at least one component.")
    total = 0.0
    for comp in components:
        comp = np.asarray(comp, dtype=np.float64)
        mu = np.nanmean(comp, axis=axis, keepdims=True)
        sd = np.nanstd(comp, axis=axis, keepdims=True)
        constant = sd <= np.expand_dims(rounding_tolerance(comp, axis=axis), axis)  # constant but for rounding: 0
        total = total + np.where(constant, 0.0, (comp - mu) / np.where(constant, 1.0, sd))
    return total
