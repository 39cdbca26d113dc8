"""``llama-perplexity --kl-divergence`` run by llmaudit: a quantized GGUF compared with a base model's log-probability
file under the tool's protocol (docs/science.md section 11, "The llama-perplexity protocol"), and that file written
from a base GGUF and a text as the tool writes it (``quantize.gguf_logits``).

Both models are evaluated by llama.cpp (``quantize.gguf_runtime``) exactly as the tool evaluates them: chunks of n_ctx
tokens, each chunk's first token BOS when the vocabulary adds one, the second half of each chunk scored; the
statistics are ``analyze.llama_kld``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from llmaudit.analyze.llama_kld import TokenKLD, chunk_statistics, kld_summary
from llmaudit.common.errors import UserError
from llmaudit.quantize.gguf_logits import BaseLogits, encode_log_probs, read_base_logits, write_base_logits
from llmaudit.quantize.gguf_runtime import LlamaCppModel

DEFAULT_BATCH = 2048
"""llama-perplexity's default -b: chunks per decode call = batch // n_ctx."""


def compare_with_base(base: BaseLogits, quantized: str | Path, *, threads: int, batch: int = DEFAULT_BATCH) -> dict:
    """Compute the tool's statistics of a quantized GGUF against the base file, over all the file's chunks.

    Args:
        base (BaseLogits): the base model's log-probability file, read.
        quantized (str | Path): the quantized GGUF.
        threads (int): llama.cpp threads.
        batch (int): tokens per decode call (llama-perplexity's -b).
    Returns:
        dict: ``llama_kld.kld_summary``'s statistics.
    Raises:
        UserError: when the GGUF's vocabulary is not the file's.
    """
    with LlamaCppModel(quantized, threads=threads) as model:
        if model.n_vocab != base.n_vocab:
            raise UserError(f"{quantized}: a vocabulary of {model.n_vocab} tokens, the base logits file {base.path} "
                            f"holds {base.n_vocab}; fix: pass a quantization of the model the file was made with")  # fmt: skip
        parts = []
        for chunk, logits in enumerate(model.perplexity_chunks(base.tokens, batch=batch)):
            targets = base.tokens[chunk, base.first + 1 :]
            parts.append(chunk_statistics(logits, base.rows[chunk], targets))
    return kld_summary(TokenKLD.concatenate(parts))


def chunk_tokens(tokens: np.ndarray, n_ctx: int, chunks: int | None = None) -> np.ndarray:
    """Cut a tokenized text into the tool's chunks.

    Args:
        tokens (np.ndarray): [N] token ids.
        n_ctx (int): the context length.
        chunks (int | None): the most chunks kept (None: all).
    Returns:
        np.ndarray: int32 [n_chunk, n_ctx], n_chunk = N // n_ctx (at most `chunks`).
    Raises:
        UserError: with fewer than 2 x n_ctx tokens (the tool's own minimum).
    """
    if len(tokens) < 2 * n_ctx:
        raise UserError(f"the text tokenizes to {len(tokens)} tokens; a context of {n_ctx} needs at least "
                        f"{2 * n_ctx}; fix: a longer text or a smaller --ctx")  # fmt: skip
    n_chunk = len(tokens) // n_ctx if chunks is None else min(int(chunks), len(tokens) // n_ctx)
    return np.asarray(tokens[: n_chunk * n_ctx], dtype=np.int32).reshape(n_chunk, n_ctx)


def write_base(base_gguf: str | Path, out: str | Path, *, text: str | None = None, tokens: np.ndarray | None = None,
               n_ctx: int, chunks: int | None, threads: int, batch: int = DEFAULT_BATCH) -> BaseLogits:  # fmt: skip
    """Write a base GGUF's log-probabilities of a text as ``llama-perplexity --kl-divergence-base`` does.

    The command is ``llama-perplexity -m BASE -f TEXT -c n_ctx [--chunks N] --kl-divergence-base OUT``.

    Args:
        base_gguf (str | Path): the base model's GGUF.
        out (str | Path): the file written.
        text (str | None): the text, tokenized by the file's own tokenizer (BOS added as it says).
        tokens (np.ndarray | None): [N] token ids as given, instead of a text.
        n_ctx (int): the context length.
        chunks (int | None): the most chunks (None: all).
        threads (int): llama.cpp threads.
        batch (int): tokens per decode call.
    Returns:
        BaseLogits: the file, read back.
    Raises:
        ValueError: unless exactly one of text and tokens is given.
        UserError: when the text is too short for two chunks.
    """
    if (text is None) == (tokens is None):
        raise ValueError("write_base takes a text or token ids")
    with LlamaCppModel(base_gguf, threads=threads) as model:
        ids = model.tokenize(text) if text is not None else np.asarray(tokens, dtype=np.int32).reshape(-1)
        chunked = chunk_tokens(ids, n_ctx, chunks)
        rows = (encode_log_probs(logits) for logits in model.perplexity_chunks(chunked, batch=batch))
        write_base_logits(out, chunked, model.n_vocab, rows)
    return read_base_logits(out)


def summary_record(name: str, summary: dict[str, Any], base: BaseLogits) -> dict[str, Any]:
    """Write the JSON record of one comparison: the quantized file, the base file's protocol, the statistics.

    Args:
        name (str): the quantized file's name.
        summary (dict[str, Any]): the statistics (`compare_with_base`).
        base (BaseLogits): the base file.
    Returns:
        dict[str, Any]: the record.
    """
    return {
        "quantized": str(name),
        "base_logits": str(base.path),
        "protocol": {
            "n_ctx": base.n_ctx,
            "n_chunk": base.n_chunk,
            "first_scored": base.first,
            "scored_per_chunk": base.n_ctx - 1 - base.first,
        },  # fmt: skip
        "statistics": summary,
    }
