"""The analysis's cost model (llmaudit.analyze.cost): the fit by hand, and a planted cost recovered exactly."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from llmaudit.analyze import cost
from llmaudit.analyze.cost import (
    AnalysisCost,
    CostModel,
    analysis_seconds,
    fit_cost,
    measure_analysis_cost,
    read_cost,
    report_rest_seconds,
    synthetic_loss_table,
)


def test_fit_cost_is_the_line_through_the_two_sizes_with_nonnegative_parts():
    assert fit_cost([100, 400], [1.0, 2.5]) == CostModel(pytest.approx(0.5), pytest.approx(0.005))
    assert fit_cost([100, 400], [2.0, 1.5]) == CostModel(1.5, 0.0)  # noise: the larger size's seconds
    assert fit_cost([100, 400], [0.1, 4.0]) == CostModel(0.0, pytest.approx(0.01))  # through the origin
    assert fit_cost([100, 400], [-0.1, 0.0]) == CostModel(0.0, 0.0)


def test_the_quantizers_are_priced_a_round_of_processes_at_a_time():
    zero = CostModel(0.0, 0.0)
    c = AnalysisCost(CostModel(2.0, 0.0), zero, zero, runs=8, records=(500, 1000), attacks=("loss",), measured_in_s=1.0)
    priced = [
        analysis_seconds(c, pool=10, quantizers=5, n_boot=0, decision_resamples=0, processes=p) for p in (1, 2, 5, 8)
    ]
    assert priced == pytest.approx([10.0, 6.0, 2.0, 2.0])  # 5, 3, 1 and 1 rounds of 2 s


def test_analysis_seconds_by_hand():
    c = AnalysisCost(CostModel(1.0, 0.01), CostModel(0.0, 0.001), CostModel(0.5, 0.0), 6, (100, 400), ("loss",), 1.0)
    # per quantizer at n = 1000: 1 + 10, plus 200 x 1, plus 50 x 0.5
    assert analysis_seconds(c, pool=1000, quantizers=3, n_boot=200, decision_resamples=50) == pytest.approx(
        3 * (11 + 200 + 25)
    )


def test_a_planted_cost_is_recovered_and_predicted_exactly(monkeypatch):
    """Seconds that follow the model exactly (fixed 0.3 + 2e-3 n, 1e-4 n per bootstrap resample, 0.01 + 5e-5 n per
    decision resample, for 2 quantizers): the measurement recovers each part and prices a 50x larger table."""

    def planted(df, attacks, n_boot, decision):
        n = df.loc[(df["split"] == "pool") & (df["run"] == 0) & (df["quantizer"] == "fp32")].shape[0]
        return 2 * (0.3 + 2e-3 * n + n_boot * 1e-4 * n + decision * (0.01 + 5e-5 * n))

    monkeypatch.setattr(cost, "_seconds", planted)
    c = measure_analysis_cost(["loss"], runs=2, records=(20, 40), resamples=10)
    assert c.fixed.overhead_s == pytest.approx(0.3) and c.fixed.per_record_s == pytest.approx(2e-3)
    assert c.per_boot.overhead_s == pytest.approx(0.0, abs=1e-12) and c.per_boot.per_record_s == pytest.approx(1e-4)
    assert c.per_decision.overhead_s == pytest.approx(0.01) and c.per_decision.per_record_s == pytest.approx(5e-5)
    n = 2000
    want = 5 * (0.3 + 2e-3 * n + 1000 * 1e-4 * n + 300 * (0.01 + 5e-5 * n))
    assert analysis_seconds(c, pool=n, quantizers=5, n_boot=1000, decision_resamples=300) == pytest.approx(want)


def test_the_measurement_runs_the_real_analysis_in_seconds():
    c = measure_analysis_cost(["loss", "ref"], runs=3, records=(20, 40), resamples=20)
    assert c.records == (20, 40) and c.runs == 3 and c.attacks == ("loss", "ref")
    for part in (c.fixed, c.per_boot, c.per_decision):
        assert part.overhead_s >= 0 and part.per_record_s >= 0
    assert c.fixed.at(40) > 0 and c.measured_in_s > 0
    # the tables written as unit files and read back: each part >= 0 (clamped), not both 0 (the reads took time);
    # on tables this small the per-file part can take all of it
    assert c.read_per_file_s >= 0 and c.read_per_byte_s >= 0 and c.read_per_file_s + c.read_per_byte_s > 0


def test_the_rest_of_the_report_by_hand():
    """Reading 4 files of 5,000 bytes in all at 0.25 s per file and 1e-3 s per byte, and release sets of 2 and 3
    files: (1 + 2) + (1 + 3) decisions of 10 resamples at 0.5 s + 1e-3 s x 100 records each."""
    zero = CostModel(0.0, 0.0)
    c = AnalysisCost(zero, zero, CostModel(0.5, 1e-3), 6, (100, 400), ("loss",), 1.0, 0.25, 1e-3)
    rest = functools.partial(report_rest_seconds, c, pool=100, files=4, table_bytes=5000, resamples=10)
    assert rest(set_sizes=[2, 3]) == pytest.approx(1 + 5 + 7 * 10 * 0.6)
    assert rest(set_sizes=[]) == pytest.approx(6)
    unmeasured = AnalysisCost(zero, zero, zero, 6, (100, 400), ("loss",), 1.0)  # a cost recorded before the reading
    assert report_rest_seconds(unmeasured, pool=100, files=4, table_bytes=5000, set_sizes=[2], resamples=10) == 0


def test_the_read_cost_is_the_two_layouts_solved_for_a_planted_cost(monkeypatch):
    """Reads that cost exactly 0.02 s per file + 1e-8 s per byte: both parts recovered; every row is read back in
    both layouts (about ten times the files in the second)."""
    layouts = []

    def planted(path, **kwargs):
        df = real(path, **kwargs)
        files = list(Path(path).glob("*.parquet"))
        layouts.append((len(files), len(df)))
        clock["t"] += 0.02 * len(files) + 1e-8 * sum(f.stat().st_size for f in files)
        return df

    real, clock = cost.read_loss_table, {"t": 0.0}
    monkeypatch.setattr(cost, "read_loss_table", planted)
    monkeypatch.setattr(cost.time, "process_time", lambda: clock["t"])
    table = synthetic_loss_table(2, 30, 2)
    per_file, per_byte = read_cost(table)
    assert per_file == pytest.approx(0.02) and per_byte == pytest.approx(1e-8)
    units = table.groupby(["run", "quantizer"]).ngroups
    assert layouts[0] == (units, len(table)) and layouts[1][1] == len(table)
    assert layouts[1][0] >= 10 * units  # about ten smaller files per unit
