"""The report's utility beyond the loss: KL / same-top / task-metric columns from planted loss tables, the
utility criterion on report.utility_metric, the Pareto front, the privacy-utility figure, and old stores."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmaudit.analyze.result_recorded import RecordedThresholds
from llmaudit.analyze.store_analysis import analyze
from llmaudit.common.formatting import fmt_sig
from llmaudit.config import ExperimentConfig
from llmaudit.report.build import build_report
from llmaudit.report.models import Checklist, GridRow, ReportJson, Thresholds
from llmaudit.report.plots import privacy_utility
from llmaudit.report.policy import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS, release_checklist
from llmaudit.report.schema import validate_report
from llmaudit.report.utility import indistinguishable_by_kl, pareto_front
from llmaudit.report.write import write_report
from llmaudit.score.utility import encode_settings
from llmaudit.store.losstable import UTILITY_METADATA_KEY, read_parquet_file, write_loss_table
from tests.report.test_report import QUANTIZERS, RUNS, STEPS, TH, _make_store, _row


def _typed(grid):
    """The test's grid rows, typed as the report layer reads them."""
    return [GridRow.model_validate(r) for r in grid]


KL = {"fp32": 0.0, "uniform-5": 0.01, "sign": 0.5}  # per-token KL of run r: KL[q] * (1 + 5 r / (RUNS - 1))
SAME_TOP = {"fp32": 1.0, "uniform-5": 5 / 6, "sign": 0.0}  # six tokens per sample
ANSWERED = ("synthetic/val/0000", "synthetic/val/0001")


def _answer(q, rec):
    return {"fp32": rec["output"], "uniform-5": rec["output"].split(" secret")[0], "sign": ""}[q]


def _add_utility_columns(store, records):
    """What the scorer writes at each run's final checkpoint: KL / same-top on the val rows, two answers."""
    by_id = {r["sample_id"]: r for r in records}
    settings = {
        "divergence": True,
        "generation": {"sample_ids": list(ANSWERED), "max_new_tokens": 9, "decoding": "greedy"},
    }
    for q in QUANTIZERS:
        for run in range(RUNS):
            path = store.unit_path(run, STEPS[-1], q)
            df = read_parquet_file(path)
            val = df["split"] == "val"
            df["token_kl"] = [
                np.full(n, KL[q] * (1 + 5 * run / (RUNS - 1))) if v else None for n, v in zip(df["n_tokens"], val)
            ]
            top = np.arange(6) < round(6 * SAME_TOP[q])
            df["token_same_top"] = [top.copy() if v else None for v in val]
            df["generated"] = [_answer(q, by_id[s]) if s in ANSWERED else None for s in df["sample_id"]]
            write_loss_table(df, path, metadata={UTILITY_METADATA_KEY: encode_settings(settings)})


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    cfg, store, records = _make_store(tmp_path_factory.mktemp("run"))
    _add_utility_columns(store, records)
    result = analyze(cfg, store, echo=lambda *a, **k: None)
    paths = write_report(store, result)
    return {"cfg": cfg, "store": store, "result": result, "paths": paths}


def test_divergence_and_task_columns_equal_the_planted_values(measured):
    report = build_report(measured["result"])
    validate_report(report | {"plots": {}})
    rows = {r["quantizer"]: r for r in report["grid"]}
    kl = {q: rows[q]["utility"]["divergence"]["kl_mean"] for q in QUANTIZERS}
    assert kl["fp32"]["mean"] == 0.0
    assert kl["uniform-5"]["mean"] == pytest.approx(0.035)  # from 0.01 to 0.06, evenly over the runs
    assert kl["uniform-5"]["ci"][0] < kl["uniform-5"]["mean"] < kl["uniform-5"]["ci"][1]
    assert kl["uniform-5"]["token_se"] == 0.0  # constant within each run
    assert rows["uniform-5"]["utility"]["divergence"]["same_top"]["mean"] == pytest.approx(5 / 6)
    tasks = {q: rows[q]["utility"]["task_metrics"] for q in QUANTIZERS}
    assert tasks["fp32"]["caption_rouge_l"]["value"] == pytest.approx(1.0)  # the reference text itself
    assert tasks["fp32"]["caption_bleu4"]["value"] == pytest.approx(1.0)
    assert tasks["sign"]["caption_rouge_l"]["value"] == 0.0 and tasks["sign"]["caption_rouge_l"]["drop"]["value"] == 1.0
    assert 0 < tasks["uniform-5"]["caption_rouge_l"]["value"] < 1
    assert report["utility"]["generation_samples"] == 2 and report["utility"]["generation_max_new_tokens"] == 9


def test_markdown_and_html_show_the_utility_section_and_the_figure(measured):
    md = Path(measured["paths"]["markdown"]).read_text()
    section = md.split("## Utility against full precision")[1].split("\n## ")[0]
    ci = measured["result"].utility["uniform-5"].divergence.stat("kl_mean").ci
    assert ci[0] < 0.035 < ci[1]
    assert f"| `uniform-5` | 0.035 ± 0 \\[{fmt_sig(ci[0])}, {fmt_sig(ci[1])}\\] |" in section  # mean ± token se [runs]
    assert "caption_rouge_l" in section and "\\(Δ -1.000\\)" in section  # sign's drop from full precision
    # the privacy-utility figure plots THE leakage, which this store does not measure: it is left out, not
    # replaced by another number; it is drawn from a store that measures it (test_privacy_utility_figure_...)
    assert "plots/privacy_utility.png" not in md
    assert "KL vs ref (nats/token)" in md.split("## Quantizer grid")[1].split("\n## ")[0]


def test_the_utility_criterion_follows_report_utility_metric(measured):
    """KL: uniform-5 (mean 0.035) passes a 0.1 limit and fails 0.02; sign fails; a task metric judges the drop
    below full precision; too few runs is NOT MEASURED."""
    result = measured["result"]
    for metric, limit, want in (
        ("kl", 0.1, {"fp32": PASS, "uniform-5": PASS, "sign": FAIL}),
        ("kl", 0.02, {"uniform-5": FAIL}),
        ("kl", 0.04, {"uniform-5": INCONCLUSIVE}),  # mean 0.035, interval over runs reaches above 0.04
        ("same_top", 0.8, {"fp32": PASS, "uniform-5": PASS, "sign": FAIL}),
        ("caption_rouge_l", 0.05, {"fp32": PASS, "sign": FAIL}),
    ):
        th = dict(result.thresholds, utility_metric=metric, utility_limit=limit, min_runs=RUNS)
        report = build_report(result.model_copy(update={"thresholds": RecordedThresholds.model_validate(th)}))
        crit = {
            q: next(c for c in v["criteria"] if c["id"] == "utility")
            for q, v in report["checklist"]["per_quantizer"].items()
        }
        assert {q: crit[q]["status"] for q in want} == want, (metric, limit)
        assert crit["fp32"]["metric"] == metric
    th = dict(result.thresholds, utility_metric="kl", utility_limit=1.0, min_runs=RUNS + 1)
    report = build_report(result.model_copy(update={"thresholds": RecordedThresholds.model_validate(th)}))
    assert all(
        next(c for c in v["criteria"] if c["id"] == "utility")["status"] == NOT_MEASURED
        for v in report["checklist"]["per_quantizer"].values()
    )


def test_a_metric_that_was_not_measured_is_never_pass():
    grid = [_row("fp", tpr=0.0, tpr_ci=(0.0, 0.01), ref=True)]
    grid[0]["utility"] |= {
        "divergence": {"measured": False, "reason": "scored without per-token KL"},
        "task_metrics": {},
    }
    cl = release_checklist(_typed(grid), TH | {"utility_metric": "kl"})
    crit = next(c for c in cl.per_quantizer["fp"].criteria if c.id == "utility")
    assert crit.status == NOT_MEASURED and "scored without per-token KL" in crit.reason
    cl = release_checklist(_typed(grid), TH | {"utility_metric": "smiles_exact_match"})
    assert next(c for c in cl.per_quantizer["fp"].criteria if c.id == "utility").status == NOT_MEASURED


def test_pareto_front_and_kl_groups_by_hand():
    # (KL, AUROC): a dominates c (lower both); b trades KL for privacy; d equals a
    points = [(0.01, 0.7), (0.2, 0.55), (0.05, 0.75), (0.01, 0.7)]
    assert pareto_front(points, lower_x_is_better=True) == [True, True, False, True]
    # a task metric: higher is better
    assert pareto_front([(0.9, 0.7), (0.5, 0.6), (0.4, 0.65)], lower_x_is_better=False) == [True, True, False]

    def row(q, mean, ci):
        return {"quantizer": q, "utility": {"divergence": {"kl_mean": {"mean": mean, "ci": ci}}}}

    grid = [
        row("fp", 0.0, [0.0, 0.0]),
        row("a", 1e-3, [5e-4, 2e-3]),
        row("b", 1.5e-3, [1e-3, 3e-3]),
        row("c", 0.2, [0.1, 0.3]),
    ]
    assert indistinguishable_by_kl(_typed(grid)) == [["a", "b"]]


def test_the_figure_needs_two_quantizers_with_both_numbers():
    thresholds = Thresholds.model_construct()
    report = ReportJson.model_construct(grid=[], checklist=Checklist.model_construct(thresholds=thresholds))
    assert privacy_utility(report) is None


def test_loss_tables_without_utility_columns_report_them_not_measured_with_the_fix(tmp_path):
    cfg, store, _records = _make_store(tmp_path)  # loss tables without utility columns
    assert isinstance(cfg, ExperimentConfig)
    result = analyze(cfg, store, echo=lambda *a, **k: None)
    paths = write_report(store, result)
    md = Path(paths["markdown"]).read_text()
    section = md.split("## Utility against full precision")[1].split("\n## ")[0]
    assert "NOT MEASURED" in section and "--refresh-utility" in section
    assert "Task metrics NOT MEASURED" in section
    assert not Path(paths["plots"], "privacy_utility.png").exists()
