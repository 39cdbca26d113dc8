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
forward that writes its module's state cannot run in two threads at once), and the autograd function. Where step 3
is torch._int_mm, steps 1-4 run in blocks of rows whose buffers are reused (the outlier columns are still the
whole input's): an integer product is the same whatever the blocks, and a long batch's [T, N] int32 product is
never allocated whole.
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
BLOCK_ROWS = 512
"""Rows per block of the compiled path: a block's float16 copy, codes and int32 product stay a few MiB, reused from
block to block, where one int32 product of a long batch is tens of MiB of fresh pages on every call."""


@numba.njit(cache=True, nogil=True)
def _rows_kernel(a, limit, codes, peaks, in_column):  # pragma: no cover (compiled)
    """Steps 1-2 on a = the float16 activations as float32 [T, K] (exact), through their bit patterns (for x >= 0 the
    order of the int32 patterns is the order of the numbers, so the inner loops are integer maxima and selects,
    which compile to vector instructions without fast-math): outliers |a| >= the threshold (`limit`: its float16
    value's pattern, 0x7F800000 for none), each row's largest other |a| (`peaks`, patterns), the outlier columns
    (`in_column`, accumulated over calls); then codes rint(a * fl(fl(1 / s) * 127)), 0 in an outlier column found so
    far (the outliers themselves among them). False at a NaN or an infinity, or a row whose maximum is 0 (left to
    the reference path)."""
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
def _dequant_bfloat16_kernel(product, stats, scales, factor, bias, out):  # pragma: no cover (compiled)
    """Step 4 in bfloat16: each float32 result of `_dequant_kernel`, rounded to nearest even as torch casts it
    (NaN: 0xFFFF, its vector path), written as its bfloat16 bit pattern [T, N] in the same pass."""
    rows, columns = product.shape
    row = np.empty(columns, dtype=np.float32)
    bits = row.view(np.uint32)
    one, half, nan = np.uint32(1), np.uint32(0x7FFF), np.uint32(0xFFFF)
    for t in range(rows):
        s = stats[t]
        if bias.shape[0] == 0:
            for j in range(columns):
                row[j] = np.float32(product[t, j]) * (s * scales[j]) * factor
        else:
            for j in range(columns):
                row[j] = np.float32(product[t, j]) * (s * scales[j]) * factor + bias[j]
        for j in range(columns):
            u = bits[j]
            r = (u + (((u >> np.uint32(16)) & one) + half)) >> np.uint32(16)
            out[t, j] = np.uint16(nan if row[j] != row[j] else r)


def _threshold_bits(threshold: float) -> np.int32:
    """The threshold as bitsandbytes compares it (rounded to float16, its activations' dtype), as the int32 bit
    pattern of that value in float32; none (0): the pattern of infinity, which no finite |a| reaches."""
    value = torch.tensor(threshold, dtype=torch.float16).float() if threshold > 0 else torch.tensor(float("inf"))
    return np.int32(value.view(torch.int32).item())


def _product_is_int_mm() -> bool:
    """Whether bitsandbytes' CPU `int8_linear_matmul` is torch._int_mm here (its own condition: torch's CPU capability
    is AVX512). Then the compiled path computes the product block by block into one buffer: the same integers."""
    return torch.backends.cpu.get_cpu_capability() == "AVX512"


def _as_float16(rows: Tensor, half: Tensor, exact: Tensor) -> np.ndarray:
    """Step 1's cast of a block of rows: rounded to float16 as torch casts, then float32 (exact), in reused buffers.
    A bfloat16 block goes through float32 first (exact), whose cast to float16 is vectorized: the same rounding of
    the same value as torch's direct cast, which converts element by element."""
    n = rows.shape[0]
    if rows.dtype != torch.float16:
        exact[:n].copy_(rows)
        rows = exact[:n]
    half[:n].copy_(rows)
    exact[:n].copy_(half[:n])
    return exact[:n].numpy()


def _compiled(a: Tensor, codes: Tensor, scales: Tensor, bias: Tensor | None, threshold: float, dtype: torch.dtype):
    """Steps 1-4 compiled, in blocks of BLOCK_ROWS rows where the product is torch._int_mm (one block otherwise):
    each block's cast, statistics and codes; the outlier columns then zeroed in every row (they are the whole
    input's, as bitsandbytes finds them); then each block's product and dequantization into the output. Returns
    (out [T, N], outlier columns or None), or None where an activation is not finite or a row holds only outliers
    and zeros (left to the reference path, which gives what torch gives there)."""
    rows, width = a.shape
    step = BLOCK_ROWS if _product_is_int_mm() else max(rows, 1)
    blocks = [(start, min(start + step, rows)) for start in range(0, rows, step)]
    half = torch.empty((min(step, rows), width), dtype=torch.float16)
    exact = torch.empty(half.shape, dtype=torch.float32)
    ca, peaks, in_column = np.empty(a.shape, dtype=np.int8), np.empty(rows, np.int32), np.zeros(width, np.bool_)
    limit = _threshold_bits(threshold)
    for start, end in blocks:
        values = _as_float16(a[start:end], half, exact)
        if not _rows_kernel(values, limit, ca[start:end], peaks[start:end], in_column):
            return None
    cols = np.flatnonzero(in_column)
    ca[:, cols] = 0  # the outlier columns that later blocks found: the whole input's, as bitsandbytes finds them
    stats, codes_in = peaks.view(np.float32), torch.from_numpy(ca)
    product = torch.empty((half.shape[0], codes.shape[0]), dtype=torch.int32)
    out = torch.empty((rows, codes.shape[0]), dtype=dtype)
    b = np.zeros(0, np.float32) if bias is None else bias.to(dtype).to(torch.float32).numpy()
    for start, end in blocks:
        if step == BLOCK_ROWS:
            block_product = torch._int_mm(codes_in[start:end], codes.t(), out=product[: end - start])
        else:
            block_product = torch.ops.bitsandbytes.int8_linear_matmul.default(codes_in[start:end], codes)
        _dequantize_into(block_product, stats[start:end], scales, b, out[start:end])
    return out, (torch.from_numpy(cols) if cols.size else None)


def _dequantize_into(product: Tensor, stats: np.ndarray, scales: Tensor, bias: np.ndarray, out: Tensor) -> None:
    """Step 4 of a block in one compiled pass, written into `out` (float32, or bfloat16 through its bit patterns;
    `bias` as float32 after its cast to out's dtype, of length 0 for none; another dtype: the reference's
    operations)."""
    factor = np.float32(INT8_DEQUANT_SCALE)
    if out.dtype == torch.float32:
        _dequant_kernel(product.numpy(), stats, scales.numpy(), factor, bias, out.numpy())
    elif out.dtype == torch.bfloat16:
        bits = out.view(torch.int16).numpy().view(np.uint16)
        _dequant_bfloat16_kernel(product.numpy(), stats, scales.numpy(), factor, bias, bits)
    else:
        value = torch.outer(torch.from_numpy(stats), scales).mul_(product).mul_(INT8_DEQUANT_SCALE)
        out.copy_(value if bias.shape[0] == 0 else value.add_(torch.from_numpy(bias).to(out.dtype)))


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
    pass each, in blocks of rows), step 3 torch._int_mm where bitsandbytes' operator is torch._int_mm (its own
    operator otherwise), step 5 torch's addmm as bitsandbytes calls it.

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
    done = _compiled(a, codes, scales, bias, threshold, x.dtype) if compiled else None
    if done is not None:
        out, cols = done
    else:
        ca, stats, cols = _quantize_rows(a, threshold)
        product = torch.ops.bitsandbytes.int8_linear_matmul.default(ca, codes)
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
    large_temporaries = True  # its codes and output are the batch's size: scored with large blocks mapped

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
