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


def membership_masks(pool_size: int, runs: int, fraction: float, seed: int) -> np.ndarray:
    """[runs, pool_size] boolean: run r trains on exactly round(fraction * pool_size) samples."""
    n_in = int(round(fraction * pool_size))
    if not 0 < n_in < pool_size:
        raise DataError(f"member_fraction={fraction} of pool_size={pool_size} gives {n_in} members per run.")
    masks = np.zeros((runs, pool_size), dtype=bool)
    for r in range(runs):
        masks[r, np.random.default_rng([seed, r, 11]).choice(pool_size, n_in, replace=False)] = True
    return masks
