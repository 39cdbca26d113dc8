"""LLM.int8() on a CPU: `Int8Linear` against bitsandbytes' own `Linear8bitLt`, bit for bit, and the bnb-int8
quantizer's model against the one it built before (the same losses, the same weight digest)."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from llmaudit.quantize import get_quantizer
from llmaudit.quantize.bnb_int8 import Int8Linear, llm_int8, llm_int8_reference
from llmaudit.score.engine import fragments_heap, plain_modules, score_examples, weights_digest

from .conftest import build_lora_merged

bnb = pytest.importorskip("bitsandbytes")


def _pair(in_features: int, out_features: int, *, bias: bool, threshold: float, seed: int):
    """bitsandbytes' layer quantized on the CPU, and ours made from it."""
    torch.manual_seed(seed)
    linear = torch.nn.Linear(in_features, out_features, bias=bias)
    theirs = bnb.nn.Linear8bitLt(in_features, out_features, bias=bias, has_fp16_weights=False, threshold=threshold)
    theirs.weight = bnb.nn.Int8Params(linear.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    if bias:
        theirs.bias = torch.nn.Parameter(linear.bias.data.clone(), requires_grad=False)
    theirs = theirs.to("cpu").eval()
    return theirs, Int8Linear.from_bitsandbytes(theirs)


def _inputs(shape: tuple, width: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Activations with outlier columns (|x| >= 6 in a few columns), a zero row where there are several rows, tiny
    values in the float16 subnormal range and large ones near its overflow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, width, generator=g) * 2
    x[..., 3] *= 5
    x[..., 7] = 1e-6 * torch.randn(shape, generator=g)
    if x.numel() // width > 2:
        x.view(-1, width)[1] = 0
        x.view(-1, width)[2, 9] = 60000.0
    return x.to(dtype)


CASES = list(
    itertools.product(
        [(64, 48), (96, 80)],
        [True, False],
        [6.0, 0.0, 5.3],
        [torch.float32, torch.bfloat16, torch.float16],
        [(37,), (3, 11), (1,)],
    )
)


@pytest.mark.parametrize("size, bias, threshold, dtype, shape", CASES)
def test_int8_linear_is_bitsandbytes_linear8bitlt_bit_for_bit(size, bias, threshold, dtype, shape):
    theirs, mine = _pair(*size, bias=bias, threshold=threshold, seed=len(shape) + size[0])
    x = _inputs(shape, size[0], dtype, seed=size[1])
    with torch.no_grad():
        expected = theirs(x.clone())
        got = mine(x)
    assert got.dtype == expected.dtype == dtype and got.shape == expected.shape
    assert torch.equal(got.view(torch.uint8), expected.view(torch.uint8))  # the same bits, signed zeros included
    assert torch.equal(llm_int8_reference(x, mine.weight, mine.SCB, mine.bias, threshold), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_the_compiled_pass_leaves_to_torch_give_bitsandbytes_numbers(dtype):
    """A row of only outliers and zeros (127 / 0), and a NaN, go through torch's operations: still bitsandbytes'
    (in bfloat16 the NaN rows also pass through the compiled dequantization's rounding)."""
    theirs, mine = _pair(32, 16, bias=True, threshold=6.0, seed=1)
    x = torch.randn(4, 32).to(dtype)
    x[0] = 0
    x[1, :] = 7.0
    with torch.no_grad():
        assert torch.equal(mine(x), theirs(x.clone()))
        x[2, 3] = float("nan")
        a, b = mine(x), theirs(x.clone())
    assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_compiled_and_reference_paths_agree_on_many_rows():
    """The compiled passes against torch's operations on a batch as the engine sends it (2048 x 576 bfloat16)."""
    theirs, mine = _pair(576, 192, bias=True, threshold=6.0, seed=2)
    x = (torch.randn(2048, 576) * 2).to(torch.bfloat16)
    x[:, 11] *= 8
    assert torch.equal(llm_int8(x, mine.weight, mine.SCB, mine.bias, 6.0), theirs(x.clone()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocked", [True, False])
def test_an_outlier_column_found_in_a_later_block_is_the_whole_inputs(dtype, blocked, monkeypatch):
    """Rows go through the compiled path in blocks of BLOCK_ROWS (one block where bitsandbytes' product is not
    torch._int_mm): an outlier only in the last block's last row still zeroes its column's codes in every row, and
    a row count that is not a multiple of the block is scored whole; every output is bitsandbytes'."""
    from llmaudit.quantize import bnb_int8

    monkeypatch.setattr(bnb_int8, "_product_is_int_mm", lambda: blocked)
    theirs, mine = _pair(96, 40, bias=True, threshold=6.0, seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2 * bnb_int8.BLOCK_ROWS + 37, 96, generator=g).clamp_(-5, 5)
    x[-1, 17] = 9.0  # the only outlier
    x = x.to(dtype)
    with torch.no_grad():
        assert torch.equal(mine(x), theirs(x.clone()))
        assert torch.equal(mine(x[:5]), theirs(x[:5].clone()))  # no outlier in these rows: no outlier column


def test_bnb_int8_quantizer_builds_int8_linear_with_the_same_losses_and_digest(tokenizer, texts, monkeypatch):
    """The quantizer's model on a CPU: Int8Linear layers, stateless (plain_modules), with every loss and vocabulary
    statistic of the model of bitsandbytes' layers it built before, and the same weight digest."""
    base = build_lora_merged()
    q = get_quantizer("bnb-int8", device="cpu")
    mine = q.quantize_model(copy.deepcopy(base))
    from llmaudit.quantize import bnb_backend

    monkeypatch.setattr(bnb_backend.Int8Linear, "from_bitsandbytes", staticmethod(lambda layer: layer))
    theirs = get_quantizer("bnb-int8", device="cpu").quantize_model(copy.deepcopy(base))
    layers = [m for m in mine.modules() if isinstance(m, Int8Linear)]
    assert len(layers) == 14 and not any(isinstance(m, bnb.nn.Linear8bitLt) for m in mine.modules())
    assert plain_modules(mine) and not plain_modules(theirs)
    assert fragments_heap(mine) and fragments_heap(theirs) and not fragments_heap(base)  # both under bounded_heap
    assert weights_digest(mine) == weights_digest(theirs)
    assert q.model_size_bytes(mine) == q.model_size_bytes(theirs)
    examples = []
    for text in texts[:8]:
        ids = tokenizer(text)["input_ids"]
        examples.append((ids, [False] * 4 + [True] * (len(ids) - 4)))
    a = score_examples(mine, examples, pad_id=tokenizer.pad_token_id, vocab_stats=True, cpu_workers=2)
    b = score_examples(theirs, examples, pad_id=tokenizer.pad_token_id, vocab_stats=True)
    for s, t in zip(a, b, strict=True):
        assert (s.token_losses == t.token_losses).all() and (s.vocab_mean == t.vocab_mean).all()
