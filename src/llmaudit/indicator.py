"""The attack-free indicator r_Q: the stable public import path.

    from llmaudit.indicator import r_q
    r_q(losses)   # losses: [K checkpoints, n held-out samples] of one run's quantized trajectory

The implementation and its documentation live in `llmaudit.analyze.rq` (the estimator of one run) and
`llmaudit.analyze.rq_aggregate` (over runs and quantizers, from a loss table) (docs/science.md section 2);
this module re-exports their public names so that user code does not depend on the layout.
"""

from llmaudit.analyze.rq import (
    RQResult,
    merge_identical_points,
    r_q,
    r_q_details,
    r_q_reciprocal,
)
from llmaudit.analyze.rq_aggregate import (
    RQSettings,
    aggregate_r_q,
    indicator_from_table,
    rank_quantizers,
    ranking_stability,
)

__all__ = [
    "RQResult",
    "RQSettings",
    "aggregate_r_q",
    "indicator_from_table",
    "merge_identical_points",
    "r_q",
    "r_q_details",
    "r_q_reciprocal",
    "rank_quantizers",
    "ranking_stability",
]
