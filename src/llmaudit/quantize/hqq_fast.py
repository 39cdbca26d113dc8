"""HQQ (half-quadratic quantization) as pure tensor functions, bit-identical to hqq's ``HQQLinear`` on CPU.

``fake_quantize(W, nbits, group_size, axis, optimize)`` returns exactly (``torch.equal``) what hqq 0.2.8
computes for ``HQQLinear(linear, BaseQuantizeConfig(nbits, group_size, axis), compute_dtype=torch.float32,
device="cpu").dequantize()``, with ``optimize`` set in its weight parameters. The equations are in
docs/science.md ("HQQ, as computed"); in short, for ``W: [out, in]`` float32:

- groups ``V``: W reshaped to ``[out*in/g, g]`` (axis 1) or ``[g, out*in/g]`` (axis 0); each group is a
  line along ``axis``.
- per group: ``s = (2^b - 1) / (max - min)`` (1 where ``max - min <= 1e-4``, at most 2e4),
  ``z = -min * s``, rounded for b = 4 (hqq's config does that for 4 bits only).
- optimiser (hqq's ``optimize_weights_proximal_legacy``: p = 0.7, beta = 10, at most 20 steps, the scale
  fixed): ``Q = clamp(round(V s + z), 0, 2^b - 1)``, ``R = (Q - z) / s``, ``e = mean |V - R|`` over the whole
  tensor, ``E = shrink_p(V - R)``, ``z <- mean_axis(Q - (V - E) s)``; it stops after the first step whose
  ``e`` is not below the best so far, keeping that step's ``z``.
- codes ``Q = clamp(round(V s + z), 0, 2^b - 1)``; dequantized ``(Q - z) * (1 / s)``, reshaped to [out, in].

Where hqq's time goes (profiled on SmolLM2-135M, docs/results.md): not Python overhead but about 20 tensor
operations per step, each writing a fresh tensor (first-touched memory; on several threads, a barrier
each), and the power ``|x|^(p-1)`` inside the shrink, about 4 ns per element and step. Here instead:

- buffers reused across layers; axis-1 steps on chunks of rows that stay in cache;
- rows whose zero point stopped changing are dropped from later steps (a fixed point of their own step);
- the shrink only in the groups holding some ``|x| >= shrink_threshold()`` (below it the shrink is exactly 0);
- one thread (hundreds of small operations stall a loaded CPU at every multi-thread barrier).

Bit-identity, and why it holds: every elementwise operation is IEEE-exact (the same value at any position),
and a group's sum is the same in any tensor of groups and at any thread count. The rest depends on the
position of an element in hqq's full-tensor call or on hqq's thread count, and is reproduced: the power
(torch computes whole blocks of two vectors with a vectorized ``pow`` and the rest of each thread's range
with ``std::pow``, differing in the last bit for about 10% of inputs: ``pow_of_groups`` evaluates each
element with the loop hqq's call used there) and the tensor-wide mean of the early stop (``tensor_mean``:
each thread's range summed into a slot, the slots summed). Both splits are read off torch once per process
and thread count and verified, with a fallback to torch's own call at that count (`quantize.torch_replay`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from llmaudit.common.runtime import torch_threads

from .base import QuantizationError
from .torch_replay import pow_like_full_tensor, pow_of_groups, tensor_mean

__all__ = [
    "LP_NORM",
    "BETA",
    "ITERATIONS",
    "HQQCodes",
    "Workspace",
    "ProximalParams",
    "grouped",
    "initial_scale_zero",
    "shrink_lp",
    "shrink_threshold",
    "optimize_zero",
    "quantize",
    "fake_quantize",
    "pow_like_full_tensor",
    "pow_of_groups",
    "tensor_mean",
]

# hqq 0.2.8's defaults (optimize_weights_proximal_legacy's opt_params; Quantizer.quantize). A test checks
# them against the installed hqq, so an upgrade that changes them fails loudly instead of drifting.
LP_NORM = 0.7
BETA = 10.0
ITERATIONS = 20
SCALE_MAX = 2e4
MIN_RANGE = 1e-4
ROUND_ZERO_BITS = (4,)
SUPPORTED_BITS = (1, 2, 3, 4, 8)
# Margin below the shrink's exact threshold under which it is zero whatever the rounding of the power.
_ZERO_MARGIN = 0.9
# Elements per chunk of rows an optimiser step runs on (axis 1): its scratch stays in cache.
_CHUNK = 1 << 17
# Compact the rows still changing when fewer than this share of the active rows changed in a step.
_COMPACT = 0.8


@dataclass(frozen=True)
class HQQCodes:
    """One quantized matrix in hqq's grouped layout (R x C = out*in/g x g for axis 1, g x out*in/g for 0).

    codes: [R, C] float32 integers in [0, 2^nbits - 1]; scale: hqq's stored (dequantization) scale 1/s,
    zero: the zero point, both [R, 1] (axis 1) or [1, C] (axis 0); shape: the matrix's [out, in];
    steps: optimiser steps run (0 without the optimiser)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    shape: torch.Size
    steps: int

    def dequantize(self) -> torch.Tensor:
        """``(codes - zero) * scale`` reshaped to the weight's shape (hqq's Quantizer.dequantize).

        Returns:
            [out, in] float32.
        """
        return ((self.codes - self.zero) * self.scale).reshape(self.shape)


def grouped(weight: torch.Tensor, group_size: int, axis: int) -> torch.Tensor:
    """A view of a weight's row-major data in groups.

    Args:
        weight: [out, in].
        group_size: g.
        axis: 1 (groups of consecutive input columns) or 0.

    Returns:
        [out*in/g, g] (axis 1) or [g, out*in/g] (axis 0).

    Raises:
        ValueError: an axis other than 0 or 1, or a group size that does not divide the weight.
    """
    if axis not in (0, 1):
        raise ValueError(f"axis={axis!r}: HQQ groups along axis 0 or 1")
    if group_size <= 0 or weight.numel() % group_size:
        raise ValueError(
            f"group_size={group_size} does not divide the {weight.numel()} weights of {tuple(weight.shape)}"
        )
    return weight.reshape(-1, group_size) if axis == 1 else weight.reshape(group_size, -1)


def initial_scale_zero(groups: torch.Tensor, nbits: int, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The min-max start of the zero-point search; ``s`` maps a weight to code units (``w s + z``), its inverse is the
    stored scale.

    Args:
        groups: [R, C] the grouped weight.
        nbits: the code width.
        axis: the grouping axis.

    Returns:
        (s, z), each [R, 1] (axis 1) or [1, C] (axis 0).
    """
    lo = groups.amin(dim=axis, keepdim=True)  # the values of hqq's min/max (a tie of -0 and +0 aside,
    hi = groups.amax(dim=axis, keepdim=True)  # which changes no value downstream)
    max_code = round(2**nbits - 1)
    span = hi - lo
    scale = max_code / span
    scale = torch.where(span.abs() <= MIN_RANGE, torch.full_like(scale, 1.0), scale).clamp(max=SCALE_MAX)
    zero = -lo * scale
    if nbits in ROUND_ZERO_BITS:
        zero = torch.round(zero)
    return scale, zero


def shrink_lp(x: torch.Tensor, beta: float = BETA, lp_norm: float = LP_NORM) -> torch.Tensor:
    """The generalised soft threshold of the l_p (0 < p < 1) proximal step, elementwise:
    ``sign(x) * max(0, |x| - |x|^(p-1) / beta)``, with hqq's operation order. The reference form: the optimiser
    evaluates it only where it can be non-zero (``shrink_threshold``).

    Args:
        x: any shape.
        beta: the proximal weight.
        lp_norm: p.

    Returns:
        The same shape.
    """
    _check_lp(lp_norm)
    out = torch.abs(x)
    out.sub_((1.0 / beta) * out.pow(lp_norm - 1)).clamp_min_(0.0)
    return out.mul_(torch.sign(x))


def shrink_threshold(beta: float = BETA, lp_norm: float = LP_NORM) -> float:
    """A bound below which ``shrink_lp`` is exactly 0: 0.9 x the root a* = beta^(-1/(2-p)) of ``a - a^(p-1)/beta``.
    Below it ``a^(p-1)/beta >= 0.9^(p-2) a > 1.11 a``, far beyond the few ulps by which the power and the product may
    be rounded, so ``|x| - ...`` is negative and the clamp gives 0.

    Args:
        beta: the proximal weight.
        lp_norm: p.

    Returns:
        The bound.
    """
    _check_lp(lp_norm)
    return _ZERO_MARGIN * (1.0 / beta) ** (1.0 / (2.0 - lp_norm))


def _check_lp(lp_norm: float) -> None:
    if not 0.0 < lp_norm < 1.0:
        raise ValueError(f"lp_norm={lp_norm!r}: the shrink implemented here is hqq's for 0 < p < 1")


# --------------------------------------------------------------------------------------------------
# The optimiser and the quantizer


class Workspace:
    """Scratch tensors reused across layers (a fresh tensor per operation costs page faults), by name and
    shape: the full-size ``|x|`` of each layer shape and the chunk buffers of an optimiser step."""

    def __init__(self) -> None:
        self._tensors: dict[tuple, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The float32 buffer of a name and shape, allocated on first use and reused after.

        Args:
            name: the buffer's role.
            shape: its shape.

        Returns:
            The buffer (its contents are whatever was last written).
        """
        key = (name, tuple(shape))
        if key not in self._tensors:
            self._tensors[key] = torch.empty(shape, dtype=torch.float32)
        return self._tensors[key]


@dataclass(frozen=True)
class ProximalParams:
    """hqq's opt_params of ``optimize_weights_proximal_legacy``: the shrink's beta and p, and at most ``iters`` steps."""

    beta: float = BETA
    lp_norm: float = LP_NORM
    iters: int = ITERATIONS


_Params = tuple[float, float, float, int]  # (shrink bound, beta, p, the thread count hqq's calls run at)


@dataclass
class _Groups:
    """The groups an optimiser step runs on. Axis 1: the rows still changing, compacted (``index``: their
    rows in the tensor, sorted; None = all rows in order); axis 0: every column. ``v, s, z``: their
    weights, scales and zero points ([a, C], [a, 1], [a, 1] for axis 1; the whole tensor for axis 0)."""

    v: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor
    index: torch.Tensor | None = None


def _shrunk_target(
    work: tuple[torch.Tensor, ...],
    scale: torch.Tensor,
    axis: int,
    where: torch.Tensor,
    absdiff_full: torch.Tensor,
    params: _Params,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``Q - (V - shrink(x)) s`` for the groups of a chunk holding some ``|x| >= bound`` (where the shrink
    may be non-zero): (their indices within the chunk [h], their values [h, C] for axis 1 or [R, h] for
    axis 0); None when there is none. ``work = (V, Q, x = V - R, |x|)`` of the chunk; ``where``: the
    chunk's groups' indices in the tensor whose ``|x|`` is ``absdiff_full`` ([R, C]); ``params = (bound,
    beta, p, the thread count hqq's calls run at)``. Inside a picked group the shrink is computed for every
    element: where ``|x| < bound`` it is exactly 0 whatever the power's last bit."""
    groups, codes, diff, absdiff = work
    bound, beta, lp_norm, threads = params
    picked = (absdiff.amax(dim=axis) >= bound).nonzero().flatten()
    if picked.numel() == 0:
        return None
    dim = 1 - axis  # the dimension that indexes groups

    def pick(t: torch.Tensor) -> torch.Tensor:
        return torch.index_select(t, dim, picked)

    a = pick(absdiff)
    power = pow_of_groups(a, where[picked], tuple(absdiff_full.shape), axis, lp_norm - 1, absdiff_full, threads)
    shrunk = a.sub_((1.0 / beta) * power).clamp_min_(0.0).mul_(torch.sign(pick(diff)))
    return picked, pick(codes) - (pick(groups) - shrunk) * pick(scale)


def _step_chunk(
    g: _Groups,
    rows: slice,
    axis: int,
    absdiff: torch.Tensor,
    scratch: list[torch.Tensor],
    max_code: int,
    params: _Params,
) -> torch.Tensor:
    """One optimiser step on the groups ``rows`` of ``g`` (all of them for axis 0): writes their ``|x|``
    into ``absdiff`` (the tensor's [R, C]), updates their zero points in ``g.z`` (a chunk reads only its
    own) and returns which of them changed: [n] bool."""
    v, s, z = (g.v[rows], g.s[rows], g.z[rows]) if axis == 1 else (g.v, g.s, g.z)
    n = v.shape[0]
    scaled, codes, diff, mine = (t[:n] for t in scratch)
    if axis == 1:
        where = torch.arange(rows.start, rows.start + n) if g.index is None else g.index[rows]
        contiguous = g.index is None
    else:
        where, contiguous = torch.arange(v.shape[1]), True
    torch.mul(v, s, out=scaled)  # V s
    torch.add(scaled, z, out=codes).round_().clamp_(0, max_code)  # Q
    torch.sub(codes, z, out=diff)
    torch.addcdiv(v, diff, s, value=-1, out=diff)  # x = V - (Q - z) / s
    a = torch.abs(diff, out=absdiff[rows] if axis == 1 and contiguous else absdiff if axis == 0 else mine)
    if not contiguous:
        absdiff.index_copy_(0, where, a)
    patch = _shrunk_target((v, codes, diff, a), s, axis, where, absdiff, params)
    target = torch.sub(codes, scaled, out=codes)  # Q - (V - E) s with E = 0 ...
    if patch is not None:
        target.index_copy_(1 - axis, *patch)  # ... except in the groups where it may not be
    new = target.mean(dim=axis, keepdim=True)  # a group's sum does not depend on the thread count
    changed = (new != z).flatten()
    z.copy_(new)
    return changed


def _compacted(g: _Groups, changed: torch.Tensor) -> _Groups:
    """Axis 1: drop the rows whose zero point did not change. Such a row has reached a fixed point (its
    step is a function of its own V, s, z only), so every later step would give it the same Q, |x| and z;
    its |x| stays in the tensor-wide buffer for the error."""
    keep = changed.nonzero().flatten()
    index = keep if g.index is None else g.index[keep]
    return _Groups(*(torch.index_select(t, 0, keep) for t in (g.v, g.s, g.z)), index=index)


def optimize_zero(
    groups: torch.Tensor,
    scale: torch.Tensor,
    zero: torch.Tensor,
    max_code: int,
    axis: int,
    *,
    proximal: ProximalParams = ProximalParams(),
    workspace: Workspace | None = None,
    threads: int | None = None,
) -> tuple[torch.Tensor, int]:
    """hqq's half-quadratic zero-point refinement of one tensor (scale fixed), with its early stop, as hqq computes it at
    ``threads`` threads (the work itself runs on one).

    Args:
        groups: [R, C] the grouped weight.
        scale: [R, 1] | [1, C].
        zero: [R, 1] | [1, C], the start.
        max_code: the largest code.
        axis: the grouping axis.
        proximal: the proximal step's parameters (hqq's defaults).
        workspace: buffers reused across calls.
        threads: the thread count replayed (None: the current count).

    Returns:
        (zero like ``zero``, steps run).
    """
    workspace = workspace or Workspace()
    threads = threads or torch.get_num_threads()
    beta, lp_norm, iters = proximal.beta, proximal.lp_norm, proximal.iters
    params = (shrink_threshold(beta, lp_norm), beta, lp_norm, threads)
    zero = zero.clone()
    absdiff = workspace.get("absdiff", tuple(groups.shape))
    rows, columns = groups.shape
    per_chunk = max(1, _CHUNK // columns) if axis == 1 else rows
    scratch = [workspace.get(name, (min(per_chunk, rows), columns)) for name in ("scaled", "codes", "diff", "abs")]
    g = _Groups(groups, scale, zero)
    best, steps = math.inf, 0
    with torch_threads(1):  # small operations on a loaded CPU stall at every multi-thread barrier
        while steps < iters:
            steps += 1
            active = g.v.shape[0]
            changed = [
                _step_chunk(g, slice(b, min(active, b + per_chunk)), axis, absdiff, scratch, max_code, params)
                for b in range(0, active, per_chunk)
            ]  # empty once every row has reached its fixed point: the error then repeats and the loop stops
            if g.index is not None:
                zero.index_copy_(0, g.index, g.z)
            error = tensor_mean(absdiff, threads)  # mean |V - R| over the tensor, summed as hqq's call sums it
            if not error < best:
                break
            best = error
            if axis == 1 and active and int(sum(c.sum() for c in changed)) < _COMPACT * active:
                g = _compacted(g, torch.cat(changed))
    return zero, steps


def quantize(
    weight: torch.Tensor,
    nbits: int,
    group_size: int = 64,
    axis: int = 1,
    optimize: bool = True,
    *,
    workspace: Workspace | None = None,
) -> HQQCodes:
    """HQQ codes of a weight (computed in float32 on CPU), as hqq's ``Quantizer.quantize`` at the current thread count.
    Runs on one thread (a loaded CPU stalls at every multi-thread barrier of hundreds of small operations): every
    operation is exact elementwise arithmetic, a group's sum (the same at any thread count), or reproduced as the
    current count computes it (the power, the tensor-wide mean).

    Args:
        weight: [out, in].
        nbits: the code width.
        group_size: the group size.
        axis: the grouping axis.
        optimize: HQQ's zero-point refinement (False: min-max round to nearest).
        workspace: buffers reused across calls.

    Returns:
        The `HQQCodes`.

    Raises:
        QuantizationError: the weight holds a NaN or an infinity.
        ValueError: an unsupported code width, axis, or a group size that does not divide the weight.
    """
    if nbits not in SUPPORTED_BITS:
        raise ValueError(f"nbits={nbits!r}: HQQ here supports {list(SUPPORTED_BITS)}")
    threads = torch.get_num_threads()
    with torch_threads(1):
        w = weight.detach().to(device="cpu", dtype=torch.float32)
        groups = grouped(w, group_size, axis)
        scale, zero = initial_scale_zero(groups, nbits, axis)
        if not bool(torch.isfinite(scale).all() & torch.isfinite(zero).all()):
            raise QuantizationError(
                f"HQQ: the {tuple(weight.shape)} weight holds non-finite values (NaN or inf), which cannot be "
                "quantized; fix: the checkpoint is corrupt, restore or retrain it"
            )
        max_code = round(2**nbits - 1)
        steps = 0
        if optimize:
            zero, steps = optimize_zero(groups, scale, zero, max_code, axis, workspace=workspace, threads=threads)
            codes = torch.add(groups * scale, zero).round_().clamp_(0, max_code)
        else:
            codes = (groups * scale + zero).round_().clamp_(0, max_code)
        return HQQCodes(codes=codes, scale=1.0 / scale, zero=zero, shape=w.shape, steps=steps)


def fake_quantize(
    weight: torch.Tensor,
    nbits: int,
    group_size: int = 64,
    axis: int = 1,
    optimize: bool = True,
    *,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """The dequantized HQQ weight, equal to hqq's ``HQQLinear(...).dequantize()`` at compute dtype float32 on CPU, at the
    current thread count.

    Args:
        weight: [out, in].
        nbits: the code width.
        group_size: the group size.
        axis: the grouping axis.
        optimize: HQQ's zero-point refinement (False: min-max round to nearest).
        workspace: buffers reused across calls.

    Returns:
        [out, in] float32.

    Raises:
        QuantizationError: the weight holds a NaN or an infinity.
        ValueError: an unsupported code width, axis, or a group size that does not divide the weight.
    """
    codes = quantize(weight, nbits, group_size, axis, optimize, workspace=workspace)
    with torch_threads(1):
        return codes.dequantize()
