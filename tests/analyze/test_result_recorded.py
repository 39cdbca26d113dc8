"""The settings the analysis result records, typed (analyze/result_recorded.py): read from results/result.json,
read as attributes, and written back key for key, an older result's missing keys included."""

import json

import pytest

from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.result import AnalysisResult, as_result
from llmaudit.analyze.result_recorded import RecordedAttackSettings, RecordedThresholds, RQProtocol, RQStability
from llmaudit.config.report_section import ReportConfig

STABILITY = {
    "n_runs": 3,
    "full_mean": {"a": 0.5, "b": float("nan")},
    "full_ranking": {"a": 1.0, "b": 2.0},
    "by_size": [{"k_runs": 2, "n_resamples": 5, "n_nan": 1, "mean_rho": 0.25, "std_rho": 0.5}],
    "seed": 7,
}


def _result(**blocks) -> dict:
    return {"schema_version": 1, "quantizers": ["a", "b"], **blocks}


def test_the_attack_settings_recorded_are_typed_and_written_back_as_recorded():
    recorded = AttackRunSettings(attacks=("loss",), n_boot=30, n_pool=272, n_train=136.0, seed=3).as_dict()
    result = as_result(_result(attacks={"attack_definitions": {"loss": "1:-mean_nll"}, "settings": recorded}))
    s = result.attacks.settings
    assert isinstance(s, RecordedAttackSettings)
    assert (s.n_boot, s.n_pool, s.n_train, s.seed, s.checkpoint, s.split) == (
        30,
        272,
        136.0,
        3,
        "final (max per run)",
        "pool",
    )
    assert s.fprs == list(AttackRunSettings().fprs) and isinstance(s.t_cutoff, int) == isinstance(
        recorded["t_cutoff"], int
    )
    assert result.attacks.attack_definitions == {"loss": "1:-mean_nll"}
    assert json.dumps(result.to_json()["attacks"]["settings"]) == json.dumps(recorded)


def test_the_r_q_protocol_and_stability_are_typed_and_written_back_with_nan_kept():
    protocol = {"estimator": "Algorithm 2", "ddof": 1, "edge_cases": {"equal_means": "r_Q = 0.0"}, "later_key": [1]}
    result = as_result(_result(indicator={"protocol": protocol, "stability": STABILITY}))
    assert isinstance(result.r_q.protocol, RQProtocol) and isinstance(result.r_q.stability, RQStability)
    assert result.r_q.protocol.ddof == 1 and result.r_q.protocol.edge_cases.equal_means == "r_Q = 0.0"
    (size,) = result.r_q.stability.by_size
    assert (size.k_runs, size.n_nan, size.mean_rho, size.q05_rho) == (2, 1, 0.25, None)
    written = result.to_json()["indicator"]
    assert written["protocol"] == protocol and list(written["stability"]["by_size"][0]) == list(STABILITY["by_size"][0])
    assert written["stability"]["full_mean"]["b"] != written["stability"]["full_mean"]["b"]  # NaN stays NaN


def test_thresholds_are_the_recipe_report_section_without_processes():
    recipe = ReportConfig(processes=4, alpha=0.1, release_sets=[["a", "b"]])
    recorded = recipe.model_dump(exclude={"processes"})
    result = as_result(_result(thresholds=recorded))
    th = result.thresholds
    assert isinstance(th, RecordedThresholds) and isinstance(th, ReportConfig)
    assert th.alpha == 0.1 and th.release_sets == [["a", "b"]] and th.processes is None
    assert dict(th) == recorded and list(dict(th)) == list(recorded)
    assert result.to_json()["thresholds"] == recorded and "processes" not in result.to_json()["thresholds"]


def test_an_older_result_s_thresholds_keep_only_the_recorded_keys_and_read_the_defaults_of_the_others():
    recorded = {"max_tpr_at_1pct_fpr": 0.02, "min_r_q": 0.0, "a_key_of_a_later_version": "kept"}
    th = as_result(_result(thresholds=recorded)).thresholds
    assert dict(th) == recorded  # the checklist fills its own defaults for the keys not recorded
    assert th.max_tpr_at_1pct_fpr == 0.02 and th.min_runs == ReportConfig().min_runs
    assert AnalysisResult.model_validate(_result()).to_json() == _result()  # no thresholds recorded: none written


def test_a_recorded_threshold_outside_the_recipe_s_range_is_not_an_analysis_result():
    with pytest.raises(ValueError, match="max_tpr_at_1pct_fpr"):
        as_result(_result(thresholds={"max_tpr_at_1pct_fpr": 2.0}))
