"""Membership inference attacks: the stable public import path.

    from llmaudit.attacks import AttackRunSettings, lira_offline, loss_score, run_attacks

    result = run_attacks(loss_table, AttackRunSettings(attacks=("loss", "lira_offline"), n_boot=200))

Add your own attack with `register(AttackSpec(...))` (docs/architecture.md, "Adding an attack").
The implementations live in `llmaudit.analyze.attacks` (formulas, the registry and its catalog, evaluation;
docs/science.md section 4); this module re-exports their public names so that user code does not
depend on the layout.
"""

from llmaudit.analyze.attacks.evaluate import run_attacks, spearman_vs_indicator
from llmaudit.analyze.attacks.lira import (
    confidence_logit,
    fpc,
    lira_offline,
    lira_online,
    lira_statistic,
    out_reference_counts,
)
from llmaudit.analyze.attacks.registry import AttackSpec, attack_definitions, register, registered_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.attacks.text import (
    TEXT_ATTACKS,
    combine_scores,
    loss_score,
    min_k_plus_plus_score,
    min_k_score,
    ref_score,
    zlib_score,
)

__all__ = [
    "AttackRunSettings",
    "AttackSpec",
    "TEXT_ATTACKS",
    "attack_definitions",
    "combine_scores",
    "confidence_logit",
    "fpc",
    "lira_offline",
    "lira_online",
    "lira_statistic",
    "loss_score",
    "min_k_plus_plus_score",
    "min_k_score",
    "out_reference_counts",
    "register",
    "registered_attacks",
    "ref_score",
    "run_attacks",
    "spearman_vs_indicator",
    "zlib_score",
]
