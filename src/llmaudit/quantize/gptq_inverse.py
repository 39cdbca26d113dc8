"""The inverse Hessian factor of the GPTQ solve (``gptq_solver``): the damped Hessian's upper inverse Cholesky
factor, with gptqmodel's recovery when the Cholesky fails (the next damping of the grid, then a diagonal floor)."""

from __future__ import annotations

import math

import torch

__all__ = ["DAMP_FLOOR_ATTEMPTS", "inverse_hessian_factor"]

DAMP_FLOOR_ATTEMPTS = 6  # gptqmodel 7.6.0 GPTQ.hessian_inverse: max_floor_attempts


def _upper_inverse_factor(h: torch.Tensor, exact: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, ok) with U upper triangular, U^T U = h^-1, for h: [..., C, C]; ok: [...] bool (where not ok, U
    is meaningless). exact: gptqmodel's sequence (Cholesky, its inverse, the upper Cholesky of that: 4C^3/3
    flops). Otherwise, with J the reversal of the columns, h = V V^T for V = J chol(J h J) J (upper), so
    U = V^-1 = J chol(J h J)^-1 J: one Cholesky and one triangular inverse (C^3 flops, mostly matrix
    products); the same U up to rounding."""
    eye = torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)
    if exact:
        lower, info = torch.linalg.cholesky_ex(h, check_errors=False)
    else:
        lower, info = torch.linalg.cholesky_ex(h.flip(-1, -2), check_errors=False)
    ok = info == 0
    if not bool(ok.all()):  # a failed factor may hold zeros on its diagonal: invert the identity instead
        lower = torch.where(ok[..., None, None], lower, eye)
    if not exact:
        upper = _lower_triangular_inverse(lower).flip(-1, -2)
        return upper, ok & torch.isfinite(upper).all(dim=-1).all(dim=-1)
    inverse = torch.cholesky_inverse(lower)
    del lower
    upper, info2 = torch.linalg.cholesky_ex(inverse, upper=True, check_errors=False)
    return upper, ok & (info2 == 0)


def _lower_triangular_inverse(a: torch.Tensor, leaf: int = 192) -> torch.Tensor:
    """a^-1 for lower-triangular a: [..., n, n], by halves: [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1,
    C^-1]] (matrix products), triangular solves below ``leaf`` columns."""
    n = a.shape[-1]
    if n <= leaf:
        eye = torch.eye(n, dtype=a.dtype, device=a.device).expand_as(a)
        return torch.linalg.solve_triangular(a, eye, upper=False)
    k = n // 2
    a_inv = _lower_triangular_inverse(a[..., :k, :k], leaf)
    c_inv = _lower_triangular_inverse(a[..., k:, k:], leaf)
    out = torch.zeros_like(a)
    out[..., :k, :k] = a_inv
    out[..., k:, k:] = c_inv
    out[..., k:, :k] = -torch.matmul(torch.matmul(c_inv, a[..., k:, :k]), a_inv)
    return out


def _damp_grid(damp: float, increment: float) -> list[float]:
    values = [float(damp)]
    while increment > 0:
        nxt = values[-1] + increment  # repeated addition: the grid gptqmodel walks
        if not values[-1] < nxt < 1.0:
            break
        values.append(nxt)
    return values


def _recover_one(h: torch.Tensor, damp: float, increment: float, exact: bool) -> tuple[torch.Tensor, float]:
    """One Hessian whose damped Cholesky failed: walk the damping grid, then floor the diagonal (gptqmodel's
    recovery). Returns (U, damp), or (identity, 1.0) when nothing works (round to nearest)."""
    orig = h.diagonal().clone()
    scale = float(orig.abs().max())
    floor_base = (scale if math.isfinite(scale) and scale != 0.0 else 1.0) * 1e-6
    grid = _damp_grid(damp, increment)
    for attempt in range(DAMP_FLOOR_ATTEMPTS + 1):
        if attempt == 0:
            current = orig
        else:
            floor = floor_base * math.pow(10.0, attempt - 1)
            current = torch.clamp(orig + floor, min=floor)
        mean = torch.mean(current)
        for candidate in grid:
            trial = h.clone()
            trial.diagonal().copy_(current).add_(candidate * mean)
            upper, ok = _upper_inverse_factor(trial, exact)
            if bool(ok):
                return upper, candidate
    return torch.eye(h.shape[-1], dtype=h.dtype, device=h.device), 1.0


def inverse_hessian_factor(
    h: torch.Tensor, damp: float, increment: float, *, exact: bool = False
) -> tuple[torch.Tensor, list[float]]:
    """The upper inverse factor of the damped Hessians: U upper triangular with ``U^T U = (h + d mean(diag h) I)^-1`` for
    d = ``damp``, or for the first damping of the grid / diagonal floor that makes Cholesky succeed (``_recover_one``).
    ``h`` is used as the workspace: its diagonal is damped in place.

    Args:
        h: [L, C, C] the Hessians.
        damp: the damping fraction.
        increment: the step of the damping grid.
        exact: see ``_upper_inverse_factor``.

    Returns:
        (U [L, C, C], the damping each problem got).
    """
    diag = h.diagonal(dim1=-2, dim2=-1)
    orig = diag.clone()
    mean = torch.stack([torch.mean(orig[i]) for i in range(h.shape[0])])  # one matrix at a time, as gptqmodel
    diag.add_((damp * mean).unsqueeze(-1))
    upper, ok = _upper_inverse_factor(h, exact)
    damps = [float(damp)] * h.shape[0]
    for i in torch.nonzero(~ok).flatten().tolist():
        h[i].diagonal().copy_(orig[i])
        upper[i], damps[i] = _recover_one(h[i], damp, increment, exact)
    return upper, damps
