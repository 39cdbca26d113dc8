"""llama-perplexity's base log-probability file (``quantize.gguf_logits``): what it stores, read back, and refused
when it is not well formed. (That a file written here is byte for byte the tool's own is
tests/analyze/test_llama_perplexity.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from llmaudit.quantize.gguf_logits import (
    LogitsFileError,
    _nearest_int,
    decode_log_probs,
    encode_log_probs,
    file_bytes,
    read_base_logits,
    row_width,
    scored_positions,
    write_base_logits,
)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x - np.logaddexp.reduce(x, axis=1, keepdims=True)


def test_layout_sizes():
    assert scored_positions(512) == 255 and scored_positions(128) == 63 and scored_positions(5) == 2
    assert row_width(49152) == 49156 and row_width(7) == 12  # an odd vocabulary is padded to even
    assert file_bytes(128, 7, 3) == 20 + 4 * 128 * 3 + 2 * 3 * 63 * 12


def test_encoded_log_probs_are_within_half_a_step_of_the_exact_ones_above_max_minus_16():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((40, 301)) * np.linspace(0.1, 12, 40)[:, None]).astype(np.float32)
    rows = encode_log_probs(logits)
    assert rows.shape == (40, row_width(301)) and rows.dtype == np.uint16
    scale, floor, log_p = decode_log_probs(rows, 301)
    exact = _log_softmax(logits)
    top = exact.max(axis=1, keepdims=True)
    kept = exact > np.maximum(exact.min(axis=1, keepdims=True), top - 16)
    np.testing.assert_allclose(
        scale, (logits.max(1) - np.maximum(logits.min(1), logits.max(1) - 16)) / 65535, rtol=1e-6
    )
    error = np.abs(log_p - exact)[kept]
    assert error.max() <= (scale[:, None] * np.ones_like(exact))[kept].max() * 0.5 + 2e-5
    assert (rows[:, 4 : 4 + 301][~kept] == 0).all()  # at or below the minimum: stored as 0
    wide = logits.max(1) - logits.min(1) > 16
    assert wide.any() and np.allclose(floor[wide], (top[:, 0] - 16)[wide], atol=1e-5)  # the minimum clamped


def test_a_flat_row_has_scale_zero_and_the_uniform_log_probability():
    rows = encode_log_probs(np.full((2, 10), 3.5, np.float32))
    scale, floor, log_p = decode_log_probs(rows, 10)
    assert (scale == 0).all() and (rows[:, 4:14] == 0).all()
    np.testing.assert_allclose(floor, -np.log(10), rtol=1e-6)


def test_nearest_int_rounds_half_to_even_like_llama_cpp():
    values = np.array([0.5, 1.5, 2.5, 65534.5, 3.4999, 65535.0], np.float32)
    assert _nearest_int(values).tolist() == [0, 2, 2, 65534, 3, 65535]


def test_a_written_file_reads_back(tmp_path):
    rng = np.random.default_rng(1)
    n_ctx, vocab, n_chunk = 9, 13, 3
    tokens = rng.integers(0, vocab, (n_chunk, n_ctx)).astype(np.int32)
    blocks = [encode_log_probs(rng.standard_normal((scored_positions(n_ctx), vocab)).astype(np.float32) * 4)
              for _ in range(n_chunk)]  # fmt: skip
    path = write_base_logits(tmp_path / "base.bin", tokens, vocab, iter(blocks))
    assert path.stat().st_size == file_bytes(n_ctx, vocab, n_chunk)
    base = read_base_logits(path)
    assert (base.n_ctx, base.n_vocab, base.n_chunk, base.first) == (n_ctx, vocab, n_chunk, 4)
    assert np.array_equal(base.tokens, tokens)
    assert all(np.array_equal(base.rows[i], blocks[i]) for i in range(n_chunk))


def test_rows_of_the_wrong_shape_or_count_are_refused(tmp_path):
    tokens = np.zeros((2, 9), np.int32)
    good = encode_log_probs(np.zeros((4, 5), np.float32))
    with pytest.raises(ValueError, match="expected"):
        write_base_logits(tmp_path / "a.bin", tokens, 5, [good, good[:3]])
    with pytest.raises(ValueError, match="1 chunk"):
        write_base_logits(tmp_path / "b.bin", tokens, 5, [good])


def _header(n_ctx, vocab, n_chunk, magic=b"_logits_"):
    return magic + np.array([n_ctx], "<u4").tobytes() + np.array([vocab, n_chunk], "<i4").tobytes()


@pytest.mark.parametrize(
    "content, words",
    [
        (b"GGUF" + bytes(40), "no '_logits_' header"),
        (b"_logi", "no '_logits_' header"),
        (_header(2**31, 49152, 2**30), "does not match its size"),  # a hostile header: refused before any read
        (_header(9, 5, 2) + bytes(100), "does not match its size"),  # truncated
        (_header(2, 5, 1) + bytes(8), "does not match its size"),  # nothing scored in a chunk of 2
    ],
)
def test_malformed_files_are_refused_naming_the_file(tmp_path, content, words):
    path = tmp_path / "bad.bin"
    path.write_bytes(content)
    with pytest.raises(LogitsFileError, match=words) as info:
        read_base_logits(path)
    assert str(path) in str(info.value)


def test_token_ids_outside_the_vocabulary_are_refused(tmp_path):
    tokens = np.full((1, 9), 7, np.int32)
    write_base_logits(tmp_path / "t.bin", tokens, 5, [encode_log_probs(np.zeros((4, 5), np.float32))])
    with pytest.raises(LogitsFileError, match="outside its vocabulary"):
        read_base_logits(tmp_path / "t.bin")


def test_a_missing_file_is_a_one_line_error(tmp_path):
    with pytest.raises(LogitsFileError, match="cannot be read"):
        read_base_logits(tmp_path / "nothing.bin")
