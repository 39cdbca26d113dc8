"""The compiled parts of llmaudit's GPTQ against the torch operations they replace, bit for bit: the exact column
loop (`gptq_kernel.exact_block_solve` against `gptq_solver._block_solve(..., exact=True)`), the dequantized weight
of contiguous groups, and the sequential calibration's reuse of unchanged layers' outputs (`_Replay`) against the
same passes recomputing every layer. gptqmodel's own codes are checked end to end in test_gptq_solver.py."""

from __future__ import annotations

import itertools

import pytest
import torch

from llmaudit.quantize import gptq_calibration
from llmaudit.quantize.base import DEFAULT_MODULES, target_modules
from llmaudit.quantize.gptq_calibration import quantize_sequential
from llmaudit.quantize.gptq_kernel import exact_block_solve
from llmaudit.quantize.gptq_solver import (
    GPTQSpec,
    _block_solve,
    dequantize,
    gptq_quantize,
    group_params,
    prepare_factor,
)

from .conftest import build_lora_merged


def _problem(layers: int, rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights [L, R, C] and Hessians [L, C, C] with dead columns, a zero row segment and uneven column scales."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(layers, 3 * columns, columns, generator=g) * torch.rand(layers, 1, columns, generator=g) * 3
    x[:, :, [1, columns // 2]] = 0
    w = torch.randn(layers, rows, columns, generator=g) * 0.05
    w[:, 2, : columns // 3] = 0
    return w, x.transpose(1, 2) @ x / x.shape[1]


def _solve(kind: str, w: torch.Tensor, h: torch.Tensor, spec: GPTQSpec) -> tuple[dict, torch.Tensor, tuple]:
    """One whole solve with the torch loop or the compiled one, on the same factor and column order."""
    factor = prepare_factor(h, spec, exact=True)
    wt = w.transpose(1, 2).contiguous()
    scale, zero = group_params(wt.transpose(1, 2), spec.maxq, spec.sym)
    if factor.perm is not None:
        wt = torch.stack([wt[i].index_select(0, factor.perm[i]) for i in range(w.shape[0])])
    where = factor.perm if factor.perm is not None else torch.arange(w.shape[2]).expand(w.shape[0], -1)
    out = {"codes": torch.empty(wt.shape, dtype=torch.uint8), "where": where, "scales": [], "zeros": []}
    if kind == "torch":
        last = _block_solve(wt, factor.u, scale, zero, spec, out, exact=True)
    else:
        last = exact_block_solve(wt, factor.u, scale, zero, spec, out)
    return out, wt, last


GRID = list(itertools.product([2, 3, 4, 8], [-1, 32, 48, 64, 256], [True, False]))


@pytest.mark.parametrize("bits, group_size, sym", GRID)
def test_compiled_column_loop_is_the_torch_loop_bit_for_bit(bits, group_size, sym):
    """Codes, group scales and zero points, the lazily updated workspace and the last grid: equal to the last bit,
    with groups that start inside a block (48), span blocks (256) or are whole rows (-1), several layers at once,
    a partial last block, and the group-aware column order."""
    spec = GPTQSpec(bits=bits, group_size=group_size, sym=sym)
    w, h = _problem(layers=3, rows=24, columns=320 if group_size != 48 else 288, seed=bits * 7 + group_size)
    mine, theirs = _solve("compiled", w, h, spec), _solve("torch", w, h, spec)
    assert torch.equal(mine[0]["codes"], theirs[0]["codes"])
    assert len(mine[0]["scales"]) == len(theirs[0]["scales"]) > (0 if group_size != -1 else -1)
    assert all(torch.equal(a, b) for a, b in zip(mine[0]["scales"], theirs[0]["scales"], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(mine[0]["zeros"], theirs[0]["zeros"], strict=True))
    assert torch.equal(mine[1], theirs[1])
    assert torch.equal(mine[2][0], theirs[2][0]) and torch.equal(mine[2][1], theirs[2][1])
    assert int(mine[0]["codes"].max()) == spec.maxq  # the grid's ends are reached: the clamp is exercised


def test_gptq_quantize_takes_the_compiled_loop_on_a_cpu(monkeypatch):
    """gptq_quantize(exact=True) runs the compiled loop on a CPU (with the torch loop made to fail it still
    quantizes), and its results are those of the same call through the torch loop."""
    from llmaudit.quantize import gptq_kernel, gptq_solver

    spec = GPTQSpec(bits=4, group_size=32)
    w, h = _problem(layers=2, rows=16, columns=192, seed=3)
    torch_loop = gptq_solver._block_solve
    monkeypatch.setattr(gptq_solver, "_block_solve", lambda *a, **k: (_ for _ in ()).throw(AssertionError("torch")))
    mine = gptq_quantize(w, h, spec, exact=True)
    with pytest.raises(AssertionError, match="torch"):
        gptq_quantize(w, h, spec, exact=False)  # the fast order stays the torch loop
    monkeypatch.setattr(gptq_kernel, "exact_block_solve", lambda *a: torch_loop(*a, exact=True))
    theirs = gptq_quantize(w, h, spec, exact=True)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales) and torch.equal(a.zeros, b.zeros)


@pytest.mark.parametrize("groups, natural", [(4, True), (1, True), (3, False), (4, False)])
def test_dequantize_of_contiguous_groups_is_the_gathered_product(groups, natural):
    g = torch.Generator().manual_seed(groups)
    rows, columns = 5, 96
    codes = torch.randint(0, 16, (rows, columns), dtype=torch.uint8, generator=g)
    scales = torch.rand(rows, groups, generator=g) * 0.1
    zeros = torch.randint(0, 16, (rows, groups), generator=g).float()
    g_idx = torch.arange(columns, dtype=torch.int32) // (columns // groups)
    if not natural:
        g_idx = g_idx[torch.randperm(columns, generator=g)]
    for scale_dtype, dtype in (
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float16, torch.bfloat16),
    ):
        gi = g_idx.long()
        expected = scales.to(scale_dtype).to(dtype)[:, gi] * (codes.to(dtype) - zeros.to(dtype)[:, gi])
        assert torch.equal(dequantize(codes, scales, zeros, g_idx, scale_dtype=scale_dtype, dtype=dtype), expected)


class _NoReplay:
    """`_Replay`'s interface, every layer recomputed in every pass (what the sequential passes did before)."""

    def __init__(self, block):
        self.sample = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def forget(self, module):
        return None


def _sequential_run(tokenizer, texts, monkeypatch) -> tuple[dict, dict, int]:
    """quantize_sequential on the tiny merged model: (results, the Hessian of every layer, linear products made)."""
    samples = [tokenizer(t)["input_ids"][: 9 + 3 * i] for i, t in enumerate(texts[:6])]
    model = build_lora_merged()
    names = [n for n, _ in target_modules(model, DEFAULT_MODULES)]
    hessians, products = {}, []
    solve, forward = gptq_calibration.solve_layers, torch.nn.Linear.forward

    def record(weights, found, spec, **kw):
        hessians.update({n: found[n].clone() for n in weights})
        return solve(weights, found, spec, **kw)

    def counted(self, x):
        products.append(1)
        return forward(self, x)

    with monkeypatch.context() as patch:
        patch.setattr(gptq_calibration, "solve_layers", record)
        patch.setattr(torch.nn.Linear, "forward", counted)
        results = quantize_sequential(model, names, samples, GPTQSpec(bits=4, group_size=32), exact=True)
    return results, hessians, len(products)


def test_reusing_unchanged_layers_outputs_changes_no_hessian_and_no_code(tokenizer, texts, monkeypatch):
    """The sequential pass with each layer's output given again while its weight and input are the same: every
    Hessian and every code equal to the pass that recomputes every layer, and fewer linear products computed."""
    mine, h_mine, n_mine = _sequential_run(tokenizer, texts, monkeypatch)
    monkeypatch.setattr(gptq_calibration, "_Replay", _NoReplay)
    theirs, h_theirs, n_theirs = _sequential_run(tokenizer, texts, monkeypatch)
    assert set(mine) == set(theirs) and len(h_mine) == len(h_theirs) == len(mine)
    assert all(torch.equal(h_mine[n], h_theirs[n]) for n in h_mine)
    assert all(torch.equal(mine[n].codes, theirs[n].codes) for n in mine)
    assert n_mine < 0.7 * n_theirs  # the unchanged layers' products are not computed again
