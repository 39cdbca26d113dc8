"""llmaudit's HQQ arithmetic (quantize/hqq_fast.py) against hqq's own HQQLinear: the same dequantized
weights bit for bit (torch.equal) for every option llmaudit exposes, the same early stop, the same codes,
scales and zeros; the power evaluated element by element equal to torch's full-tensor call at 1, 2 and 3
threads; the quantizer's fast CPU path equal to its HQQLinear path end to end."""

from __future__ import annotations

import copy
import inspect

import pytest
import torch

from llmaudit.quantize import get_quantizer, hqq_fast, torch_replay
from llmaudit.quantize.base import QuantizationError

from .conftest import build_lora_merged, per_sample_loss

hqq_quantize = pytest.importorskip("hqq.core.quantize")
hqq_optimize = pytest.importorskip("hqq.core.optimize")

EXPONENT = hqq_fast.LP_NORM - 1
PACKED_ROWS = {1: 8, 2: 4, 4: 2}


def hqq_linear(weight: torch.Tensor, nbits: int, group_size: int, axis: int, optimize: bool):
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight.clone()
    config = hqq_quantize.BaseQuantizeConfig(nbits=nbits, group_size=group_size, axis=axis)
    config["weight_quant_params"]["optimize"] = optimize
    return hqq_quantize.HQQLinear(linear, config, compute_dtype=torch.float32, device="cpu", del_orig=False)


def packable(weight: torch.Tensor, nbits: int, group_size: int, axis: int) -> bool:
    return axis == 0 or (weight.numel() // group_size) % PACKED_ROWS.get(nbits, 1) == 0


def _matrices() -> dict[str, tuple[torch.Tensor, int]]:
    """Named weights and their group size: typical, large (the shrink non-zero almost everywhere), tiny
    (every group narrower than 1e-4: scale 1), constant and all-zero rows, planted outliers, a single group."""
    g = torch.Generator().manual_seed(0)
    typical = torch.randn(48, 64, generator=g) * 0.05
    rows = torch.randn(32, 64, generator=g) * 0.1
    rows[3] = 0.0
    rows[7] = 0.37
    rows[11, :32] = -2.5
    outliers = torch.randn(40, 128, generator=g) * 0.02
    outliers.view(-1)[torch.randint(0, outliers.numel(), (25,), generator=g)] = 4.0
    mixed = torch.randn(24, 96, generator=g) * torch.logspace(-6, 2, 24)[:, None]
    return {
        "typical": (typical, 64),
        "large": (torch.randn(16, 64, generator=g) * 30.0, 16),
        "tiny": (torch.randn(16, 64, generator=g) * 1e-6, 32),
        "constant_and_zero_rows": (rows, 8),
        "outliers": (outliers, 64),
        "mixed_magnitudes": (mixed, 32),
        "one_group": (torch.randn(1, 64, generator=g), 64),
        "zeros": (torch.zeros(8, 64), 64),
    }


MATRICES = _matrices()


@pytest.mark.parametrize("name", sorted(MATRICES))
@pytest.mark.parametrize("optimize", [True, False])
@pytest.mark.parametrize("axis", [1, 0])
def test_fake_quantize_equals_hqqlinear_dequantize(name, axis, optimize):
    weight, group_size = MATRICES[name]
    compared = 0
    for nbits in hqq_fast.SUPPORTED_BITS:
        if not packable(weight, nbits, group_size, axis):
            continue
        ours = hqq_fast.fake_quantize(weight, nbits, group_size, axis, optimize)
        theirs = hqq_linear(weight, nbits, group_size, axis, optimize).dequantize()
        assert torch.equal(ours, theirs), (name, nbits, axis, optimize, int((ours != theirs).sum()))
        compared += 1
    assert compared >= 2


def test_codes_scale_zero_and_early_stop_equal_hqqs(monkeypatch):
    """Not only the product: the codes (hqq's unpacked W_q), the stored scale and zero, and the number of
    optimiser steps each tensor runs before its own early stop (counted inside hqq)."""
    calls = []
    step = hqq_optimize.optimize_weights_proximal_legacy_step
    monkeypatch.setattr(hqq_optimize, "optimize_weights_proximal_legacy_step", lambda *a: calls.append(1) or step(*a))
    steps = set()
    for name, (weight, group_size) in MATRICES.items():
        for nbits, axis in [(2, 1), (3, 0), (4, 1), (8, 0)]:
            if not packable(weight, nbits, group_size, axis):
                continue
            calls.clear()
            layer = hqq_linear(weight, nbits, group_size, axis, True)
            codes = hqq_fast.quantize(weight, nbits, group_size, axis, True)
            unpacked = layer.unpack(dtype=torch.float32)[: codes.codes.shape[0]]
            assert torch.equal(codes.codes, unpacked), (name, nbits, axis)
            assert torch.equal(codes.scale, layer.meta["scale"]) and torch.equal(codes.zero, layer.meta["zero"])
            assert codes.steps == len(calls), (name, nbits, axis)
            steps.add(codes.steps)
    assert 20 in steps and len(steps) >= 4, steps  # both the iteration cap and early stops are exercised


@pytest.mark.parametrize("chunk", [1 << 17, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_equal_at_several_thread_counts_with_odd_thread_ranges(threads, chunk, monkeypatch):
    """40,120 weights: above torch's grain size, so 2 or 3 threads split each elementwise call into ranges
    whose ends (28 elements with 2 threads) go through the scalar power; magnitude 0.3 puts the shrink's
    non-zero elements everywhere, tails included. Steps on the whole tensor and on chunks of 125 rows."""
    monkeypatch.setattr(hqq_fast, "_CHUNK", chunk)
    weight = torch.randn(1003, 40, generator=torch.Generator().manual_seed(1)) * 0.3
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for nbits, axis in [(2, 0), (3, 1), (3, 0)]:
            ours = hqq_fast.fake_quantize(weight, nbits, 8, axis, True)
            theirs = hqq_linear(weight, nbits, 8, axis, True).dequantize()
            assert torch.equal(ours, theirs), (threads, nbits, axis)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("numel", [1023, 40_120, 100_031])
def test_pow_like_full_tensor_equals_the_full_call_at_every_position(numel, threads):
    """The power element by element, at scattered positions and at the last 40 of every thread range (and at
    every position), equals the full-tensor call there. Those last 40 hold values whose vectorized and
    scalar powers differ, so a wrong split of the tensor between the two loops fails this test."""
    g = torch.Generator().manual_seed(numel)
    x = torch.rand(numel, generator=g) * 2.0
    candidates = torch.rand(4096, generator=g) * 2.0
    differing = candidates[candidates.pow(EXPONENT) != torch_replay._pow_scalar_loop(candidates, EXPONENT)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ends = torch.cat([torch.arange(max(0, e - 40), e) for e in _range_ends(numel, threads)])
        if differing.numel():
            x[ends] = differing[torch.arange(ends.numel()) % differing.numel()]
        full = x.pow(EXPONENT)
        index = torch.unique(torch.cat([ends, torch.randint(0, numel, (500,), generator=g)]))
        ours = hqq_fast.pow_like_full_tensor(x[index], index, numel, EXPONENT, full=x)
        assert torch.equal(ours, full[index])
        everywhere = torch.arange(numel)  # beyond threads x grain: the vectorized loop in multi-thread pieces
        assert torch.equal(hqq_fast.pow_like_full_tensor(x, everywhere, numel, EXPONENT, full=x), full)
        if differing.numel():  # this CPU's vectorized pow differs from std::pow: the split must be known ...
            assert torch_replay._pow_block(EXPONENT, threads) is not None
            # ... and both loops were needed
            assert (ours != torch_replay._pow_scalar_loop(x[index], EXPONENT)).any()
            assert (ours != torch_replay._pow_vector_loop(x[index], EXPONENT, 32)).any()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_tensor_mean_equals_torchs_mean_at_that_thread_count(threads):
    """The tensor-wide error hqq's early stop compares, computed on one thread as ``threads`` threads sum it
    (their ranges into slots): the same bits as torch's own mean at that count, around and far above the
    grain size; the emulation (not its fallback) is what runs here. Values spanning six decades make the
    summation order show: at 2 and 3 threads some of these means differ from the one-thread mean."""
    g = torch.Generator().manual_seed(1)
    order_shows = False
    for numel in (1000, 32768, 32769, 40_120, 250_001, 884_736):
        x = torch.rand(numel, generator=g) * torch.logspace(-3, 3, numel)[torch.randperm(numel, generator=g)]
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(threads)
            expected = float(x.mean())
            torch.set_num_threads(1)
            order_shows |= float(x.mean()) != expected
        finally:
            torch.set_num_threads(before)
        assert hqq_fast.tensor_mean(x, threads) == expected, numel
    assert torch_replay._mean_by_ranges_holds(threads)
    assert order_shows == (threads > 1)


def _range_ends(numel: int, threads: int) -> list[int]:
    if numel <= 32768 or threads == 1:
        return [numel]
    chunk = -(-numel // min(threads, -(-numel // 32768)))
    return [min(numel, b + chunk) for b in range(0, numel, chunk)]


@pytest.mark.parametrize("compact", [0.0, 1.0])
def test_chunked_steps_and_dropped_fixed_rows_change_nothing(compact, monkeypatch):
    """Axis 1 runs each step on chunks of rows and drops the rows whose zero point stopped changing (a fixed
    point of their own step). With chunks of 5 groups, never dropping (compact 0) or dropping after every
    step where any row froze (compact 1): still hqq's weights, codes and step counts; the rows were
    really dropped (so the test can fail if dropping were wrong)."""
    monkeypatch.setattr(hqq_fast, "_CHUNK", 5 * 64)
    monkeypatch.setattr(hqq_fast, "_COMPACT", compact)
    dropped = []
    compacted = hqq_fast._compacted
    monkeypatch.setattr(
        hqq_fast, "_compacted", lambda g, changed: dropped.append(int((~changed).sum())) or compacted(g, changed)
    )
    g = torch.Generator().manual_seed(3)
    weights = [torch.randn(96, 128, generator=g) * s for s in (0.02, 0.3, 1.0)] + [MATRICES["outliers"][0]]
    for weight in weights:
        for nbits in (2, 3, 4, 8):
            ours = hqq_fast.quantize(weight, nbits, 64, 1, True)
            layer = hqq_linear(weight, nbits, 64, 1, True)
            assert torch.equal(ours.dequantize(), layer.dequantize()), (compact, nbits)
            assert torch.equal(ours.zero, layer.meta["zero"])
    assert (sum(dropped) > 100) == (compact == 1.0), dropped


def test_unverified_pow_split_falls_back_to_the_full_call(monkeypatch):
    """Where torch's split cannot be read off, the whole tensor's power is computed as hqq does: still exact."""
    monkeypatch.setattr(torch_replay, "_pow_block", lambda exponent, threads: None)
    weight, group_size = MATRICES["large"]
    ours = hqq_fast.fake_quantize(weight, 2, group_size, 1, True)
    assert torch.equal(ours, hqq_linear(weight, 2, group_size, 1, True).dequantize())


def test_shrink_matches_hqq_and_is_zero_below_the_threshold():
    x = torch.linspace(-1.0, 1.0, 20001)
    assert torch.equal(hqq_fast.shrink_lp(x), hqq_optimize.shrink_lp_op(x, hqq_fast.BETA, hqq_fast.LP_NORM))
    bound = hqq_fast.shrink_threshold()
    root = (1 / hqq_fast.BETA) ** (1 / (2 - hqq_fast.LP_NORM))  # a = a^(p-1) / beta
    assert bound == pytest.approx(0.9 * root) and root == pytest.approx(0.17013, abs=1e-5)
    shrunk = hqq_fast.shrink_lp(x)
    assert torch.all(shrunk[x.abs() < bound] == 0)
    assert torch.all(shrunk[x.abs() > 1.001 * root] != 0)  # the bound is not vacuous: just above the root it acts


def test_workspace_reused_across_layers_changes_nothing():
    """One workspace serves every layer of a model; a layer quantized after others of its shape (dirty
    buffers) equals the same layer quantized alone."""
    workspace = hqq_fast.Workspace()
    g = torch.Generator().manual_seed(2)
    layers = [torch.randn(64, 64, generator=g) * s for s in (0.02, 1.0, 0.3)]
    shared = [hqq_fast.fake_quantize(w, 3, 32, 1, True, workspace=workspace) for w in layers]
    for w, ours in zip(layers, shared):
        assert torch.equal(ours, hqq_fast.fake_quantize(w, 3, 32, 1, True))


def test_constants_are_the_installed_hqqs():
    """The arithmetic copies hqq 0.2.8's defaults; an hqq that changes them must fail here, not drift."""
    assert hqq_quantize.Quantizer.optimize_weights is hqq_optimize.optimize_weights_proximal_legacy
    params = inspect.signature(hqq_optimize.optimize_weights_proximal_legacy).parameters["opt_params"].default
    assert (params["lp_norm"], params["beta"], params["iters"]) == (
        hqq_fast.LP_NORM,
        hqq_fast.BETA,
        hqq_fast.ITERATIONS,
    )
    for nbits in hqq_fast.SUPPORTED_BITS:
        rounds = hqq_quantize.BaseQuantizeConfig(nbits=nbits)["weight_quant_params"]["round_zero"]
        assert rounds == (nbits in hqq_fast.ROUND_ZERO_BITS)


def test_bad_input_is_refused():
    with pytest.raises(QuantizationError, match="non-finite"):
        hqq_fast.fake_quantize(torch.tensor([[0.0, float("nan")] * 32]), 4, 64)
    with pytest.raises(ValueError, match="does not divide"):
        hqq_fast.fake_quantize(torch.zeros(3, 20), 4, 8)
    with pytest.raises(ValueError, match="nbits"):
        hqq_fast.fake_quantize(torch.zeros(8, 64), 5, 64)


# ------------------------------------------------------------------------------------- the quantizer


@pytest.mark.parametrize(
    "name, options",
    [("hqq-2", {}), ("hqq-4", {"axis": 0, "group_size": 32}), ("hqq-3", {"optimize": False}), ("hqq-1", {})],
)
def test_fast_path_equals_the_hqqlinear_path_end_to_end(name, options, batch, monkeypatch):
    """On the tiny LoRA-merged model: every quantized weight and every per-sample loss identical between the
    CPU default (hqq_fast) and hqq's per-layer HQQLinear path; HQQLinear is never built by the former."""
    base = build_lora_merged()
    q = get_quantizer(name, device="cpu", **options)
    reference = q.quantize_model_with_hqqlinear(copy.deepcopy(base))
    monkeypatch.setattr(hqq_quantize, "HQQLinear", None)  # the fast path must not need it
    fast = q.quantize_model(copy.deepcopy(base))
    weights = {n: m.weight for n, m in reference.named_modules() if isinstance(m, torch.nn.Linear)}
    for n, m in fast.named_modules():
        if isinstance(m, torch.nn.Linear):
            assert torch.equal(m.weight, weights[n]), n
    assert torch.equal(per_sample_loss(fast, *batch), per_sample_loss(reference, *batch))
    assert not torch.equal(per_sample_loss(fast, *batch), per_sample_loss(base, *batch))


def test_a_layer_hqq_cannot_pack_is_refused_before_any_work():
    """3 groups of 64 cannot be packed two 4-bit rows to a byte: hqq's own dequantize fails on it, so the
    quantizer refuses it up front in one line (axis 0, whose rows are the group size, is fine)."""
    model = torch.nn.Sequential()
    model.add_module("layers", torch.nn.ModuleList([torch.nn.ModuleDict({"proj": torch.nn.Linear(64, 3)})]))
    with pytest.raises(RuntimeError):
        hqq_linear(model.layers[0].proj.weight.detach(), 4, 64, 1, False).dequantize()
    with pytest.raises(QuantizationError, match=r"'layers.0.proj' \(3x64\) has 3 groups of 64.*fix: pass axis=0"):
        get_quantizer("hqq-4", device="cpu").quantize_model(copy.deepcopy(model))
    out = get_quantizer("hqq-4", device="cpu", axis=0).quantize_model(copy.deepcopy(model))
    assert out.layers[0].proj.weight.shape == (3, 64)


def test_non_finite_weights_are_refused_in_one_line_naming_the_layer():
    """A tampered checkpoint with a NaN weight: exit-code-2 material (a QuantizationError), one line, the layer
    and the fix named; hqq itself would pack the NaN into an undefined code."""
    model = torch.nn.Sequential()
    model.add_module("layers", torch.nn.ModuleList([torch.nn.ModuleDict({"proj": torch.nn.Linear(64, 8)})]))
    with torch.no_grad():
        model.layers[0].proj.weight[3, 5] = float("nan")
    with pytest.raises(QuantizationError) as caught:
        get_quantizer("hqq-4", device="cpu").quantize_model(model)
    message = str(caught.value)
    assert "\n" not in message and "layer 'layers.0.proj'" in message and "non-finite" in message and "fix:" in message
