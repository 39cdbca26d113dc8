"""GPTQ [Frantar2023] as pure tensor functions: the solve, batched over layers, given the Hessians
(``gptq_calibration`` collects them). The equations are in docs/science.md (section 3, "GPTQ in llmaudit").

What is reproduced. For one weight matrix ``W: [R, C]`` (R output rows, C input columns) and its Hessian
``H: [C, C]``, ``gptq_quantize`` computes the same integer codes, scales and zero points as gptqmodel
7.6.0's ``GPTQ.quantize`` with the options llmaudit passes (float32 math on the CPU, block size 128,
``mse = 0``, no static groups), including the defaults gptqmodel switches on without being asked:

- group-aware reordering (GAR, ``act_group_aware``; on whenever ``desc_act`` is off and groups exist):
  within each group the columns are sorted by decreasing ``diag(H)``, and the groups by their largest
  ``diag(H)``; groups keep their members, so ``g_idx`` stays ``column // group_size``;
- damping ``H + damp * mean(diag H) * I`` and, when its Cholesky fails, the next damping of the grid
  ``damp, damp + 0.01, ...`` (< 1), then a diagonal floor (6 attempts); when every attempt fails the layer
  is rounded to nearest with the same group parameters (gptqmodel's fail-safe, an identity inverse);
- dead columns (``H_jj = 0``): ``H_jj := 1`` and ``W[:, j] := 0`` before the solve;
- per-group scale and zero point found at the group's first column from the weights as updated so far
  (updated at 128-column block boundaries only, as in the reference implementation);
- ``group_size = -1``: one scale/zero per row, found from ``W`` before dead columns are zeroed.

Batching. Every operation of the solve is row-wise except the shared ``Hinv``, so the rows of layers that
read the same input (one Hessian: q/k/v; gate/up) are concatenated, and problems of the same shape (the
same kind of layer in every block) are stacked: ``W: [L, R, C]``, ``H: [L, C, C]``. The per-column loop
then runs once per kind of layer. Results are bit-identical to solving each layer alone (tested) as long as
the BLAS kernels compute each output row independently of the others, which the test checks.

Order of operations. ``exact=True`` follows gptqmodel's order of floating-point operations and gives its
codes bit for bit; the default reorders the same arithmetic for speed (sub-blocks with fused multiply-adds, a
reversed Cholesky for the inverse factor), which changes a code only at a rounding tie (measured in tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .gptq_inverse import inverse_hessian_factor

__all__ = [
    "GPTQSpec",
    "GPTQLayerResult",
    "group_params",
    "quantize_codes",
    "dequantize",
    "column_order",
    "inverse_hessian_factor",
    "InverseFactor",
    "factor_key",
    "prepare_factor",
    "gptq_quantize",
    "solve_layers",
]

SUB_BLOCK = 16  # columns per elementwise sub-block of the fast solve (benchmarks/bench_gptq.py)


@dataclass(frozen=True)
class GPTQSpec:
    """The options of one GPTQ solve.

    bits: code width (2..8). group_size: input columns per scale/zero, or -1 for one group per row.
    sym: symmetric grid (zero point fixed at (2^bits)/2). desc_act: quantize columns by decreasing
    ``diag(H)`` (groups follow that order, so ``g_idx`` is a permutation). act_group_aware: gptqmodel's
    group-aware reordering; it only applies with groups and without desc_act. damp_percent: relative
    damping of ``diag(H)``; damp_auto_increment: the step of the damping grid tried when Cholesky fails.
    blocksize: columns per lazy block update (gptqmodel: 128)."""

    bits: int
    group_size: int = 128
    sym: bool = True
    desc_act: bool = False
    act_group_aware: bool = True
    damp_percent: float = 0.05
    damp_auto_increment: float = 0.01
    blocksize: int = 128

    def __post_init__(self):
        if not 1 <= self.bits <= 8:
            raise ValueError(f"bits={self.bits} must be in 1..8")
        if self.group_size != -1 and self.group_size <= 0:
            raise ValueError(f"group_size={self.group_size} must be -1 or positive")
        if not 0 < self.damp_percent < 1:
            raise ValueError(f"damp_percent={self.damp_percent} must be in (0, 1)")

    @property
    def maxq(self) -> int:
        """The largest code, 2^bits - 1."""
        return 2**self.bits - 1

    @property
    def ordering(self) -> str:
        """'desc_act', 'group_aware' or 'natural': the column order of the solve."""
        if self.desc_act:
            return "desc_act"
        if self.act_group_aware and self.group_size > 0:
            return "group_aware"
        return "natural"


@dataclass
class GPTQLayerResult:
    """One quantized layer. codes: [R, C] uint8 in [0, 2^bits - 1]; scales, zeros: [R, G] float32 (zeros
    are integers); g_idx: [C] int32, the group of each input column (G = C / group_size, or 1 with
    group_size = -1); damp: the damping used (1.0 = the solve failed and the layer is rounded to nearest)."""

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    damp: float

    def weight(self, scale_dtype: torch.dtype = torch.float16, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantized weight (see ``dequantize``).

        Args:
            scale_dtype: the dtype the scales are rounded to first.
            dtype: the dtype the product is computed in.

        Returns:
            [R, C].
        """
        return dequantize(self.codes, self.scales, self.zeros, self.g_idx, scale_dtype=scale_dtype, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# The quantization grid


def group_params(x: torch.Tensor, maxq: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Min/max grid of each row of a group.

    xmin = min(min_j x_j, 0), xmax = max(max_j x_j, 0); symmetric: xmax = max(|xmin|, xmax) and xmin = -xmax where
    xmin < 0; a row that is all zero gets [-1, 1]. scale = (xmax - xmin) / maxq; zero = (maxq + 1) / 2 (symmetric)
    or round(-xmin / scale) (asymmetric).

    Args:
        x: [..., R, g] the group's weights.
        maxq: the largest code.
        sym: symmetric grid.

    Returns:
        (scale, zero), each [..., R].
    """
    zero_ = torch.zeros((), dtype=x.dtype, device=x.device)
    xmin = torch.minimum(x.amin(dim=-1), zero_)
    xmax = torch.maximum(x.amax(dim=-1), zero_)
    if sym:
        xmax = torch.maximum(torch.abs(xmin), xmax)
        xmin = torch.where(xmin < 0, -xmax, xmin)
    both_zero = (xmin == 0) & (xmax == 0)
    xmin = torch.where(both_zero, -1.0, xmin)
    xmax = torch.where(both_zero, 1.0, xmax)
    scale = (xmax - xmin) / maxq
    zero = torch.full_like(scale, (maxq + 1) / 2) if sym else torch.round(-xmin / scale)
    return scale, zero


def quantize_codes(x: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """``clamp(round(x / scale) + zero, 0, maxq)`` (round half to even), broadcast.

    Args:
        x: the weights.
        scale: the scales.
        zero: the zero points.
        maxq: the largest code.

    Returns:
        The codes, as floats.
    """
    return torch.clamp(torch.round(x / scale) + zero, 0, maxq)


def dequantize(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    *,
    scale_dtype: torch.dtype = torch.float16,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``W[r, c] = s[r, g_idx[c]] * (codes[r, c] - zeros[r, g_idx[c]])`` computed in ``dtype``, with the scales first
    rounded to ``scale_dtype`` (gptqmodel stores them in float16). Reading gptqmodel's CPU checkpoint (scales loaded
    as bfloat16, the product in bfloat16) is ``scale_dtype=float16`` then ``bfloat16``: pass ``dtype=torch.bfloat16``
    after rounding the scales to bfloat16 (see the tests).

    Args:
        codes: [R, C].
        scales: [R, G].
        zeros: [R, G].
        g_idx: [C] the group of each column.
        scale_dtype: the dtype the scales are rounded to first.
        dtype: the dtype the product is computed in.

    Returns:
        [R, C].
    """
    s, z, g = scales.to(scale_dtype).to(dtype), zeros.to(dtype), g_idx.long()
    (rows, columns), groups = codes.shape, s.shape[1]
    if columns % groups == 0 and torch.equal(g, torch.arange(columns, device=g.device) // (columns // groups)):
        # contiguous groups: the same products, each group's scale broadcast instead of gathered per column
        q = codes.to(dtype).view(rows, groups, columns // groups)
        return (s.unsqueeze(-1) * (q - z.unsqueeze(-1))).view(rows, columns)
    return s[:, g] * (codes.to(dtype) - z[:, g])


# --------------------------------------------------------------------------------------------------
# Column order and the inverse Hessian factor


def column_order(diag: torch.Tensor, spec: GPTQSpec) -> torch.Tensor | None:
    """The order in which columns are quantized. desc_act: decreasing diag. Group-aware: each full group sorted by
    decreasing diag, groups by their largest diag (stable), a partial last group left in place.

    Args:
        diag: [L, C] the Hessians' diagonals.
        spec: the solve's options.

    Returns:
        perm [L, C] (perm[new] = old), or None for the natural order.
    """
    if spec.ordering == "desc_act":
        return torch.argsort(diag, dim=-1, descending=True)
    if spec.ordering == "natural":
        return None
    n_layers, columns = diag.shape
    g = spec.group_size
    n_groups = columns // g
    values, local = torch.sort(diag[:, : n_groups * g].reshape(n_layers, n_groups, g), dim=-1, descending=True)
    groups = torch.argsort(values[..., 0], dim=-1, descending=True, stable=True)  # [L, G]
    base = (torch.arange(n_groups, device=diag.device) * g).view(1, n_groups, 1)
    perm = torch.gather(local + base, 1, groups.unsqueeze(-1).expand(-1, -1, g)).reshape(n_layers, -1)
    tail = torch.arange(n_groups * g, columns, device=diag.device).expand(n_layers, -1)
    return torch.cat([perm, tail], dim=1)


# --------------------------------------------------------------------------------------------------
# The solve


def _block_solve(wt: torch.Tensor, u: torch.Tensor, scale, zero, spec: GPTQSpec, out: dict, *, exact: bool):
    """The column loop with lazy block updates, batched over L, on the TRANSPOSED weights (one column = one
    contiguous row): wt: [L, C, R] in the solve's column order (updated in place), u: [L, C, C]. Writes the
    codes of solve column k to out['codes'][:, out['where'][:, k]] ([L, C, R], original column order) and
    appends the group parameters ([L, R]) to out['scales'] / out['zeros'].

    exact: gptqmodel's order of operations (inside a 128-column block every column updates the rest of the
    block elementwise, ``w - u * delta``), bit for bit. Otherwise sub-blocks of ``SUB_BLOCK`` columns: the
    elementwise updates stay inside a sub-block (fused multiply-add) and reach the rest of the block through
    one matrix product per sub-block; the same arithmetic in another order (agreement measured in tests)."""
    columns, g, bs = wt.shape[1], spec.group_size, spec.blocksize
    sub = bs if exact else SUB_BLOCK
    layers = torch.arange(wt.shape[0], device=wt.device)
    for i1 in range(0, columns, bs):
        i2 = min(i1 + bs, columns)
        w1 = wt[:, i1:i2].clone()
        err1 = torch.empty_like(w1)
        u1 = u[:, i1:i2, i1:i2]
        for j1 in range(0, i2 - i1, sub):
            j2 = min(j1 + sub, i2 - i1)
            for i in range(j1, j2):
                col = i1 + i
                if g != -1 and col % g == 0:
                    scale, zero = group_params(wt[:, col : col + g].transpose(1, 2), spec.maxq, spec.sym)
                    out["scales"].append(scale)
                    out["zeros"].append(zero)
                x = w1[:, i]
                code = quantize_codes(x, scale, zero, spec.maxq)
                out["codes"][layers, out["where"][:, col]] = code.to(out["codes"].dtype)
                delta = err1[:, i]
                torch.sub(x, scale * (code - zero), out=delta)
                delta.div_(u1[:, i, i].unsqueeze(-1))
                if exact:
                    w1[:, i + 1 : j2] -= u1[:, i, i + 1 : j2].unsqueeze(-1) * delta.unsqueeze(1)
                else:
                    w1[:, i + 1 : j2].addcmul_(u1[:, i, i + 1 : j2].unsqueeze(-1), delta.unsqueeze(1), value=-1)
            if j2 < i2 - i1:
                w1[:, j2:] -= torch.matmul(u1[:, j1:j2, j2:].transpose(1, 2), err1[:, j1:j2])
        wt[:, i2:] -= torch.matmul(u[:, i1:i2, i2:].transpose(1, 2), err1)
    return scale, zero


@dataclass
class InverseFactor:
    """What the solve takes from the Hessians alone, for L problems: dead: [L, C] bool (H_jj = 0);
    perm: [L, C] column order (perm[new] = old) or None; u: [L, C, C] upper inverse factor of the damped,
    permuted Hessian; damps: the damping of each problem. Shared by every bit width with the same
    ``factor_key``."""

    dead: torch.Tensor
    perm: torch.Tensor | None
    u: torch.Tensor
    damps: list[float]


def factor_key(spec: GPTQSpec, exact: bool = False) -> tuple:
    """What an InverseFactor depends on besides the Hessians: column order, damping, the exact sequence.

    Args:
        spec: the solve's options.
        exact: gptqmodel's order of floating-point operations.

    Returns:
        A hashable key.
    """
    group = spec.group_size if spec.ordering == "group_aware" else None
    return (spec.ordering, group, float(spec.damp_percent), float(spec.damp_auto_increment), bool(exact))


def prepare_factor(
    hessian: torch.Tensor, spec: GPTQSpec, *, exact: bool = False, inplace: bool = False
) -> InverseFactor:
    """The inverse factor of the solve: dead columns get H_jj = 1, the columns are put in the solve's order, and the
    damped Hessian is inverted (``inverse_hessian_factor``).

    Args:
        hessian: [L, C, C].
        spec: the solve's options.
        exact: gptqmodel's order of floating-point operations.
        inplace: use ``hessian`` as the workspace (it is not modified otherwise).

    Returns:
        The `InverseFactor`.
    """
    if hessian.dim() != 3 or hessian.shape[1] != hessian.shape[2]:
        raise ValueError(f"hessian [L, C, C] expected, got {tuple(hessian.shape)}")
    h = hessian.to(torch.float32, copy=not inplace)
    diag = h.diagonal(dim1=-2, dim2=-1)
    dead = diag == 0
    diag.masked_fill_(dead, 1.0)
    perm = column_order(diag.clone(), spec)
    del diag
    if perm is not None:  # H[perm][:, perm]: the same entries moved, whole rows at a time
        h = torch.stack([h[i].index_select(0, p).index_select(1, p) for i, p in enumerate(perm)])
    u, damps = inverse_hessian_factor(h, spec.damp_percent, spec.damp_auto_increment, exact=exact)
    return InverseFactor(dead, perm, u, damps)


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor | None,
    spec: GPTQSpec,
    *,
    factor: InverseFactor | None = None,
    exact: bool = False,
    transposed: bool = False,
) -> list[GPTQLayerResult]:
    """GPTQ on L independent problems, in the original column order.

    Args:
        weight: [L, R, C] (or [L, C, R] with ``transposed``, then used as the workspace).
        hessian: [L, C, C] (not modified), or None when ``factor`` is given.
        spec: the solve's options.
        factor: the Hessians' ``prepare_factor``.
        exact: gptqmodel's order of floating-point operations (bit-identical codes); see ``_block_solve``.
        transposed: ``weight`` is [L, C, R].

    Returns:
        L results (codes [R, C], scales/zeros [R, G], g_idx [C]).
    """
    if factor is None:
        if hessian is None or hessian.dim() != 3:
            raise ValueError(f"hessian [L, C, C] expected, got {None if hessian is None else tuple(hessian.shape)}")
        factor = prepare_factor(hessian, spec, exact=exact)
    wt = weight.to(torch.float32) if transposed else weight.to(torch.float32).transpose(1, 2).contiguous()
    n_layers, columns, rows = wt.shape
    if factor.u.shape != (n_layers, columns, columns):
        raise ValueError(f"weight {tuple(weight.shape)} does not fit the Hessians {tuple(factor.u.shape)}")
    row_scale, row_zero = group_params(wt.transpose(1, 2), spec.maxq, spec.sym)  # used when group_size == -1
    wt.masked_fill_(factor.dead.unsqueeze(-1), 0.0)
    perm = factor.perm
    if perm is None:
        where = torch.arange(columns, device=wt.device).expand(n_layers, -1)
    else:
        wt = torch.stack([wt[i].index_select(0, perm[i]) for i in range(n_layers)])
        where = perm
    out = {"codes": torch.empty(n_layers, columns, rows, dtype=torch.uint8, device=wt.device), "where": where}
    out["scales"], out["zeros"] = [], []
    if exact and wt.device.type == "cpu":  # the same loop compiled: one call per block, not a dozen per column
        from .gptq_kernel import exact_block_solve

        scale, zero = exact_block_solve(wt, factor.u, row_scale, row_zero, spec, out)
    else:
        scale, zero = _block_solve(wt, factor.u, row_scale, row_zero, spec, out, exact=exact)
    del wt
    scales = torch.stack(out["scales"] or [scale], dim=-1)
    zeros = torch.stack(out["zeros"] or [zero], dim=-1)
    g_idx = _group_index(scales, zeros, perm, spec, columns)
    return [
        GPTQLayerResult(out["codes"][i].T.contiguous(), scales[i], zeros[i], g_idx[i], factor.damps[i])
        for i in range(n_layers)
    ]


def _group_index(scales: torch.Tensor, zeros: torch.Tensor, perm, spec: GPTQSpec, columns: int) -> torch.Tensor:
    """The group of each original column ([L, C] int32); with group-aware ordering the groups keep their
    members, so scales/zeros ([L, R, G], in solve order) are put back in group order in place."""
    n_layers = scales.shape[0]
    g = columns if spec.group_size == -1 else spec.group_size
    position = torch.arange(columns, device=scales.device).expand(n_layers, -1)
    if perm is None:
        return (position // g).to(torch.int32)
    if spec.ordering == "desc_act":
        return (torch.argsort(perm, dim=-1) // g).to(torch.int32)  # column c was quantized at argsort(perm)[c]
    solved_group = perm[:, ::g][:, : scales.shape[-1]] // g  # [L, G]: original group of the solve's group k
    order = torch.argsort(solved_group, dim=-1).unsqueeze(1).expand(-1, scales.shape[1], -1)
    scales.copy_(torch.gather(scales, 2, order))
    zeros.copy_(torch.gather(zeros, 2, order))
    return (position // g).to(torch.int32)


def solve_layers(
    weights: dict[str, torch.Tensor],
    hessians: dict[str, torch.Tensor],
    spec: GPTQSpec,
    *,
    max_batch_bytes: int = 1 << 29,
    exact: bool = False,
    factor_cache: dict | None = None,
) -> dict[str, GPTQLayerResult]:
    """GPTQ for many layers at once. Rows of layers sharing a Hessian are concatenated into one problem; problems of
    the same shape are stacked and solved together.

    Args:
        weights: {name: W [R_n, C_n]}.
        hessians: {name: H [C_n, C_n]}, layers that read the same input mapping to the same tensor object (as
            ``collect_hessians`` returns).
        spec: the solve's options.
        max_batch_bytes: the most bytes of weights and Hessians per batch.
        exact: gptqmodel's order of floating-point operations.
        factor_cache: a dict kept by the caller across calls on the same Hessians (e.g. gptq-4 then gptq-8): the
            inverse factors are computed once per column order and damping.

    Returns:
        {name: `GPTQLayerResult`}.
    """
    results: dict[str, GPTQLayerResult] = {}
    for chunk in _batches(weights, hessians, max_batch_bytes):
        h_refs = tuple(hessians[members[0]] for members in chunk)
        factor = _cached_factor(factor_cache, h_refs, spec, exact)
        wt = torch.stack([torch.cat([weights[n].to(torch.float32) for n in members]).T for members in chunk])
        for members, solved in zip(chunk, gptq_quantize(wt, None, spec, factor=factor, exact=exact, transposed=True)):
            _split_rows(members, weights, solved, results)
    return results


def _batches(weights: dict, hessians: dict, max_batch_bytes: int) -> list[list[list[str]]]:
    """Problems (lists of layer names sharing one Hessian), grouped by shape into batches."""
    problems: dict[int, list[str]] = {}
    for name in weights:
        problems.setdefault(id(hessians[name]), []).append(name)
    by_shape: dict[tuple[int, int], list[list[str]]] = {}
    for members in problems.values():
        rows = sum(weights[n].shape[0] for n in members)
        by_shape.setdefault((rows, weights[members[0]].shape[1]), []).append(members)
    batches = []
    for (rows, columns), groups in by_shape.items():
        per_problem = 4 * (rows * columns + columns * columns) * 4  # weights, Hessian and their working copies
        step = max(1, max_batch_bytes // per_problem)
        batches.extend(groups[start : start + step] for start in range(0, len(groups), step))
    return batches


def _cached_factor(cache: dict | None, h_refs: tuple, spec: GPTQSpec, exact: bool) -> InverseFactor:
    key = (tuple(id(h) for h in h_refs), factor_key(spec, exact))
    if cache is not None and key in cache and all(a is b for a, b in zip(cache[key][0], h_refs)):
        return cache[key][1]
    factor = prepare_factor(torch.stack([h.to(torch.float32) for h in h_refs]), spec, exact=exact, inplace=True)
    if cache is not None:
        cache[key] = (h_refs, factor)  # holding the Hessians keeps their ids from being reused
    return factor


def _split_rows(members: list[str], weights, solved: GPTQLayerResult, results: dict) -> None:
    start = 0
    for name in members:
        stop = start + weights[name].shape[0]
        results[name] = GPTQLayerResult(
            solved.codes[start:stop].clone(),
            solved.scales[start:stop].clone(),
            solved.zeros[start:stop].clone(),
            solved.g_idx.clone(),
            solved.damp,
        )
        start = stop
