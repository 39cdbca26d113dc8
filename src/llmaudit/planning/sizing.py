"""Sizing before compute (docs/science.md section 12, "Sizing before compute"): what a run store's or a recipe's
design can decide under the release rule, said by `llmaudit import`, `llmaudit plan` and the start of
`llmaudit score` before any model is scored."""

from __future__ import annotations

from llmaudit.analyze.attacks.registry import resolve_attacks
from llmaudit.analyze.decision.sizing import Design, Reach, sizing, sizing_lines
from llmaudit.analyze.store_analysis import decision_settings
from llmaudit.config import ExperimentConfig
from llmaudit.store.run_store import RunStore


def design_of(cfg: ExperimentConfig, store: RunStore | None = None) -> Design:
    """The design the attacks will see.

    Args:
        cfg: the experiment's config.
        store: its run store, or None (a recipe alone).

    Returns:
        From the store's membership masks where it has them (the fewest members and non-members of any run), else
        from the recipe (data.pool_size, train.member_fraction, train.runs); with the number of attacks asked for.
    """
    attacks = len(resolve_attacks(cfg.attack.attacks))
    if store is not None and store.manifest_path.exists():
        masks = store.membership()
        return Design(int(masks.sum(1).min()), int((~masks).sum(1).min()), int(masks.shape[0]), attacks)
    members = int(round(cfg.train.member_fraction * cfg.data.pool_size))
    return Design(members, cfg.data.pool_size - members, cfg.train.runs, attacks)


def reach_of(cfg: ExperimentConfig, store: RunStore | None = None) -> Reach:
    """`sizing` of the design (`design_of`) under the recipe's release rule.

    Args:
        cfg: the experiment's config (its design and its decision settings).
        store: its run store, or None (a recipe alone).

    Returns:
        What the design can decide: whether a verdict, a PASS and a FAIL are within reach.
    """
    return sizing(design_of(cfg, store), decision_settings(cfg))


def sizing_report(
    cfg: ExperimentConfig, store: RunStore | None = None, unit: str = "non-member"
) -> tuple[Reach, list[str]]:
    """The reach of a store or a recipe and its sentences (`sizing_lines`).

    Args:
        cfg: the experiment's config.
        store: its run store, or None (a recipe alone).
        unit: the word for one non-member record in the sentences (`llmaudit import` says "held-out record").

    Returns:
        (the reach, its sentences).
    """
    reach = reach_of(cfg, store)
    return reach, sizing_lines(reach, decision_settings(cfg), unit)
