"""Capacity estimator on uniform random tokens: known answers, and a tiny real training run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from llmaudit.models.layers import count_parameters
from llmaudit.validate.capacity import (
    TinyGPTSize,
    build_tiny_gpt,
    capacity_command,
    measure_capacity,
    model_sequence_bits,
    true_entropy_bits,
    uniform_memorized_bits,
    uniform_random_tokens,
)


class UniformModel(torch.nn.Module):
    """Outputs equal logits everywhere: p(x) = V^-S for every sequence, i.e. exactly the reference."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, self.vocab_size + 1)


def test_true_entropy_and_uniform_estimator_hand_values():
    # 10 sequences x 16 tokens x log2(16) = 4 bits = 640 bits.
    assert true_entropy_bits(10, 16, 16) == 640.0
    # S=4, V=4: the uniform reference needs 4 x 2 = 8 bits per sequence. A model needing 8, 3, 10, 0
    # bits memorised 0, 8-3 = 5, 0 (worse than uniform: clipped), 8 (probability 1).
    np.testing.assert_allclose(uniform_memorized_bits(np.array([8.0, 3.0, 10.0, 0.0]), 4, 4), [0, 5, 0, 8])


def test_uniform_model_memorizes_nothing():
    tokens = uniform_random_tokens(50, 12, 8, seed=3)
    bits = model_sequence_bits(UniformModel(8), tokens, 8)
    # Every sequence costs exactly 12 x log2(8) = 36 bits under the uniform model (BOS column excluded).
    np.testing.assert_allclose(bits, 36.0, rtol=1e-6)
    assert uniform_memorized_bits(bits, 12, 8).sum() == pytest.approx(0.0, abs=1e-3)


def test_random_tokens_are_seeded_and_in_range():
    a = uniform_random_tokens(20, 5, 7, seed=1)
    assert a.shape == (20, 5) and int(a.min()) >= 0 and int(a.max()) < 7
    assert torch.equal(a, uniform_random_tokens(20, 5, 7, seed=1))
    assert not torch.equal(a, uniform_random_tokens(20, 5, 7, seed=2))


def test_size_parsing_and_parameter_count():
    assert TinyGPTSize.parse("16x2") == TinyGPTSize(16, 2, 2)
    assert TinyGPTSize.parse("12x1x3").label == "d12-L1-H3"
    with pytest.raises(ValueError, match="DxL"):
        TinyGPTSize.parse("big")
    with pytest.raises(ValueError, match="divisible"):
        TinyGPTSize(10, 1, 3)
    model = build_tiny_gpt(TinyGPTSize(8, 1), vocab_size=16, seq_len=16, seed=0)
    # GPT-2, d=8, V+1=17 tokens, 16 positions, tied output: wte 17*8 + wpe 16*8 + block 12*8^2+13*8
    # (=872) + final norm 2*8 = 136 + 128 + 872 + 16 = 1152.
    assert count_parameters(model).total == 1152


def test_tiny_run_memorizes_positive_bits_below_the_true_entropy():
    # 8 sequences of 8 tokens over 8 symbols: 8 * 8 * 3 = 192 bits; an 8x1 model learns some of them.
    torch.set_num_threads(1)
    row = measure_capacity("8x1", 8, seq_len=8, vocab_size=8, max_steps=300, window=100, cooldown_steps=50, seed=0)
    assert row["true_entropy_bits"] == 192.0
    assert 20.0 < row["memorized_bits"] <= row["true_entropy_bits"]
    assert row["bits_per_param"] == pytest.approx(row["memorized_bits"] / row["params"])
    # Unseen random sequences: the trained model cannot predict them, little or nothing "memorised".
    assert row["heldout_bits"] < 0.25 * row["memorized_bits"]


def test_capacity_command_writes_results(tmp_path):
    out, md = tmp_path / "cap.json", tmp_path / "cap.md"
    result = capacity_command(
        out,
        sizes=["4x1"],
        n_sequences=[2, 4],
        seq_len=4,
        vocab_size=4,
        max_steps=40,
        window=20,
        cooldown_steps=10,
        markdown_out=md,
        progress=False,
    )
    assert json.loads(out.read_text())["summary"] == result["summary"]
    (summary,) = result["summary"]
    rows = result["measurements"]
    assert [r["n_sequences"] for r in rows] == [2, 4]
    assert [r["true_entropy_bits"] for r in rows] == [2 * 4 * 2.0, 4 * 4 * 2.0]
    # The size's capacity estimate is its largest memorised total over the data sets.
    assert summary["capacity_bits"] == max(r["memorized_bits"] for r in rows)
    assert summary["bits_per_param"] == pytest.approx(summary["capacity_bits"] / summary["params"])
    assert "| d4-L1-H2 |" in md.read_text()
    assert math.isfinite(result["wall_s"])
