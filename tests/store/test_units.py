"""The scoring grid: the reference unit, and the quantization-matched base units of score.matched_base."""

from llmaudit.config import ExperimentConfig
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.units import Unit, grid_units


def _cfg(**score) -> ExperimentConfig:
    return ExperimentConfig(name="grid", score={"quantizers": ["hqq-4", "fp32", "gptq-4"], **score})


def test_the_base_is_one_unit_unless_matched_units_are_asked_for():
    steps = {0: [5, 10], 1: [5, 10]}
    plain = grid_units(_cfg(), steps)
    assert plain[0] == Unit(REFERENCE_RUN, 0, "fp32", True)  # the reference (first full-precision) quantizer
    assert [u for u in plain if u.run == REFERENCE_RUN] == [plain[0]]
    matched = grid_units(_cfg(matched_base=True), steps)
    base = [u for u in matched if u.run == REFERENCE_RUN]
    assert base == [Unit(REFERENCE_RUN, 0, q, True) for q in ("fp32", "hqq-4", "gptq-4")]
    assert matched[len(base) :] == plain[1:]  # the runs' units are unchanged
    assert not [u for u in grid_units(_cfg(matched_base=True, score_base=False), steps) if u.run == REFERENCE_RUN]
