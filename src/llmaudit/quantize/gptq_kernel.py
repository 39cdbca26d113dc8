"""The column loop of one GPTQ block in gptqmodel's exact order of floating-point operations, compiled (numba).

Inside a block of the solve (``gptq_solver._block_solve``, at most 128 columns), each column in turn is rounded to
its group's grid and its error is spread over the block's later columns (docs/science.md, "GPTQ in llmaudit"). For
every row r of every problem l, with x the column as updated so far, s and z its group's scale and zero point and
U the block of the inverse Hessian factor, column i of the block does, in float32:

    q = min(max(rint(x / s) + z, 0), maxq)        (round half to even)
    e = (x - s * (q - z)) / U[i, i]
    w[k] = w[k] - U[i, k] * e    for every later column k of the block, one k after the other

which is, operation for operation, what the torch loop computes elementwise (``quantize_codes``, ``torch.sub``,
``div_`` and the in-place subtraction of the product): each operation is one IEEE float32 rounding, no fused
multiply-add (numba compiles without fast-math), so the codes and errors are the torch loop's bit for bit (tested
against it, and end to end against gptqmodel in tests/quantize/test_gptq_solver.py). What the torch loop pays per
column is a dozen tensor calls from Python (97,920 columns per bit width on SmolLM2-135M); here one call per block.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from .gptq_solver import GPTQSpec, group_params

__all__ = ["block_columns", "exact_block_solve", "warm_up"]


@numba.njit(cache=True, nogil=True)
def _block_columns(w, u, scales, zeros, group_of, maxq, codes, err):  # pragma: no cover (compiled)
    n_layers, n_cols, n_rows = w.shape
    top = np.float32(maxq)
    nought = np.float32(0.0)
    for layer in range(n_layers):
        for i in range(n_cols):
            p = group_of[i]
            d = u[layer, i, i]
            for r in range(n_rows):
                s = scales[layer, p, r]
                z = zeros[layer, p, r]
                x = w[layer, i, r]
                q = np.rint(x / s) + z
                if q < nought:
                    q = nought
                if q > top:
                    q = top
                codes[layer, i, r] = np.uint8(q)
                err[layer, i, r] = (x - s * (q - z)) / d
            for k in range(i + 1, n_cols):
                f = u[layer, i, k]
                for r in range(n_rows):
                    w[layer, k, r] = w[layer, k, r] - f * err[layer, i, r]


def block_columns(
    w: torch.Tensor, u: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_of: torch.Tensor, maxq: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact column loop of one block, for L problems at once.

    Args:
        w: [L, n, R] float32, the block's columns (one contiguous row per column) as the lazy updates left them;
            updated in place as the loop goes.
        u: [L, n, n] float32, the block's diagonal block of the upper inverse Hessian factor.
        scales: [L, P, R] float32, the scale of each of the P groups the block's columns belong to.
        zeros: [L, P, R] float32, their zero points.
        group_of: [n] int64, the group (index into P) of each column of the block.
        maxq: the largest code (2^bits - 1).

    Returns:
        (codes [L, n, R] uint8, errors [L, n, R] float32): each column's codes and its scaled error e.
    """
    if w.dtype != torch.float32 or u.dtype != torch.float32:
        raise TypeError(f"the exact GPTQ loop is float32, got {w.dtype} and {u.dtype}")
    wn = w.numpy()  # shares w's memory: the in-place updates land in w
    codes = np.empty(wn.shape, dtype=np.uint8)
    err = np.empty(wn.shape, dtype=np.float32)
    _block_columns(
        wn,
        np.ascontiguousarray(u.numpy()),
        np.ascontiguousarray(scales.numpy(), dtype=np.float32),
        np.ascontiguousarray(zeros.numpy(), dtype=np.float32),
        np.ascontiguousarray(group_of.numpy(), dtype=np.int64),
        int(maxq),
        codes,
        err,
    )
    return torch.from_numpy(codes), torch.from_numpy(err)


def exact_block_solve(wt: torch.Tensor, u: torch.Tensor, scale, zero, spec: GPTQSpec, out: dict):
    """``gptq_solver._block_solve(..., exact=True)`` with each block's column loop compiled (`block_columns`): the same
    codes, group parameters and lazy block updates bit for bit. The groups that start inside a block take their grid
    from ``wt`` as the previous blocks left it (the loop does not change ``wt``), so their parameters are computed
    before the loop, in the order the torch loop appends them.

    Args:
        wt: [L, C, R] float32, the weights transposed in the solve's column order (updated in place).
        u: [L, C, C] float32, the upper inverse Hessian factor.
        scale: the current group's scale.
        zero: the current group's zero point.
        spec: the solve's options.
        out: the solve's output: its "codes", "scales", "zeros" and "where" (filled in).

    Returns:
        (scale, zero) of the last group.
    """
    columns, g, bs = wt.shape[1], spec.group_size, spec.blocksize
    layers = torch.arange(wt.shape[0], device=wt.device)
    for i1 in range(0, columns, bs):
        i2 = min(i1 + bs, columns)
        grids, group_of = [(scale, zero)], []
        for col in range(i1, i2):
            if g != -1 and col % g == 0:
                scale, zero = group_params(wt[:, col : col + g].transpose(1, 2), spec.maxq, spec.sym)
                out["scales"].append(scale)
                out["zeros"].append(zero)
                grids.append((scale, zero))
            group_of.append(len(grids) - 1)
        codes, err1 = block_columns(
            wt[:, i1:i2].clone(),
            u[:, i1:i2, i1:i2].contiguous(),
            torch.stack([s for s, _ in grids], dim=1),
            torch.stack([z for _, z in grids], dim=1),
            torch.tensor(group_of, dtype=torch.long),
            spec.maxq,
        )
        out["codes"][layers[:, None], out["where"][:, i1:i2]] = codes
        wt[:, i2:] -= torch.matmul(u[:, i1:i2, i2:].transpose(1, 2), err1)
    return scale, zero


def warm_up() -> None:
    """Compile the loop now (from numba's on-disk cache after the first time on a machine), so that a measurement
    that follows times the arithmetic, not the compiler."""
    w = torch.ones(1, 2, 2)
    block_columns(
        w, torch.eye(2)[None], torch.ones(1, 1, 2), torch.zeros(1, 1, 2), torch.zeros(2, dtype=torch.long), 15
    )
