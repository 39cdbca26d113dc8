"""The audited samples: a disjoint pool (candidate members) and validation set, and the membership
masks that say which pool samples each fine-tuning run trains on.
"""

from __future__ import annotations

import numpy as np

from llmaudit.data.records import DataError


def draw_pool_and_val(records: list[dict], pool_size: int, val_size: int, seed: int) -> tuple[list[dict], list[dict]]:
    """Disjoint random pool (membership candidates) and validation set (never trained on)."""
    ids = [r["sample_id"] for r in records]
    if len(set(ids)) != len(ids):
        raise DataError("duplicate sample ids in the data; every record needs a unique sample_id.")
    need = pool_size + val_size
    if len(records) < need:
        raise DataError(
            f"only {len(records)} usable records (after dropping those over data.max_length) but "
            f"pool_size + val_size = {need}; lower them or raise data.max_length."
        )
    order = np.random.default_rng([seed, 7]).permutation(len(records))
    pool = [records[i] for i in sorted(order[:pool_size])]
    val = [records[i] for i in sorted(order[pool_size:need])]
    return pool, val


MEMBERSHIP_DESIGNS = ("fixed_fraction", "independent")
"""How runs draw their members (`train.membership`): a fixed-size random subset, or each sample independently."""


def membership_masks(
    pool_size: int, runs: int, fraction: float, seed: int, design: str = "fixed_fraction"
) -> np.ndarray:
    """[runs, pool_size] boolean membership, run r drawn from `numpy.random.default_rng` seeded by (seed, r) alone (so
    adding runs keeps the earlier runs' masks).

    design "fixed_fraction": run r trains on exactly round(fraction * pool_size) samples, a uniformly random subset.
    design "independent": every sample is in run r with probability `fraction`, independently of every other sample
    and run (Poisson sampling, what the one-run epsilon bound needs with fraction 1/2); a draw that leaves a run
    without a member or without a non-member is refused (DataError) rather than redrawn, which would condition the
    independence away."""
    if design not in MEMBERSHIP_DESIGNS:
        raise ValueError(f"membership design must be one of {MEMBERSHIP_DESIGNS}; got {design!r}")
    if design == "independent":
        return _independent_masks(pool_size, runs, fraction, seed)
    n_in = int(round(fraction * pool_size))
    if not 0 < n_in < pool_size:
        raise DataError(f"member_fraction={fraction} of pool_size={pool_size} gives {n_in} members per run.")
    masks = np.zeros((runs, pool_size), dtype=bool)
    for r in range(runs):
        masks[r, np.random.default_rng([seed, r, 11]).choice(pool_size, n_in, replace=False)] = True
    return masks


def _independent_masks(pool_size: int, runs: int, fraction: float, seed: int) -> np.ndarray:
    masks = np.stack([np.random.default_rng([seed, r, 13]).random(pool_size) < fraction for r in range(runs)])
    counts = masks.sum(axis=1)
    empty = np.flatnonzero((counts == 0) | (counts == pool_size))
    if empty.size:
        raise DataError(
            f"train.membership=independent drew run {int(empty[0])} with {int(counts[empty[0]])} of {pool_size} pool "
            "samples as members: every run needs a member and a non-member; raise data.pool_size (or change "
            "train.seed)."
        )
    return masks
