"""The calibration passes of GPTQ: which activations each layer's Hessian ``H = (2 / n) sum_s X_s^T X_s`` is
built from (docs/science.md, "GPTQ in llmaudit"). Two conventions:

- shared (``collect_hessians``): every layer's input ``X_s`` from ONE forward pass of the unquantized model per
  calibration sample. The Hessians do not depend on the bits, so one pass serves every GPTQ bit width and
  group size of a checkpoint.
- sequential (``quantize_sequential``): gptqmodel's convention, and the GPTQ reference implementation's. The
  decoder blocks are quantized in order, each calibrated on the outputs of the blocks already quantized;
  inside a block the layers are quantized in groups that read the same input, in the order the block runs
  them (q/k/v, then o_proj, then gate/up, then down_proj: "true sequential"), each group calibrated with the
  groups before it already quantized. One pass per bit width.

Both accumulate ``X_s^T X_s`` one sample at a time, longest sample first, in float32 and multiply by ``2 / n``
at the end (n tokens in all), as gptqmodel does; layers that receive the same input tensor share one Hessian
object.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn

from .gptq_solver import GPTQLayerResult, GPTQSpec, dequantize, solve_layers

__all__ = ["check_finite", "collect_hessians", "quantize_sequential"]

BLOCK = re.compile(r"^(.*?layers\.\d+)\.")  # the decoder block a layer belongs to: model.layers.<i>


class _StopForward(Exception):
    """Raised once every layer a pass needs has seen its input: the rest of the forward is not needed."""


class _HessianCapture:
    """Forward pre-hooks that accumulate sum X^T X per distinct input tensor (one pass = one sample).
    ``stop_at``: the layer whose input ends the pass (raises _StopForward after recording it)."""

    def __init__(self, stop_at: str | None = None):
        self.sums: dict[str, torch.Tensor] = {}  # leader name -> sum_s X_s^T X_s (float32)
        self.tokens: dict[str, int] = {}
        self.leader: dict[str, str] = {}  # every name -> the name whose input it shares
        self.stop_at = stop_at
        self._last: tuple[str, torch.Tensor] | None = None  # holds the tensor, so its identity stays valid
        self._first_pass = True

    def hook(self, name: str) -> Callable:
        def record(module: nn.Module, args: tuple) -> None:
            self._record(name, args[0])
            if name == self.stop_at:
                raise _StopForward

        return record

    def _record(self, name: str, x: torch.Tensor) -> None:
        if self._last is not None and x is self._last[1]:
            leader = self.leader[self._last[0]]
            if self._first_pass:
                self.leader[name] = leader
            elif self.leader.get(name) != leader:
                raise ValueError(f"layer {name!r} changed the input it shares between calibration samples")
            return
        if not self._first_pass and self.leader.get(name) != name:
            raise ValueError(f"layer {name!r} shared its input in the first calibration sample but not later")
        self.leader[name] = name
        self._last = (name, x)
        flat = x.reshape(-1, x.shape[-1]).contiguous().to(torch.float32)
        xtx = torch.matmul(flat.T, flat)
        if name in self.sums:
            self.sums[name].add_(xtx)
        else:
            self.sums[name] = xtx
        self.tokens[name] = self.tokens.get(name, 0) + flat.shape[0]

    def end_pass(self) -> None:
        self._last = None
        self._first_pass = False

    def hessians(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        names = list(names)
        missing = [n for n in names if n not in self.leader]
        if missing:
            raise ValueError(f"the calibration forward pass never reached layers {missing[:3]}")
        for leader, total in self.sums.items():
            total.mul_(2.0 / float(self.tokens[leader]))
        return {n: self.sums[self.leader[n]] for n in names}


def check_finite(weights: dict[str, torch.Tensor], hessians: dict[str, torch.Tensor]) -> None:
    """Refuse layers whose weight or Hessian holds a NaN or an infinity.

    Args:
        weights: {layer name: weight}.
        hessians: {layer name: Hessian}.

    Raises:
        ValueError: naming the first such layer.
    """
    for name, w in weights.items():
        if not (_all_finite(w) and _all_finite(hessians[name])):
            raise ValueError(
                f"layer {name!r} has a non-finite weight or calibration Hessian; fix: check the checkpoint (its "
                "weights, or activations overflowing on the calibration texts)"
            )


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite. A finite sum needs finite entries (a NaN or an infinity among them makes
    the sum NaN or infinite), and a float32 sum is one pass without a boolean copy; only a sum that overflows or
    meets a non-finite entry is checked entry by entry."""
    if bool(torch.isfinite(t.sum())):
        return True
    return bool(torch.isfinite(t).all())


def _longest_first(samples: Sequence[Sequence[int]]) -> list[Sequence[int]]:
    """The samples in the order gptqmodel accumulates them (longest first, ties in the given order), so the
    float sums, hence the Hessians, are its own bit for bit."""
    if not samples or any(len(s) == 0 for s in samples):
        raise ValueError("GPTQ calibration needs at least one non-empty calibration sample")
    return sorted(samples, key=len, reverse=True)


def _run_samples(model: nn.Module, samples: Sequence[Sequence[int]], after_each: Callable[[], None]) -> None:
    device = next(model.parameters()).device
    for ids in samples:
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
        with contextlib.suppress(_StopForward):
            model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False)
        after_each()


def _raise_stop(*args) -> None:
    raise _StopForward


@torch.no_grad()
def collect_hessians(
    model: nn.Module, layer_names: Iterable[str], samples: Sequence[Sequence[int]]
) -> dict[str, torch.Tensor]:
    """The shared convention's Hessians, ``H = (2 / n) sum_s X_s^T X_s`` for every layer named, from one forward pass
    per calibration sample (``X_s: [tokens_s, in_features]`` the layer's input, ``n`` the tokens it saw). The output
    head is not run unless it is named. The model is not changed.

    Args:
        model: the unquantized model.
        layer_names: nn.Linear modules of ``model``.
        samples: token-id lists, no padding.

    Returns:
        {name: H [in, in] float32}; layers that read the same input tensor (q/k/v, gate/up) map to the SAME tensor
        object.

    Raises:
        ValueError: no non-empty sample, or the forward pass never reaches a named layer or shares inputs
            inconsistently between samples.
    """
    names = list(layer_names)
    samples = _longest_first(samples)
    capture = _HessianCapture()
    handles = [model.get_submodule(n).register_forward_pre_hook(capture.hook(n)) for n in names]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and all(model.get_submodule(n) is not head for n in names):
        handles.append(head.register_forward_pre_hook(_raise_stop))
    try:
        _run_samples(model, samples, capture.end_pass)
    finally:
        for h in handles:
            h.remove()
    return capture.hessians(names)


# --------------------------------------------------------------------------------------------------
# Sequential


def _decoder_blocks(model: nn.Module, names: list[str]) -> list[tuple[str, nn.Module, list[str]]]:
    """(block name, block, its in-scope layers) for every block of the decoder up to the last one holding an
    in-scope layer, in the order the model runs them (a block without in-scope layers is run unchanged)."""
    prefixes = {}
    for name in names:
        match = BLOCK.match(name)
        if match is None:
            raise ValueError(
                f"sequential calibration quantizes decoder blocks; layer {name!r} is in none; fix: restrict modules= "
                "to the decoder blocks, or pass calibration='shared'"
            )
        prefixes.setdefault(match.group(1), []).append(name)
    containers = {p.rsplit(".", 1)[0] for p in prefixes}
    if len(containers) != 1:
        raise ValueError(
            f"sequential calibration needs the layers in one stack of blocks, got {sorted(containers)}; fix: "
            "restrict modules=, or pass calibration='shared'"
        )
    container = containers.pop()
    stack = model.get_submodule(container)
    if not isinstance(stack, nn.ModuleList):
        raise ValueError(
            f"{container!r} is a {type(stack).__name__}, not the list of decoder blocks; fix: calibration='shared'"
        )
    last = max(int(p.rsplit(".", 1)[1]) for p in prefixes)
    return [(f"{container}.{i}", stack[i], prefixes.get(f"{container}.{i}", [])) for i in range(last + 1)]


def _block_inputs(model: nn.Module, first: nn.Module, samples: Sequence[Sequence[int]]) -> list[tuple]:
    """The (args, kwargs) the model passes to its first decoder block, one per sample."""
    calls = []

    def grab(module, args, kwargs):
        calls.append((args, kwargs))
        raise _StopForward

    handle = first.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        _run_samples(model, samples, lambda: None)
    finally:
        handle.remove()
    return calls


def _run_block(block: nn.Module, call: tuple) -> torch.Tensor:
    out = block(*call[0], **call[1])
    return out[0] if isinstance(out, tuple) else out


def _next_call(call: tuple, hidden: torch.Tensor) -> tuple:
    args, kwargs = call
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def _subsets(model: nn.Module, block: nn.Module, names: list[str], call: tuple) -> list[list[str]]:
    """The block's in-scope layers grouped by the input they read, in the order the block runs them."""
    order: list[tuple[str, torch.Tensor]] = []
    handles = [
        model.get_submodule(n).register_forward_pre_hook(lambda m, a, n=n: order.append((n, a[0]))) for n in names
    ]
    try:
        _run_block(block, call)
    finally:
        for h in handles:
            h.remove()
    groups: list[tuple[list[str], torch.Tensor]] = []
    for name, x in order:
        if groups and x is groups[-1][1]:
            groups[-1][0].append(name)
        else:
            groups.append(([name], x))
    called = [n for g, _ in groups for n in g]
    if sorted(called) != sorted(names):
        raise ValueError(
            f"sequential calibration needs each layer called once per block, got {called[:8]}; fix: "
            "calibration='shared'"
        )
    return [g for g, _ in groups]


class _Replay:
    """Within: every linear layer of one decoder block keeps its output per calibration sample and gives it again
    while its weight and its input are the same. The sequential passes run a block once per group of layers and
    once more for the next block's inputs, and each pass recomputed every layer before the group it calibrates,
    although only the groups quantized since had changed. The same weight and input make the same float32 product,
    so what is given again is what the pass would compute, bit for bit (tested against gptqmodel): each layer's
    product is computed once per sample and weight. `forget` drops a layer's outputs once its weight is replaced;
    an input or output changed in place since is recomputed (tensor versions)."""

    def __init__(self, block: nn.Module):
        self.sample = 0
        self._layers = [m for m in block.modules() if isinstance(m, nn.Linear)]
        self._kept: dict[tuple[int, int], tuple] = {}

    def __enter__(self) -> _Replay:
        for module in self._layers:
            module.forward = functools.partial(self._forward, module, module.forward)
        return self

    def __exit__(self, *exc) -> None:
        for module in self._layers:
            del module.forward  # the class's own forward again
        self._kept.clear()

    def forget(self, module: nn.Module) -> None:
        self._kept = {k: v for k, v in self._kept.items() if k[0] != id(module)}

    def _forward(self, module: nn.Module, compute: Callable, x: torch.Tensor) -> torch.Tensor:
        key = (id(module), self.sample)
        kept = self._kept.get(key)
        if kept is not None:
            x0, x_version, y, y_version = kept
            same = x0._version == x_version and y._version == y_version and x.shape == x0.shape
            if same and torch.equal(x, x0):
                return y
        y = compute(x)
        self._kept[key] = (x, x._version, y, y._version)
        return y


def _subset_hessians(model: nn.Module, block: nn.Module, subset: list[str], calls: list[tuple], replay: _Replay):
    capture = _HessianCapture(stop_at=subset[-1])
    handles = [model.get_submodule(n).register_forward_pre_hook(capture.hook(n)) for n in subset]
    try:
        for replay.sample, call in enumerate(calls):
            with contextlib.suppress(_StopForward):
                _run_block(block, call)
            capture.end_pass()
    finally:
        for h in handles:
            h.remove()
    return capture.hessians(subset)


@torch.no_grad()
def quantize_sequential(
    model: nn.Module, layer_names: Iterable[str], samples: Sequence[Sequence[int]], spec: GPTQSpec, *, exact=False
) -> dict[str, GPTQLayerResult]:
    """The sequential convention: GPTQ on every layer named, each calibrated on the model as quantized so far (the
    module docstring). As it goes, each quantized layer's weight is set to ``s (q - z)`` with float32 scales (what
    gptqmodel runs the later layers on), so ``model`` is changed in place; the caller builds the final layers from
    the results.

    Args:
        model: the model.
        layer_names: nn.Linear modules inside its decoder blocks.
        samples: token-id lists of the calibration samples.
        spec: the solve's options.
        exact: gptqmodel's order of floating-point operations (bit-identical codes).

    Returns:
        {layer name: its codes, scales, zeros and group indices}.

    Raises:
        ValueError: a layer outside the decoder blocks, no non-empty sample, or a weight or a Hessian holding a NaN
            or an infinity.
    """
    names = list(layer_names)
    samples = _longest_first(samples)
    blocks = _decoder_blocks(model, names)
    calls = _block_inputs(model, blocks[0][1], samples)
    results: dict[str, GPTQLayerResult] = {}
    for index, (_, block, in_block) in enumerate(blocks):
        with _Replay(block) as replay:
            for subset in _subsets(model, block, in_block, calls[0]) if in_block else []:
                results.update(_quantize_subset(model, block, subset, calls, replay, spec, exact))
            if index + 1 < len(blocks):
                calls = [_next_call(call, _run_block(block, call)) for replay.sample, call in enumerate(calls)]
    return results


def _quantize_subset(model, block, subset: list[str], calls: list[tuple], replay: _Replay, spec, exact: bool) -> dict:
    """GPTQ on one group of a block's layers, calibrated on the block as quantized so far; each layer's weight is
    then its dequantized value (float32 scales), and its kept outputs are dropped."""
    hessians = _subset_hessians(model, block, subset, calls, replay)
    weights = {n: model.get_submodule(n).weight.detach() for n in subset}
    check_finite(weights, hessians)
    solved = solve_layers(weights, hessians, spec, exact=exact)
    for name, r in solved.items():
        module = model.get_submodule(name)
        module.weight.data = dequantize(r.codes, r.scales, r.zeros, r.g_idx, scale_dtype=torch.float32).to(
            module.weight.dtype
        )
        replay.forget(module)
    return solved
