"""LLM.int8() on a CPU as bitsandbytes computes it, in fewer passes over memory: `Int8Linear`.

bitsandbytes' `Linear8bitLt` (eval mode, ``has_fp16_weights=False``) runs, for an input x [T, K] and the int8 weight
codes CB [N, K] with row scales SCB [N] (bitsandbytes 0.50, its CPU operators):

1. A = x in float16; with an outlier threshold t > 0, the entries with |A| >= t are outliers, the columns holding
   one are the outlier columns, and the outliers are set to 0 in A;
2. row statistics s_i = max_k |A_ik| (float32), codes CA = int8(round(A * (127 / s_i))), the outlier columns' codes
   set to 0 (when T > 1);
3. the exact int32 product CA CB^T (bitsandbytes' `int8_linear_matmul` operator: torch._int_mm with AVX-512);
4. y = int32 * (s_i * SCB_j) * 6.200124e-05 in float32, plus the bias, in x's dtype;
5. with outlier columns O: y + x[:, O] @ (CB[:, O] * SCB * 7.874015718698502e-3)^T in x's dtype (addmm).

`llm_int8` makes the same operations, each with the same operands in the same order, so every output is
bitsandbytes' bit for bit (tests/quantize/test_bnb_int8.py compares it with `Linear8bitLt` itself); what it
leaves out is bitsandbytes' bookkeeping around them: a copy and a restore of the outliers through boolean
indexing, the float32 temporaries of step 4 made one per operation, the bias cast in place on the module (a
forward that writes its module's state cannot run in two threads at once), and the autograd function.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor, nn

__all__ = ["Int8Linear", "llm_int8", "llm_int8_reference"]

INT8_DEQUANT_SCALE = 6.200124e-05
"""bitsandbytes' int8_mm_dequant factor, 1 / (127 * 127)."""
INT8_ROW_SCALE = 7.874015718698502e-3
"""bitsandbytes' int8_vectorwise_dequant factor, 1 / 127."""


@numba.njit(cache=True, nogil=True)
def _rows_kernel(a, limit, codes, peaks, in_column):  # pragma: no cover (compiled)
    """Steps 1-2 on a = the float16 activations as float32 [T, K] (exact), through their bit patterns (for x >= 0 the
    order of the int32 patterns is the order of the numbers, so the inner loops are integer maxima and selects,
    which compile to vector instructions without fast-math): outliers |a| >= the threshold (`limit`: its float16
    value's pattern, 0x7F800000 for none), each row's largest other |a| (`peaks`, patterns), the outlier columns;
    then codes rint(a * fl(fl(1 / s) * 127)), 0 in an outlier column (the outliers themselves among them). False at
    a NaN or an infinity, or a row whose maximum is 0 (left to the reference path)."""
    rows, width = a.shape
    bits = a.view(np.int32)
    mask = np.int32(0x7FFFFFFF)
    finite = np.int32(0x7F800000)
    for t in range(rows):
        peak = np.int32(0)
        every = np.int32(0)
        for k in range(width):
            m = bits[t, k] & mask
            out = m >= limit
            in_column[k] |= out
            every = max(every, m)
            peak = max(peak, np.int32(0) if out else m)
        if every >= finite or peak == 0:
            return False
        peaks[t] = peak
    stats = peaks.view(np.float32)
    one, top, zero = np.float32(1.0), np.float32(127.0), np.int8(0)
    for t in range(rows):
        scale = (one / stats[t]) * top  # torch's 127.0 / tensor: the reciprocal, then the product
        for k in range(width):
            q = np.int8(np.rint(a[t, k] * scale))
            codes[t, k] = zero if in_column[k] else q
    return True


@numba.njit(cache=True, nogil=True)
def _dequant_kernel(product, stats, scales, factor, bias, out):  # pragma: no cover (compiled)
    """Step 4: out = fl(fl(fl(float(p) * fl(s_i * SCB_j)) * factor) + bias_j), float32 [T, N]; `bias` of length 0:
    none, and nothing is added (adding zeros would turn a -0 into +0)."""
    rows, columns = product.shape
    if bias.shape[0] == 0:
        for t in range(rows):
            s = stats[t]
            for j in range(columns):
                out[t, j] = np.float32(product[t, j]) * (s * scales[j]) * factor
        return
    for t in range(rows):
        s = stats[t]
        for j in range(columns):
            out[t, j] = np.float32(product[t, j]) * (s * scales[j]) * factor + bias[j]


@numba.njit(cache=True, nogil=True)
def _to_bfloat16_bits(values, out):  # pragma: no cover (compiled)
    """float32 -> bfloat16 bit patterns, round to nearest even as torch rounds them (NaN: 0xFFFF, its vector path)."""
    bits = values.view(np.uint32)
    rows, columns = values.shape
    one, half, nan = np.uint32(1), np.uint32(0x7FFF), np.uint32(0xFFFF)
    for t in range(rows):
        for j in range(columns):
            u = bits[t, j]
            r = (u + (((u >> np.uint32(16)) & one) + half)) >> np.uint32(16)
            out[t, j] = np.uint16(nan if values[t, j] != values[t, j] else r)


def _threshold_bits(threshold: float) -> np.int32:
    """The threshold as bitsandbytes compares it (rounded to float16, its activations' dtype), as the int32 bit
    pattern of that value in float32; none (0): the pattern of infinity, which no finite |a| reaches."""
    value = torch.tensor(threshold, dtype=torch.float16).float() if threshold > 0 else torch.tensor(float("inf"))
    return np.int32(value.view(torch.int32).item())


def _quantize_rows_compiled(a: Tensor, threshold: float) -> tuple[Tensor, Tensor, Tensor | None] | None:
    """Steps 1-2 in two compiled passes per row; None where an activation is not finite or a row holds only
    outliers and zeros (left to the reference path, which gives what torch gives there)."""
    a32 = a.to(torch.float16).to(torch.float32).numpy()
    codes = np.empty(a32.shape, dtype=np.int8)
    peaks = np.empty(a32.shape[0], dtype=np.int32)
    in_column = np.zeros(a32.shape[1], dtype=np.bool_)
    if not _rows_kernel(a32, _threshold_bits(threshold), codes, peaks, in_column):
        return None
    stats = peaks.view(np.float32)
    cols = torch.from_numpy(np.flatnonzero(in_column)) if in_column.any() else None
    return torch.from_numpy(codes), torch.from_numpy(stats), cols


def _dequantize(product: Tensor, stats: Tensor, scales: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """Step 4 in one compiled pass (float32 or bfloat16 results; another dtype: the reference's operations)."""
    if dtype not in (torch.float32, torch.bfloat16):
        out = torch.outer(stats, scales).mul_(product).mul_(INT8_DEQUANT_SCALE)
        return (out if bias is None else out.add_(bias.to(dtype))).to(dtype)
    b = np.zeros(0, np.float32) if bias is None else bias.to(dtype).to(torch.float32).numpy()
    out = np.empty(tuple(product.shape), dtype=np.float32)
    _dequant_kernel(product.numpy(), stats.numpy(), scales.numpy(), np.float32(INT8_DEQUANT_SCALE), b, out)
    if dtype == torch.float32:
        return torch.from_numpy(out)
    bits = np.empty(out.shape, dtype=np.uint16)
    _to_bfloat16_bits(out, bits)
    return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)


def _quantize_rows(a: Tensor, threshold: float) -> tuple[Tensor, Tensor, Tensor | None]:
    """Steps 1 and 2 of the module docstring, with torch's operations: (CA int8 [T, K], s float32 [T], outlier
    columns or None)."""
    a16 = a.to(torch.float16)
    magnitude = a16.abs()
    cols = None
    if threshold > 0.0:
        outliers = magnitude >= threshold
        in_column = outliers.any(dim=0)
        if bool(in_column.any()):
            cols = torch.argwhere(in_column).view(-1)
            a16 = a16.masked_fill(outliers, 0)
            magnitude.masked_fill_(outliers, 0)
    stats = torch.amax(magnitude, dim=1).float()
    codes = torch.mul(a16, 127.0 / stats.unsqueeze(-1)).round_().to(torch.int8)
    if cols is not None and a.shape[0] > 1:
        codes[:, cols] = 0
    return codes, stats, cols


def llm_int8(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, threshold: float) -> Tensor:
    """bitsandbytes' LLM.int8() forward on a CPU (the module docstring), bit for bit: steps 1-2 and 4 compiled (one
    pass each), step 3 bitsandbytes' own operator, step 5 torch's addmm as bitsandbytes calls it.

    Args:
        x: [..., K] activations (float32, bfloat16 or float16).
        codes: [N, K] int8 weight codes (bitsandbytes' CB).
        scales: [N] float32 row scales (SCB).
        bias: [N] or None.
        threshold: the outlier threshold (0: none).

    Returns:
        [..., N] in x's dtype.
    """
    return _llm_int8(x, codes, scales, bias, threshold, compiled=x.device.type == "cpu")


def llm_int8_reference(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, threshold: float) -> Tensor:
    """`llm_int8` with torch's operations only (bitsandbytes' own, without its bookkeeping): what the compiled passes
    are tested against.

    Args:
        x: [..., K] activations.
        codes: [N, K] int8 weight codes.
        scales: [N] float32 row scales.
        bias: [N] or None.
        threshold: the outlier threshold (0: none).

    Returns:
        [..., N] in x's dtype.
    """
    return _llm_int8(x, codes, scales, bias, threshold, compiled=False)


def _llm_int8(x: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, threshold: float, *, compiled: bool):
    import bitsandbytes  # noqa: F401  (registers the torch.ops.bitsandbytes operators)

    a = x.reshape(-1, x.shape[-1])
    quantized = _quantize_rows_compiled(a, threshold) if compiled else None
    ca, stats, cols = quantized or _quantize_rows(a, threshold)
    product = torch.ops.bitsandbytes.int8_linear_matmul.default(ca, codes)
    if compiled:
        out = _dequantize(product, stats, scales, bias, x.dtype)
    else:
        out = torch.outer(stats, scales).mul_(product).mul_(INT8_DEQUANT_SCALE)
        out = (out if bias is None else out.add_(bias.to(x.dtype))).to(x.dtype)
    if cols is not None and cols.numel():
        weight = (codes[:, cols].contiguous() * scales.view(-1, 1) * INT8_ROW_SCALE).to(x.dtype)
        out = out.addmm(a[:, cols].contiguous(), weight.t())
    return out.view(*x.shape[:-1], codes.shape[0])


class Int8Linear(nn.Module):
    """A `bitsandbytes.nn.Linear8bitLt` at inference, computed by `llm_int8`: the same outputs bit for bit, and the
    same state dict (`weight` int8 codes, `SCB`, `weight_format`, `bias`), so a model's weight digest is unchanged.
    Its forward only reads the module (`stateless_forward`: safe in several threads at once)."""

    stateless_forward = True

    def __init__(self, codes: Tensor, scales: Tensor, bias: Tensor | None, threshold: float):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.threshold = float(threshold)
        self.register_buffer("weight", codes)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.register_buffer("SCB", scales)
        self.register_buffer("weight_format", torch.tensor(0, dtype=torch.uint8))  # bitsandbytes' "row" format

    @classmethod
    def from_bitsandbytes(cls, layer: nn.Module) -> Int8Linear:
        """The layer of a quantized ``Linear8bitLt``.

        Args:
            layer: the bitsandbytes layer, its weight already moved to the CPU (which quantizes it).

        Returns:
            The equivalent `Int8Linear`.
        """
        bias = None if layer.bias is None else layer.bias.data
        return cls(layer.weight.CB, layer.weight.SCB, bias, layer.state.threshold)

    def forward(self, x: Tensor) -> Tensor:
        """The layer's output (`llm_int8`).

        Args:
            x: [..., in_features] activations.

        Returns:
            [..., out_features] in x's dtype.
        """
        return llm_int8(x, self.weight, self.SCB, self.bias, self.threshold)

    def extra_repr(self) -> str:
        """The layer's description in ``repr``.

        Returns:
            Its widths and outlier threshold.
        """
        return f"in_features={self.in_features}, out_features={self.out_features}, threshold={self.threshold}"
