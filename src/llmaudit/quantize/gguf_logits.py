"""llama.cpp's base log-probability file: what ``llama-perplexity --kl-divergence-base FILE`` writes from the base
model and reads back with ``--kl-divergence`` (tools/perplexity/perplexity.cpp), read and written here byte for byte.

Layout (little-endian)::

    char[8]   "_logits_"
    uint32    n_ctx                      tokens per chunk
    int32     n_vocab
    int32     n_chunk
    int32     tokens[n_chunk * n_ctx]    the evaluated text, chunk after chunk (the first chunk's first token is the
                                         BOS the tokenizer added; llama.cpp replaces every chunk's first token with
                                         BOS when it evaluates, when the vocabulary adds one)
    then per chunk, per scored position (the n_ctx - 1 - n_ctx / 2 positions from n_ctx / 2 on, each predicting
    the next token), nv = 2 * ceil(n_vocab / 2) + 4 uint16:
    float32   scale, float32 min_log_prob (the first four uint16)
    uint16    q[n_vocab]                 log p_v = scale * q_v + min_log_prob; q_v = 0 at or below the minimum

with, from the base model's float32 logits x at that position: max = max_v x_v, min = max(min_v x_v, max - 16),
lse = log sum_v exp(x_v - max) (summed in double, rounded to float), min_log_prob = min - max - lse,
scale = (max - min) / 65535, q_v = round_half_even((x_v - min) / scale) for x_v > min. ``encode_log_probs``
reproduces llama.cpp's float32 arithmetic step by step (including its rounding trick), so a file written here from
the same logits is the file llama.cpp writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from llmaudit.common.errors import UserError

MAGIC = b"_logits_"
HEADER_BYTES = 8 + 4 + 4 + 4
MAX_LOG_RANGE = 16.0
"""llama.cpp keeps log-probabilities down to max - 16 only."""


class LogitsFileError(UserError):
    """A file that is not a well-formed llama.cpp base log-probability file."""


def scored_positions(n_ctx: int) -> int:
    """Positions llama-perplexity scores per chunk: the second half, n_ctx - 1 - n_ctx // 2.

    Args:
        n_ctx: the context length.

    Returns:
        The number of positions.
    """
    return n_ctx - 1 - n_ctx // 2


def row_width(n_vocab: int) -> int:
    """uint16 values per scored position: 2 * ceil(n_vocab / 2) + 4 (scale and minimum first, as two float32).

    Args:
        n_vocab: the vocabulary size.

    Returns:
        The row width.
    """
    return 2 * ((n_vocab + 1) // 2) + 4


def file_bytes(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    """The exact size of a logits file with these dimensions.

    Args:
        n_ctx: the context length.
        n_vocab: the vocabulary size.
        n_chunk: the number of chunks.

    Returns:
        Bytes.
    """
    return HEADER_BYTES + 4 * n_ctx * n_chunk + 2 * n_chunk * scored_positions(n_ctx) * row_width(n_vocab)


@dataclass(frozen=True)
class BaseLogits:
    """A base log-probability file, its log-probabilities memory-mapped (read one chunk at a time)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray
    """int32 [n_chunk, n_ctx]."""
    rows: np.ndarray
    """uint16 [n_chunk, scored_positions(n_ctx), row_width(n_vocab)] (a memory map)."""

    @property
    def first(self) -> int:
        """The first scored position of each chunk (n_ctx // 2)."""
        return self.n_ctx // 2


def read_base_logits(path: str | Path) -> BaseLogits:
    """A base-logits file, checked against its own header before anything large is read.

    Args:
        path: the file.

    Returns:
        The file's header and rows (memory-mapped).

    Raises:
        LogitsFileError: not such a file (magic, dimensions, or a size that does not match them), naming the file.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as exc:
        raise LogitsFileError(f"{path}: cannot be read ({exc.strerror}); fix: pass the file llama-perplexity "
                              "--kl-divergence-base wrote") from None  # fmt: skip
    if len(head) < HEADER_BYTES or head[:8] != MAGIC:
        raise LogitsFileError(f"{path}: not a llama-perplexity base logits file (no '_logits_' header); fix: pass the "
                              "file llama-perplexity --kl-divergence-base wrote")  # fmt: skip
    n_ctx = int(np.frombuffer(head, "<u4", 1, 8)[0])
    n_vocab, n_chunk = (int(v) for v in np.frombuffer(head, "<i4", 2, 12))
    if n_ctx < 3 or n_vocab < 1 or n_chunk < 1 or file_bytes(n_ctx, n_vocab, n_chunk) != size:
        raise LogitsFileError(
            f"{path}: its header (n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk}) does not match its size "
            f"({size} bytes); fix: pass a complete file written by llama-perplexity --kl-divergence-base"
        )
    tokens = np.fromfile(path, "<i4", n_ctx * n_chunk, offset=HEADER_BYTES).reshape(n_chunk, n_ctx)
    if tokens.min() < 0 or tokens.max() >= n_vocab:
        raise LogitsFileError(f"{path}: holds token ids outside its vocabulary of {n_vocab}")
    shape = (n_chunk, scored_positions(n_ctx), row_width(n_vocab))
    rows = np.memmap(path, "<u2", "r", offset=HEADER_BYTES + 4 * n_ctx * n_chunk, shape=shape)
    return BaseLogits(path, n_ctx, n_vocab, n_chunk, tokens, rows)


def _nearest_int(values: np.ndarray) -> np.ndarray:
    """llama.cpp's nearest_int: the float32 value plus 1.5 * 2^23, its low 23 mantissa bits minus 2^22 (round half
    to even for |x| < 2^22), as int64."""
    shifted = (values.astype(np.float32) + np.float32(12582912.0)).astype(np.float32)
    return (shifted.view(np.int32).astype(np.int64) & 0x007FFFFF) - 0x00400000


def expf(values: np.ndarray) -> np.ndarray:
    """float32 exp of float32 values, correctly rounded (computed in float64, then rounded), as C's expf gives it to
    within its documented half-ulp error: closer to llama.cpp's expf than numpy's own float32 exp.

    Args:
        values: float32 values.

    Returns:
        float32, the same shape.
    """
    return np.exp(np.asarray(values, dtype=np.float64)).astype(np.float32)


def log_sum_exp(logits: np.ndarray, top: np.ndarray) -> np.ndarray:
    """log of sum_v expf(x_v - max) summed in float64, rounded to float32 (llama.cpp's order).

    Args:
        logits: float32 [P, V].
        top: float32 [P], each row's maximum.

    Returns:
        float32 [P].
    """
    shifted = expf((logits - top[:, None]).astype(np.float32))
    return np.log(shifted.sum(axis=1, dtype=np.float64)).astype(np.float32)


def encode_log_probs(logits: np.ndarray) -> np.ndarray:
    """The file's rows of float32 logits, as llama.cpp's writer computes them.

    Args:
        logits: float32 [P, V].

    Returns:
        uint16 [P, row_width(V)].
    """
    x = np.ascontiguousarray(logits, dtype=np.float32)
    rows, vocab = x.shape
    top, low = x.max(axis=1), x.min(axis=1)
    low = np.maximum(low, (top - np.float32(MAX_LOG_RANGE)).astype(np.float32))
    lse = log_sum_exp(x, top)
    min_log_prob = ((low - top).astype(np.float32) - lse).astype(np.float32)
    scale = ((top - low).astype(np.float32) / np.float32(65535.0)).astype(np.float32)
    out = np.zeros((rows, row_width(vocab)), dtype=np.uint16)
    head = out[:, :4].view(np.float32)  # [P, 2]
    head[:, 0], head[:, 1] = scale, min_log_prob
    nonzero = scale != 0
    inv = np.zeros_like(scale)
    inv[nonzero] = (np.float32(1.0) / scale[nonzero]).astype(np.float32)
    scaled = (inv[:, None] * (x - low[:, None]).astype(np.float32)).astype(np.float32)
    q = np.where((x > low[:, None]) & nonzero[:, None], _nearest_int(scaled), 0)
    out[:, 4 : 4 + vocab] = (q & 0xFFFF).astype(np.uint16)  # C's conversion to uint16 keeps the low 16 bits
    return out


def decode_log_probs(rows: np.ndarray, n_vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The log-probabilities of file rows, each computed as llama.cpp reads it: scale * q + min_log_prob in float32.

    Args:
        rows: uint16 [P, row_width(V)].
        n_vocab: V.

    Returns:
        (scale [P], min_log_prob [P], log p [P, V]), float32.
    """
    block = np.ascontiguousarray(rows)
    head = block[:, :4].view(np.float32)
    scale, floor = head[:, 0].copy(), head[:, 1].copy()
    log_p = (scale[:, None] * block[:, 4 : 4 + n_vocab].astype(np.float32)).astype(np.float32) + floor[:, None]
    return scale, floor, log_p.astype(np.float32)


def write_base_logits(path: str | Path, tokens: np.ndarray, n_vocab: int, chunk_rows) -> Path:
    """Write a base log-probability file.

    Args:
        path: the file to write.
        tokens: int32 [n_chunk, n_ctx], the tokens as the tokenizer gave them (before any BOS replacement).
        n_vocab: the vocabulary size.
        chunk_rows: an iterable giving, per chunk in order, its encoded rows [scored_positions(n_ctx),
            row_width(n_vocab)] uint16 (``encode_log_probs`` of the base model's logits at the scored positions).

    Returns:
        The path written.

    Raises:
        ValueError: rows of the wrong shape, or not one block per chunk.
    """
    tokens = np.ascontiguousarray(tokens, dtype="<i4")
    n_chunk, n_ctx = tokens.shape
    shape = (scored_positions(n_ctx), row_width(n_vocab))
    path = Path(path)
    written = 0
    with path.open("wb") as f:
        f.write(MAGIC)
        f.write(np.asarray([n_ctx], "<u4").tobytes())
        f.write(np.asarray([n_vocab, n_chunk], "<i4").tobytes())
        f.write(tokens.tobytes())
        for rows in chunk_rows:
            if tuple(rows.shape) != shape:
                raise ValueError(f"a chunk's rows are {tuple(rows.shape)}, expected {shape}")
            f.write(np.ascontiguousarray(rows, dtype="<u2").tobytes())
            written += 1
    if written != n_chunk:
        raise ValueError(f"{written} chunk(s) of log-probabilities for {n_chunk} chunk(s) of tokens")
    return path
