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
    """The design the attacks will see: from the store's membership masks where it has them (the fewest members and
    non-members of any run), else from the recipe (data.pool_size, train.member_fraction, train.runs)."""
    attacks = len(resolve_attacks(cfg.attack.attacks))
    if store is not None and store.manifest_path.exists():
        masks = store.membership()
        return Design(int(masks.sum(1).min()), int((~masks).sum(1).min()), int(masks.shape[0]), attacks)
    members = int(round(cfg.train.member_fraction * cfg.data.pool_size))
    return Design(members, cfg.data.pool_size - members, cfg.train.runs, attacks)


def reach_of(cfg: ExperimentConfig, store: RunStore | None = None) -> Reach:
    """`sizing` of the design (`design_of`) under the recipe's release rule."""
    return sizing(design_of(cfg, store), decision_settings(cfg))


def sizing_report(
    cfg: ExperimentConfig, store: RunStore | None = None, unit: str = "non-member"
) -> tuple[Reach, list[str]]:
    """The reach of a store or recipe and its sentences (`sizing_lines`)."""
    reach = reach_of(cfg, store)
    return reach, sizing_lines(reach, decision_settings(cfg), unit)
