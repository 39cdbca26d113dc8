"""A GGUF file evaluated by llama.cpp itself (its CPU kernels, through the libraries llama-cpp-python builds): the
logits of token sequences at the positions asked for, greedy continuations, the tokenizer of the file.

``LlamaCppModel`` loads the file once and keeps one llama.cpp context at a time, sized for what is asked of it:
up to ``sequences`` token sequences of at most ``tokens`` each per ``llama_decode`` call, each sequence in its own
key/value stream (llama.cpp's non-unified cache, so sequences never attend to each other), as
``llama-perplexity`` evaluates its chunks. Settings are llama.cpp's defaults wherever llmaudit does not need
another (16-bit key/value cache, flash attention as llama.cpp decides, physical batch of 512), so the logits are
those a llama.cpp user gets from the same file and tokens. Only this module and ``llama_cpp_lib`` call the
libraries.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import llama_cpp_lib
from .base import QuantizationError

UBATCH = 512
"""llama.cpp's default physical batch (tokens per graph evaluation)."""
MAX_SEQUENCES = 64
"""Sequences per decode call at most (llama.cpp's own limit is 256)."""


@dataclass(frozen=True)
class _Shape:
    tokens: int
    """Tokens per sequence at most (the key/value cells of each stream)."""
    sequences: int
    batch: int
    """Tokens per llama_decode call at most."""


class LlamaCppModel:
    """A GGUF file loaded by llama.cpp for evaluation (use as a context manager, or call close()).

    Args:
        path: the .gguf file.
        threads: CPU threads of llama.cpp's kernels.
        flash_attention: None (llama.cpp's default, `auto`: on where the backend has it, as on a CPU), or on/off.

    Raises:
        QuantizationError: llama.cpp cannot be used here, or cannot load the file (its last log lines attached).
    """

    def __init__(self, path: str | Path, *, threads: int, flash_attention: bool | None = None):
        libs = llama_cpp_lib.libraries()
        self._b = libs.binding
        self.path = Path(path)
        self.threads = max(1, int(threads))
        self.flash_attention = -1 if flash_attention is None else int(bool(flash_attention))  # llama_flash_attn_type
        params = self._b.llama_model_default_params()
        params.n_gpu_layers = 0
        self._model = self._b.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise QuantizationError(
                f"{self.path}: llama.cpp cannot load it; its last output: {llama_cpp_lib.last_log()}"
            )
        self._vocab = self._b.llama_model_get_vocab(self._model)
        self.n_vocab = int(self._b.llama_vocab_n_tokens(self._vocab))
        self._ctx = None
        self._batch = None
        self._shape: _Shape | None = None

    @property
    def add_bos(self) -> bool:
        """Whether the file's tokenizer adds a BOS token (llama-perplexity then puts BOS first in every chunk)."""
        return bool(self._b.llama_vocab_get_add_bos(self._vocab))

    @property
    def bos(self) -> int:
        """The vocabulary's beginning-of-sequence token id."""
        return int(self._b.llama_vocab_bos(self._vocab))

    def __enter__(self) -> LlamaCppModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Free the context and the model (idempotent)."""
        self._free_context()
        if self._model:
            self._b.llama_model_free(self._model)
            self._model = None

    def _free_context(self) -> None:
        if self._batch is not None:
            self._b.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self._b.llama_free(self._ctx)
            self._ctx = None
        self._shape = None

    def _context(self, tokens: int, sequences: int, batch: int | None = None) -> None:
        """A context that holds `sequences` streams of `tokens` cells, fed `batch` tokens per decode (default: all
        of them); the one in hand when it has as many streams and room enough (and the same batch, when one is
        named)."""
        shape = _Shape(int(tokens), int(sequences), int(batch or tokens * sequences))
        held = self._shape
        fits = held is not None and held.sequences == shape.sequences and held.tokens >= shape.tokens
        if fits and held.batch >= shape.batch and (batch is None or held.batch == shape.batch):
            return
        self._free_context()
        params = self._b.llama_context_default_params()
        params.n_ctx = shape.tokens * shape.sequences
        params.n_batch = shape.batch
        params.n_ubatch = min(UBATCH, shape.batch)
        params.n_seq_max = shape.sequences
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = False
        params.flash_attn_type = self.flash_attention
        self._ctx = self._b.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise QuantizationError(
                f"{self.path}: llama.cpp cannot make a context of {shape.sequences} x {shape.tokens} tokens; its last "
                f"output: {llama_cpp_lib.last_log()}"
            )
        self._batch = self._b.llama_batch_init(shape.batch, 0, 1)
        self._shape = shape

    def _decode(self, sequences: Sequence[Sequence[int]], starts: Sequence[int], wanted: Sequence[Sequence[bool]],
                streams: Sequence[int] | None = None) -> np.ndarray:  # fmt: skip
        """One llama_decode of the tokens sequences[i] at positions starts[i], starts[i] + 1, ... in stream
        streams[i] (default i); returns the float32 logits [n outputs, V] of the positions marked in `wanted`, in
        batch order (a copy)."""
        batch, n = self._batch, 0
        streams = range(len(sequences)) if streams is None else streams
        for seq, tokens, start, flags in zip(streams, sequences, starts, wanted, strict=True):
            for k, (token, flag) in enumerate(zip(tokens, flags, strict=True)):
                batch.token[n], batch.pos[n], batch.n_seq_id[n] = int(token), start + k, 1
                batch.seq_id[n][0], batch.logits[n] = seq, int(bool(flag))
                n += 1
        batch.n_tokens = n
        status = self._b.llama_decode(self._ctx, batch)
        if status != 0:
            raise QuantizationError(f"{self.path}: llama_decode failed (status {status}); its last output: "
                                    f"{llama_cpp_lib.last_log()}")  # fmt: skip
        outputs = sum(sum(bool(f) for f in flags) for flags in wanted)
        if outputs == 0:
            return np.zeros((0, self.n_vocab), np.float32)
        pointer = self._b.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(outputs * self.n_vocab,)).reshape(outputs, self.n_vocab).copy()

    def _clear(self) -> None:
        self._b.llama_memory_clear(self._b.llama_get_memory(self._ctx), True)

    def logits(
        self, sequences: Sequence[Sequence[int]], wanted: Sequence[Sequence[bool]], *, per_call: int | None = None
    ) -> list[np.ndarray]:
        """The logits of each sequence at the positions marked (position t predicts token t + 1), in input order. Up to
        ``per_call`` sequences share one decode call, each in its own stream; the context holds the longest sequence.

        Args:
            sequences: token ids of each sequence.
            wanted: per sequence, whether each position's logits are wanted.
            per_call: sequences per decode call (default: as many as fit MAX_SEQUENCES).

        Returns:
            float32 [sum(wanted[i]), V] per sequence.
        """
        if not sequences:
            return []
        longest = max(len(s) for s in sequences)
        group = max(1, min(per_call or MAX_SEQUENCES, MAX_SEQUENCES, len(sequences)))
        self._context(longest, group)
        out: list[np.ndarray] = []
        for i in range(0, len(sequences), group):
            part, flags = sequences[i : i + group], wanted[i : i + group]
            self._clear()
            rows = self._decode(part, [0] * len(part), flags)
            counts = np.cumsum([0] + [sum(bool(f) for f in fl) for fl in flags])
            out += [rows[a:b] for a, b in zip(counts[:-1], counts[1:])]
        return out

    def perplexity_chunks(self, tokens: np.ndarray, *, batch: int = 2048) -> Iterator[np.ndarray]:
        """llama-perplexity's evaluation of chunks of n_ctx tokens, as the tool does it: the chunk's first token replaced by
        BOS when the vocabulary adds one, max(1, batch // n_ctx) chunks per decode call, each in its own stream.

        Args:
            tokens: int [n_chunk, n_ctx].
            batch: tokens per decode call (the tool's -b).

        Yields:
            Per chunk, in order, the float32 logits [n_ctx - 1 - n_ctx // 2, V] of its scored positions
            (n_ctx // 2 ... n_ctx - 2).
        """
        n_chunk, n_ctx = tokens.shape
        first = n_ctx // 2
        per_call = max(1, batch // n_ctx)
        if n_ctx > batch:
            raise QuantizationError(f"a context of {n_ctx} tokens needs a batch of at least {n_ctx} tokens")
        self._context(n_ctx, per_call, min(batch, n_ctx * per_call))
        flags = [False] * first + [True] * (n_ctx - 1 - first) + [False]
        for i in range(0, n_chunk, per_call):
            chunks = [list(map(int, row)) for row in tokens[i : i + per_call]]
            if self.add_bos:
                for row in chunks:
                    row[0] = self.bos
            self._clear()
            rows = self._decode(chunks, [0] * len(chunks), [flags] * len(chunks))
            yield from np.split(rows, len(chunks))

    def greedy(
        self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, stop_ids: Sequence[int]
    ) -> list[list[int]]:
        """Greedy continuation of each prompt (argmax of the logits, the lowest id on ties). Prompts are decoded side by
        side, one stream each, every step one token per unfinished prompt.

        Args:
            prompts: token ids of each prompt.
            max_new_tokens: the most tokens generated per prompt.
            stop_ids: tokens that end a continuation.

        Returns:
            Per prompt, its new tokens up to and including the first stop token, or max_new_tokens of them.
        """
        out: list[list[int]] = []
        stop = {int(s) for s in stop_ids}
        for i in range(0, len(prompts), MAX_SEQUENCES):
            part = [list(map(int, p)) for p in prompts[i : i + MAX_SEQUENCES]]
            out += self._greedy_group(part, int(max_new_tokens), stop)
        return out

    def _greedy_group(self, prompts: list[list[int]], max_new: int, stop: set[int]) -> list[list[int]]:
        self._context(max(len(p) for p in prompts) + max_new, len(prompts))
        self._clear()
        logits = self._decode(prompts, [0] * len(prompts), [[False] * (len(p) - 1) + [True] for p in prompts])
        new: list[list[int]] = [[] for _ in prompts]
        active = list(range(len(prompts)))
        while True:
            for row, s in enumerate(active):
                new[s].append(int(np.argmax(logits[row])))
            active = [s for s in active if new[s][-1] not in stop and len(new[s]) < max_new]
            if not active:
                return new
            logits = self._decode([[new[s][-1]] for s in active], [len(prompts[s]) + len(new[s]) - 1 for s in active],
                                  [[True]] * len(active), active)  # fmt: skip

    def tokenize(self, text: str) -> np.ndarray:
        """The file's tokenizer on a text, special tokens added as the file says (BOS) and none parsed from the text: what
        llama-perplexity evaluates (common_tokenize(ctx, text, true)).

        Args:
            text: the text.

        Returns:
            int32 token ids.
        """
        data = text.encode("utf-8")
        capacity = len(data) + 16
        buffer = (ctypes.c_int32 * capacity)()
        n = self._b.llama_tokenize(self._vocab, data, len(data), buffer, capacity, True, False)
        if n < 0:
            raise QuantizationError(f"{self.path}: llama.cpp cannot tokenize the text ({-n} tokens)")
        return np.frombuffer(buffer, dtype=np.int32, count=n).copy()
