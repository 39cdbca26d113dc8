"""torch's CPU power and mean, element by element as a full-tensor call computes them (for `hqq_fast`).

torch's elementwise CPU ``pow`` computes whole blocks of two vectors with a vectorized loop and the rest of each
thread's range with ``std::pow``, which differ in the last bit for about 10% of inputs; its CPU ``mean`` sums each
thread's range into a slot, then the slots. ``pow_of_groups`` and ``tensor_mean`` reproduce both at a given thread
count, for some groups of a tensor or on one thread; the splits are read off torch once per process and thread count
and verified, with a fallback to torch's own call at that count.
"""

from __future__ import annotations

import functools

import torch

from llmaudit.common.runtime import torch_threads

# at::internal::GRAIN_SIZE: an elementwise kernel over more elements is split between threads.
_GRAIN = 32768


def _scalar_zones(numel: int, threads: int, block: int) -> list[tuple[int, int]]:
    """The [begin, end) stretches of a contiguous ``numel``-element tensor that torch's elementwise CPU kernel
    computes with its scalar loop: each thread range's tail after its last whole block of the vectorized
    loop. One range at or below the grain size or with one thread, else ``min(threads, ceil(n / grain))``
    ranges of ``ceil(n / ranges)`` elements (at::parallel_for's split)."""
    ranges = 1 if numel <= _GRAIN or threads <= 1 else min(threads, -(-numel // _GRAIN))
    chunk = -(-numel // ranges)
    zones = []
    for begin in range(0, numel, chunk):
        end = min(numel, begin + chunk)
        vector_end = begin + (end - begin) // block * block
        if vector_end < end:
            zones.append((vector_end, end))
    return zones


def _pow_scalar_loop(values: torch.Tensor, exponent: float) -> torch.Tensor:
    """``values ** exponent`` through the kernel's scalar loop (a strided input is never vectorized)."""
    spread = torch.empty(2 * values.numel(), dtype=values.dtype)
    spread[::2] = values
    return spread[::2].pow(exponent)


def _pow_vector_loop(values: torch.Tensor, exponent: float, block: int) -> torch.Tensor:
    """``values ** exponent`` through the kernel's vectorized loop only: padded to whole blocks, then in
    pieces whose every thread range is whole blocks: ``threads x grain`` elements (each thread gets exactly
    ``grain``), the rest in pieces shorter than the grain (one range)."""
    n = values.numel()
    if n % block:
        padded = torch.ones(-(-n // block) * block, dtype=values.dtype)
        padded[:n] = values
    else:
        padded = values.reshape(-1)
    out = torch.empty_like(padded)
    wide = torch.get_num_threads() * _GRAIN if _GRAIN % block == 0 else 0
    begin = 0
    if wide:
        for begin in range(0, padded.numel() - wide + 1, wide):
            torch.pow(padded[begin : begin + wide], exponent, out=out[begin : begin + wide])
        begin = padded.numel() - padded.numel() % wide
    narrow = (_GRAIN // block - 1) * block
    for i in range(begin, padded.numel(), narrow):
        torch.pow(padded[i : i + narrow], exponent, out=out[i : i + narrow])
    return out[:n]


@functools.cache
def _pow_block(exponent: float, threads: int) -> int | None:
    """The width of the vectorized loop's block (2 vectors) of ``pow`` on this machine, verified against
    torch's own split at ``threads`` threads; None where it cannot be read off or does not verify."""
    with torch_threads(threads):
        probe = torch.linspace(0.01, 4.0, 4096)
        vector = probe.pow(exponent)  # 4096 elements: one range of whole blocks
        differ = (vector != _pow_scalar_loop(probe, exponent)).nonzero().flatten()
        if differ.numel() == 0:
            return None
        value, vector_result = float(probe[int(differ[0])]), vector[int(differ[0])]
        sizes = range(1, 513)
        block = next((n for n in sizes if torch.full((n,), value).pow(exponent)[-1] == vector_result), None)
        if block is None:
            return None
        for numel in (block - 1, 3 * block + 5, 2 * _GRAIN + 3 * block + 7, 3 * _GRAIN + 11):
            seen = torch.full((numel,), value).pow(exponent) == vector_result
            expected = torch.ones(numel, dtype=torch.bool)
            for begin, end in _scalar_zones(numel, threads, block):
                expected[begin:end] = False
            if not torch.equal(seen, expected):
                return None
    return block


def pow_like_full_tensor(
    values: torch.Tensor,
    flat_index: torch.Tensor,
    numel: int,
    exponent: float,
    full: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """``values ** exponent`` exactly as ``full.pow(exponent)`` computes it at ``flat_index`` of a contiguous float32
    tensor of ``numel`` elements at ``threads`` threads, whatever the current count. Where the kernel's split cannot be
    verified, ``full`` (the whole tensor) is raised to the power.

    Args:
        values: [k] the values at ``flat_index``.
        flat_index: [k] sorted flat indices (as ``nonzero`` returns them).
        numel: the whole tensor's number of elements.
        exponent: the power.
        full: the whole tensor, for the fallback.
        threads: the thread count replayed (None: the current count).

    Returns:
        [k].
    """
    as_groups = values.reshape(-1, 1)
    return pow_of_groups(as_groups, flat_index, (numel, 1), 1, exponent, full, threads).reshape(-1)


def pow_of_groups(
    values: torch.Tensor,
    picked: torch.Tensor,
    shape: tuple[int, int],
    axis: int,
    exponent: float,
    full: torch.Tensor | None = None,
    threads: int | None = None,
) -> torch.Tensor:
    """``values ** exponent`` for some groups of a contiguous float32 [R, C] tensor, exactly as the full tensor's
    ``full.pow(exponent)`` computes them at ``threads`` threads. Where the kernel's split cannot be verified, ``full``
    is raised to the power (at ``threads`` threads).

    Args:
        values: those groups, [h, C] (axis 1) or [R, h] (axis 0), contiguous.
        picked: [h] sorted group indices (rows for axis 1, columns for axis 0).
        shape: (R, C) of the whole tensor.
        axis: the grouping axis.
        exponent: the power.
        full: the whole tensor, for the fallback.
        threads: the thread count replayed (None: the current count).

    Returns:
        The same shape as ``values``.
    """
    threads = threads or torch.get_num_threads()
    if picked.numel() == 0:
        return values.clone()
    block = _pow_block(exponent, threads)
    if block is None:
        if full is None:
            raise RuntimeError("torch's pow split could not be verified here and no full tensor was given")
        with torch_threads(threads):
            return torch.index_select(full.reshape(shape).pow(exponent), 1 - axis, picked)
    out = _pow_vector_loop(values.reshape(-1), exponent, block).view(values.shape)
    columns = shape[1]
    for begin, end in _scalar_zones(shape[0] * columns, threads, block):
        flat = torch.arange(begin, end)
        row, column = flat.div(columns, rounding_mode="floor"), flat.remainder(columns)
        group = row if axis == 1 else column
        slot = torch.searchsorted(picked, group).clamp(max=picked.numel() - 1)
        found = picked[slot] == group
        if bool(found.any()):
            at = (slot[found], column[found]) if axis == 1 else (row[found], slot[found])
            out[at] = _pow_scalar_loop(values[at], exponent)
    return out


def _mean_ranges(numel: int, threads: int) -> list[tuple[int, int]]:
    """How torch's CPU sum of ``numel`` contiguous elements splits them between threads (its two-pass
    reduction: at::parallel_for's ranges, each summed into its own slot, the slots summed after)."""
    ranges = 1 if numel <= _GRAIN or threads <= 1 else min(threads, -(-numel // _GRAIN))
    chunk = -(-numel // ranges)
    return [(b, min(numel, b + chunk)) for b in range(0, numel, chunk)]


def _mean_by_ranges(x: torch.Tensor, threads: int) -> torch.Tensor:
    """``x.mean()`` as ``threads`` threads compute it, computed on one: per-range sums into ``threads``
    slots, the slots summed, divided by the count."""
    flat = x.reshape(-1)
    with torch_threads(1):
        slots = torch.zeros(threads, dtype=x.dtype)
        for slot, (begin, end) in enumerate(_mean_ranges(flat.numel(), threads)):
            slots[slot] = flat[begin:end].sum()
        return slots.sum().div_(flat.numel())


@functools.cache
def _mean_by_ranges_holds(threads: int) -> bool:
    """Whether ``_mean_by_ranges`` reproduces torch's ``mean()`` here at ``threads`` threads, bit for bit,
    on random tensors around and well above the grain size."""
    g = torch.Generator().manual_seed(0)
    for numel in (_GRAIN - 1, _GRAIN + 1, 3 * _GRAIN + 5, 10 * _GRAIN + 17, 777_777):
        x = torch.rand(numel, generator=g) * torch.logspace(-3, 3, numel)[torch.randperm(numel, generator=g)]
        with torch_threads(threads):
            expected = x.mean()
        if not torch.equal(_mean_by_ranges(x, threads), expected):
            return False
    return True


def tensor_mean(x: torch.Tensor, threads: int) -> float:
    """``float(x.mean())`` of a contiguous float32 tensor exactly as torch computes it at ``threads`` threads, run on one
    thread where that is verified to give the same bits (a barrier per operation stalls a loaded CPU), else at
    ``threads``.

    Args:
        x: the tensor.
        threads: the thread count replayed.

    Returns:
        The mean.
    """
    if threads <= 1 or x.numel() <= _GRAIN:
        with torch_threads(1):
            return float(x.mean())
    if _mean_by_ranges_holds(threads):
        return float(_mean_by_ranges(x, threads))
    with torch_threads(threads):
        return float(x.mean())
