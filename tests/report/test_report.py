"""The report: schema, self-contained HTML, no sample text without --include-samples, checklist rules.

A tiny experiment is built in code (run store, data files, loss tables) and analysed with the real
`analysis.analyze`, so the report is tested against the result object the pipeline actually produces.
"""

import base64
import copy
import json
import re
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.decision.models import (
    AttackJudgement,
    Comparison,
    Estimate,
    QuantizerDecision,
    StrongestAttack,
)
from llmaudit.analyze.result_blocks import SpearmanVsRQ
from llmaudit.analyze.store_analysis import analyze
from llmaudit.common.io import atomic_write_json, to_strict_json
from llmaudit.config import ExperimentConfig
from llmaudit.data.pool import membership_masks
from llmaudit.report.build import build_report, indicator_agreement
from llmaudit.report.markdown import render_markdown
from llmaudit.report.models import Checklist, GridRow
from llmaudit.report.policy import FAIL, INCONCLUSIVE, NOT_MEASURED, PASS, judge, release_checklist
from llmaudit.report.recommend import recommend
from llmaudit.report.release import headline_of
from llmaudit.report.schema import REPORT_SCHEMA, ReportSchemaError, validate_report
from llmaudit.report.write import write_report
from llmaudit.store.losstable import validate_loss_table
from llmaudit.store.run_store import RunStore
from tests.conftest import write_store_from_table


def _typed(grid):
    """The test's grid rows, typed as the report layer reads them."""
    return [GridRow.model_validate(r) for r in grid]


N_POOL, N_VAL, RUNS, STEPS, N_TOK = 24, 12, 14, (10, 20, 30), 6
PLANTED = 7  # one pool sample (14 runs: every sample has at least 3 balanced OUT references, enough for LiRA) that every run which trains on it memorises far more than the others
# quantizer: (member loss shift at the final checkpoint, extra loss, bits, size in bytes)
QUANTIZERS = {"fp32": (0.8, 0.0, 32.0, 4000), "uniform-5": (0.4, 0.05, 5.0, 700), "sign": (0.0, 2.0, 1.0, 200)}


def _record(split, j):
    # every record carries a unique phrase so a leak is found by substring search
    return {
        "sample_id": f"synthetic/{split}/{j:04d}",
        "task": "molecule_captioning",
        "split": split,
        "input": f"Describe molecule C{j}O{j} secret-input-{split}-{j:04d}",
        "output": f"The molecule is confidential compound number {j} secret-output-{split}-{j:04d}.",
    }


def _loss_rows(rng, membership):
    difficulty = {"pool": rng.uniform(1.0, 2.0, N_POOL), "val": rng.uniform(1.0, 2.0, N_VAL)}
    rows = []

    def add(run, step, q, split, j, loss, member):
        tl = np.abs(rng.normal(loss, 0.15, N_TOK))
        rows.append(
            dict(
                run=run,
                checkpoint=step,
                quantizer=q,
                sample_id=f"synthetic/{split}/{j:04d}",
                split=split,
                member=member,
                loss=float(tl.mean()),
                n_tokens=N_TOK,
                token_losses=tl,
                zlib_bytes=40 + j,
            )
        )

    for split, n in (("pool", N_POOL), ("val", N_VAL)):
        for j in range(n):
            add(-1, 0, "fp32", split, j, difficulty[split][j] + 0.3, False)
    for q, (shift, extra, _bits, _size) in QUANTIZERS.items():
        for run in range(RUNS):
            for k, step in enumerate(STEPS):
                drift = 0.04 * k + rng.normal(0, 0.01)  # a trajectory with distinct quantized points
                for split, n in (("pool", N_POOL), ("val", N_VAL)):
                    for j in range(n):
                        member = split == "pool" and bool(membership[run, j])
                        # the planted sample: its members' final loss falls to about 0.05 nats (memorised)
                        planted = difficulty["pool"][PLANTED] + extra + drift - 0.05
                        exposed = planted if (split == "pool" and j == PLANTED) else shift
                        loss = difficulty[split][j] + extra + drift - exposed * member * (k + 1) / len(STEPS)
                        add(run, step, q, split, j, loss + rng.normal(0, 0.05), member)
    return validate_loss_table(pd.DataFrame(rows))


def _make_store(root):
    cfg = ExperimentConfig(
        name="tiny-report",
        output_dir=str(root),
        train={"runs": RUNS},
        score={"quantizers": list(QUANTIZERS)},
        attack={"attacks": ["loss", "ref", "lira_offline"], "n_boot": 30},
    )
    pool, val = [_record("pool", j) for j in range(N_POOL)], [_record("val", j) for j in range(N_VAL)]
    membership = membership_masks(N_POOL, RUNS, 0.5, seed=0)
    table = _loss_rows(np.random.default_rng(7), membership)
    parameters = {"adapter_trainable": 1000, "model_total": 5000}
    store = write_store_from_table(root, cfg, pool, val, membership, table, parameters=parameters)
    for q, (_shift, _extra, bits, size) in QUANTIZERS.items():
        atomic_write_json(
            store.scores_dir / "quantizers" / f"{q}.json",
            {
                "name": q,
                "family": "full" if q == "fp32" else "simple",
                "bits": bits,
                "effective_bits": bits,
                "model_size_bytes": size,
            },
        )
    return cfg, store, pool + val


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    cfg, store, records = _make_store(root)
    result = analyze(cfg, store, echo=lambda *a, **k: None)
    paths = write_report(store, result)
    outputs = {
        kind: Path(p).read_text(encoding="utf-8") for kind, p in paths.items() if kind in ("json", "markdown", "html")
    }
    return {"store": store, "result": result, "records": records, "paths": paths, "outputs": outputs}


# ------------------------------------------------------------------------------------------ schema


def test_report_json_is_strict_and_validates_against_the_versioned_schema(experiment):
    def no_constants(name):
        raise AssertionError(f"non-finite constant {name} in report.json")

    report = json.loads(experiment["outputs"]["json"], parse_constant=no_constants)
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    assert report["report_schema_version"] == REPORT_SCHEMA["properties"]["report_schema_version"]["const"]
    prov = report["provenance"]
    assert prov["data"]["fingerprint"] == experiment["store"].manifest()["data"]["fingerprint"]
    assert prov["attack_definitions"]["lira_offline"].startswith("2:")
    assert prov["library_versions"]["llmaudit"] == report["llmaudit_version"]
    # the reference column first, with its own relative change 0
    grid = report["grid"]
    assert [r["quantizer"] for r in grid] == ["fp32", "uniform-5", "sign"]
    assert grid[0]["is_reference"] and grid[0]["utility"]["relative_change"] == 0.0
    assert grid[2]["size_vs_reference"] == pytest.approx(200 / 4000)
    util = experiment["result"].utility["sign"]
    assert grid[2]["utility"]["relative_change"] == pytest.approx(util.relative_change)
    assert set(grid[0]["attacks"]) == {"loss", "ref", "lira_offline"}


def test_non_finite_numbers_become_null_and_a_broken_report_fails_loudly(experiment):
    result = experiment["result"].model_copy(deep=True)
    result.utility["uniform-5"].val_loss = float("nan")
    result.r_q.per_quantizer["sign"].r_q.mean = float("inf")
    report = build_report(result)
    validate_report(report)
    row = {r["quantizer"]: r for r in report["grid"]}
    assert row["uniform-5"]["utility"]["val_loss"] is None and row["sign"]["r_q"]["mean"] is None
    assert to_strict_json({"a": [np.float64("nan"), (1.0, float("-inf"))]}) == {"a": [None, [1.0, None]]}

    bad = copy.deepcopy(report)
    bad["checklist"]["per_quantizer"]["fp32"]["criteria"][0]["status"] = "PROBABLY FINE"
    with pytest.raises(ReportSchemaError, match="checklist/per_quantizer/fp32/criteria/0/status"):
        validate_report(bad)
    bad = copy.deepcopy(report)
    bad["grid"][0]["r_q"]["mean"] = float("nan")
    with pytest.raises(ReportSchemaError, match="strict JSON"):
        validate_report(bad)


# ------------------------------------------------------------------------------------------ HTML


def test_html_is_self_contained_with_every_plot_embedded(experiment):
    page = experiment["outputs"]["html"]
    assert page.startswith("<!DOCTYPE html>")
    lowered = page.lower()
    for forbidden in ("<script", "<link", "<iframe", "@import", "url(", "http://", "https://", "//cdn"):
        assert forbidden not in lowered, forbidden
    sources = re.findall(r'src="([^"]*)"', page)
    report = json.loads(experiment["outputs"]["json"])
    # every figure of leakage shows the headline: with no quantizer's measured here, no utility-against-privacy one
    assert all(headline_of(r) is None or headline_of(r).value is None for r in report["grid"])
    assert set(report["plots"]) == {"r_q_vs_attack", "lira_roc", "r_q_intervals", "trajectory"}
    assert len(sources) == len(report["plots"])
    plot_dir = experiment["store"].report_dir
    for src, rel in zip(sources, report["plots"].values()):
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert png == (plot_dir / rel).read_bytes()  # the same figure as the PNG file beside it
    for href in re.findall(r'href="([^"]*)"', page):
        assert href.startswith("#")  # only in-page anchors


# ------------------------------------------------------------------------------------------ privacy


def _record_substrings(records):
    return [rec[key] for rec in records for key in ("input", "output")]


def test_no_sample_text_in_any_output_by_default(experiment):
    records = experiment["records"]
    assert len(records) == N_POOL + N_VAL
    texts = dict(experiment["outputs"])
    for png in (experiment["store"].report_dir / "plots").glob("*.png"):
        texts[png.name] = png.read_bytes().decode("latin-1")
    for kind, text in texts.items():
        for s in _record_substrings(records):
            assert s not in text, f"training text leaked into {kind}"
        assert "secret-" not in text and "confidential compound" not in text
    # the most vulnerable samples are listed by id and score only
    report = json.loads(experiment["outputs"]["json"])
    vs = report["vulnerable_samples"]
    assert vs["available"] and not vs["include_samples"] and vs["attack"] == "lira_offline"
    # found by the analysis itself: the planted sample is the most exposed one, by a margin
    planted = f"synthetic/pool/{PLANTED:04d}"
    assert vs["samples"][0]["sample_id"] == planted
    assert vs["samples"][0]["score"] > 1.15 * vs["samples"][1]["score"] > 0  # 1.2x the runner-up here
    assert all(set(s) == {"rank", "sample_id", "score"} for s in vs["samples"])
    assert planted in experiment["outputs"]["markdown"] and planted in experiment["outputs"]["html"]


def test_include_samples_adds_the_text_and_the_schema_forbids_it_otherwise(experiment, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(experiment["store"].root, root, ignore=shutil.ignore_patterns("scores"))
    paths = write_report(RunStore(root), experiment["result"], include_samples=True)
    report = json.loads(Path(paths["json"]).read_text())
    first = report["vulnerable_samples"]["samples"][0]
    planted = _record("pool", PLANTED)
    assert first["text"] == "\n".join([planted["input"], planted["output"]])
    assert planted["output"] in Path(paths["markdown"]).read_text()
    assert planted["output"] in Path(paths["html"]).read_text()
    # a report that claims include_samples=False but carries text is rejected
    report["include_samples"] = False
    with pytest.raises(ReportSchemaError):
        validate_report(report)


# ------------------------------------------------------------------------------------------ checklist


def test_judge_follows_the_conservative_rule():
    assert judge(0.02, [0.01, 0.04], limit=0.05, kind="max", measured=True)["status"] == PASS
    assert judge(0.08, [0.06, 0.10], limit=0.05, kind="max", measured=True)["status"] == FAIL
    assert judge(0.04, [0.02, 0.07], limit=0.05, kind="max", measured=True)["status"] == INCONCLUSIVE
    # a point estimate beyond the limit whose interval reaches back across it shows nothing: not FAIL
    assert judge(0.06, [0.01, 0.09], limit=0.05, kind="max", measured=True)["status"] == INCONCLUSIVE
    assert judge(0.02, None, limit=0.05, kind="max", measured=True)["status"] == NOT_MEASURED
    assert judge(None, None, limit=0.05, kind="max", measured=True)["status"] == NOT_MEASURED
    # an unreliable estimate is never PASS, however tight its interval
    assert (
        judge(0.001, [0.0, 0.002], limit=0.05, kind="max", measured=False, why_not="few negatives")["status"]
        == NOT_MEASURED
    )
    assert judge(2.0, [1.5, 2.5], limit=1.0, kind="min", measured=True)["status"] == PASS
    assert judge(0.5, [0.4, 0.6], limit=1.0, kind="min", measured=True)["status"] == FAIL
    assert judge(1.2, [0.8, 1.6], limit=1.0, kind="min", measured=True)["status"] == INCONCLUSIVE
    assert judge(0.9, [0.7, 1.1], limit=1.0, kind="min", measured=True)["status"] == INCONCLUSIVE


def _row(
    q,
    *,
    tpr,
    tpr_ci,
    reliable=True,
    n_models=8,
    rel=0.0,
    rel_ci=(0.0, 0.0),
    r_q=1.0,
    r_q_ci=(0.5, 1.5),
    n_runs=8,
    ref=False,
):
    t = {"tpr": tpr, "ci": list(tpr_ci) if tpr_ci else None, "reliable": reliable, "min_negatives": 1000}
    att = {"auroc": 0.6, "auroc_ci": [0.55, 0.65], "n_models": n_models, "low_fpr": {"pooled_calibrated": {"0.01": t}}}
    return {
        "quantizer": q,
        "is_reference": ref,
        "attacks": {"loss": att},
        "skipped_attacks": {},
        "best_attack": {"name": "loss", "value": tpr, "ci": t["ci"], "reliable": reliable},
        "utility": {"relative_change": rel, "relative_change_ci": list(rel_ci), "n_runs": n_runs},
        "r_q": {"mean": r_q, "ci": list(r_q_ci), "n_finite": n_runs, "n_undefined": 0},
        "r_q_status": "passed",  # the mechanics of the criterion, as if r_Q had passed its validation
    }


TH = {"max_tpr_at_1pct_fpr": 0.05, "min_r_q": 0.1, "max_utility_loss": 0.10, "min_runs": 5}


def _status(checklist, q, cid):
    return next(c for c in checklist.per_quantizer[q].criteria if c.id == cid).status


def test_unreliable_estimates_and_too_few_runs_are_not_measured():
    grid = [
        _row("fp", tpr=0.01, tpr_ci=(0.0, 0.02), ref=True),
        _row("few-negatives", tpr=0.01, tpr_ci=(0.0, 0.02), reliable=False),
        _row("few-runs", tpr=0.01, tpr_ci=(0.0, 0.02), n_models=3, n_runs=3),
        _row("leaky", tpr=0.30, tpr_ci=(0.2, 0.4)),
        _row("leaky-unreliable", tpr=0.30, tpr_ci=(0.2, 0.4), reliable=False),
    ]
    cl = release_checklist(_typed(grid), TH)
    assert cl.per_quantizer["fp"].overall == PASS
    assert _status(cl, "few-negatives", "attack_tpr") == NOT_MEASURED
    assert cl.per_quantizer["few-negatives"].overall == NOT_MEASURED
    assert _status(cl, "few-runs", "attack_tpr") == NOT_MEASURED
    assert _status(cl, "few-runs", "utility") == NOT_MEASURED and _status(cl, "few-runs", "r_q") == NOT_MEASURED
    assert _status(cl, "leaky", "attack_tpr") == FAIL
    crit = next(c for c in cl.per_quantizer["leaky-unreliable"].criteria if c.id == "attack_tpr")
    assert crit.status == NOT_MEASURED and "exceeds the limit" in crit.reason
    assert release_checklist(_typed(grid), TH | {"min_r_q": 0.0}).per_quantizer["fp"].criteria[1].status == "DISABLED"


def test_only_a_validated_indicator_drives_a_criterion():
    """r_Q as it stands (its validation failed) cannot clear or fail a quantizer; neither can an unvalidated
    candidate; a candidate that passed is judged like any estimate."""
    row = _row("fp", tpr=0.01, tpr_ci=(0.0, 0.02), ref=True) | {"r_q_status": "failed"}
    crit = {c.id: c for c in release_checklist(_typed([row]), TH).per_quantizer["fp"].criteria}
    # a failed indicator is off at every audit size (DISABLED), never a NOT MEASURED that no audit could lift
    assert crit["r_q"].status == "DISABLED" and "failed validation" in crit["r_q"].reason
    assert crit["indicator"].status == "DISABLED"  # min_indicator unset
    ind = {"name": "gap_std_final", "mean": -0.1, "ci": [-0.15, -0.05], "n_finite": 6}
    for status, want in (("not validated", NOT_MEASURED), ("passed", PASS)):
        row["indicator"] = ind | {"status": status}
        crit = {
            c.id: c for c in release_checklist(_typed([row]), TH | {"min_indicator": -0.2}).per_quantizer["fp"].criteria
        }
        assert crit["indicator"].status == want, crit["indicator"]
    row["indicator"] = ind | {"status": "passed", "mean": -0.5, "ci": [-0.6, -0.4]}
    crit = {
        c.id: c for c in release_checklist(_typed([row]), TH | {"min_indicator": -0.2}).per_quantizer["fp"].criteria
    }
    assert crit["indicator"].status == FAIL


def test_demo_sized_experiment_cannot_clear_tpr_at_one_percent(experiment):
    # 6 runs x 24 pool samples give far fewer than 10 / 0.01 = 1000 non-members: never PASS
    report = json.loads(experiment["outputs"]["json"])
    for q, entry in report["checklist"]["per_quantizer"].items():
        assert _status(Checklist.model_validate(report["checklist"]), q, "attack_tpr") == NOT_MEASURED
        assert entry["overall"] != PASS
    assert report["recommendation"]["cleared_for_release"] is False


def decided(row: dict, status: str, direction: str = "SAME", *, bits: float | None = None, est=(0.02, 0.01, 0.04)):
    """A grid row with a release decision (the typed model, as the analysis writes it) and a size."""
    value, low, high = est
    tpr = Estimate(value=value, low=low, high=high, confidence=0.9)
    strongest = StrongestAttack(
        tpr=tpr,
        realised_fpr=0.01,
        selected=["loss"] * 5,
        folds=5,
        fold_kind="target models",
        selection_stability={"loss": 1.0},
        members=400.0,
        nonmembers=1200.0,
    )
    judged = AttackJudgement(
        attack="loss", tpr=tpr, upper_bound=high, realised_fpr=0.01, members=400.0, nonmembers=1200.0, judged=True
    )
    comparison = Comparison(
        reference="fp",
        direction=direction,
        difference=Estimate(value=0.001, low=-0.004, high=0.006, confidence=0.9),
        margin=0.01,
        equivalent=direction == "SAME",
        sentence=f"{row['quantizer']} leaks {direction.lower()} (planted)",
    )
    decision = QuantizerDecision(
        quantizer=row["quantizer"],
        mode="calibrated",
        status=status,
        reason=f"planted {status}",
        limit=0.05,
        fpr=0.01,
        strongest=strongest,
        in_sample_max=Estimate(value=high),
        in_sample_max_attack="loss",
        attacks=[judged],
        comparison=None if row.get("is_reference") else comparison,
        size_needed=None,
        run_to_run_covered=True,
        n_targets=8,
    )
    return row | {"decision": decision.model_dump(mode="json"), "effective_bits": bits}


def test_recommendation_ranks_on_what_the_audit_can_tell_apart():
    """Verdict first, then leakage against full precision, then size, then utility; never an estimate's noise."""
    grid = [
        decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "FAIL", bits=32),
        decided(_row("q8", tpr=0.0, tpr_ci=None, rel=0.01, rel_ci=(0.0, 0.02)), "PASS", "SAME", bits=8.5),
        decided(_row("q4", tpr=0.0, tpr_ci=None, rel=0.05, rel_ci=(0.03, 0.08)), "PASS", "SAME", bits=4.5),
        decided(_row("q4b", tpr=0.0, tpr_ci=None, rel=0.03, rel_ci=(0.02, 0.05)), "PASS", "MORE", bits=4.5),
        decided(_row("q2", tpr=0.0, tpr_ci=None, rel=0.50, rel_ci=(0.4, 0.6)), "PASS", "LESS", bits=2.5),
        decided(_row("q3", tpr=0.0, tpr_ci=None, rel=0.08, rel_ci=(0.05, 0.12)), "PASS", "LESS", bits=3.5),
    ]
    cl = release_checklist(_typed(grid), TH)
    rec = recommend(_typed(grid), cl)
    # q2 is over the utility budget, q3's budget is INCONCLUSIVE, fp is the reference: not candidates
    assert set(rec.candidates) == {"q8", "q4", "q4b"}
    # q4b leaks MORE than full precision and loses to the larger q8 that leaks the same; q4 is smaller than q8
    assert rec.ranking == ["q4", "q8", "q4b"] and rec.cleared_for_release
    assert rec.runner_up.model_dump() == {
        "quantizer": "q8",
        "lost_on": "its size: 8.50 against 4.50 effective bits per weight",
    }
    # the same verdict, comparison and size: the utility decides, not the TPR estimates (planted far apart)
    twins = [
        decided(_row("a", tpr=0.0, tpr_ci=None, rel=0.04, rel_ci=(0.03, 0.05)), "PASS", bits=4.5, est=(0.0, 0.0, 0.01)),
        decided(
            _row("b", tpr=0.0, tpr_ci=None, rel=0.02, rel_ci=(0.01, 0.03)), "PASS", bits=4.5, est=(0.04, 0.03, 0.049)
        ),
    ]
    assert recommend(_typed(twins), release_checklist(_typed(twins), TH)).quantizer == "b"
    over = [_row("q2", tpr=0.0, tpr_ci=(0.0, 0.0), rel=0.5, rel_ci=(0.4, 0.6))]
    assert recommend(_typed(over), release_checklist(_typed(over), TH)).quantizer is None
    only = [decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "PASS", bits=32)]  # full precision is no candidate
    assert recommend(_typed(only), release_checklist(_typed(only), TH)).quantizer is None


def test_the_attack_criterion_reads_the_release_decision():
    row = decided(_row("q8", tpr=0.0, tpr_ci=None), "INCONCLUSIVE", est=(0.052, 0.034, 0.075))
    crit = next(c for c in release_checklist(_typed([row]), TH).per_quantizer["q8"].criteria if c.id == "attack_tpr")
    assert crit.status == INCONCLUSIVE and crit.reason == "planted INCONCLUSIVE"
    assert crit.value == 0.052 and crit.ci == [0.034, 0.075] and crit.attack == "loss"
    assert crit.in_sample_max.model_dump(exclude_unset=True) == {"attack": "loss", "value": 0.075}
    assert crit.per_attack["loss"].upper_bound == 0.075 and crit.per_attack["loss"].judged


# ------------------------------------------------------------------------------------------ Markdown


def test_markdown_is_compact_and_keeps_per_run_detail_in_json_only(experiment):
    md = experiment["outputs"]["markdown"]
    for heading in (
        "## Summary",
        "## Release checklist",
        "## Quantizer grid",
        "## Membership inference attacks",
        "## Memorization in bits",
        "## Most vulnerable samples",
        "## Provenance",
    ):
        assert heading in md
    assert "per run" not in md.split("## Memorization in bits")[1].split("##")[0].lower().replace("per-run detail", "")
    mem_table = md.split("## Memorization in bits")[1].split("## ")[0]
    assert sum(1 for line in mem_table.splitlines() if line.startswith("| `")) == len(QUANTIZERS)
    report = json.loads(experiment["outputs"]["json"])
    assert len(report["result"]["memorization"]["per_run"]) == len(QUANTIZERS) * RUNS
    assert "![r_Q per quantizer with its intervals](plots/r_q_intervals.png)" in md
    summary = render_markdown(report, only=("summary", "checklist"))
    assert "## Release checklist" in summary and "## Quantizer grid" not in summary


def test_indicator_lines_carry_the_registry_status_and_the_damage_caveat(experiment):
    """Each indicator's status and its beyond-damage answer come from the shipped registry; the summary warns
    when the primary indicator did not track the attacks beyond damage on the validation grid."""
    from llmaudit.analyze.candidates import validation_of
    from llmaudit.report.view import DAMAGE_CAVEAT

    report = json.loads(experiment["outputs"]["json"])
    summary = report["indicators"]
    primary = next(i for i in summary["indicators"] if i["name"] == summary["primary"])
    recorded = validation_of(primary["name"])
    assert primary["status"] == recorded["status"]
    assert primary["beyond_damage"] == recorded["beyond_damage"]["answer"]
    caveat = " ".join(DAMAGE_CAVEAT.split())
    for answer, shown in (("yes", False), ("not measured", False), ("no", True)):
        changed = copy.deepcopy(report)
        for i in changed["indicators"]["indicators"]:
            i["beyond_damage"] = answer
        summary_md = render_markdown(changed, only=("summary",))
        assert (caveat.split(":")[0] in " ".join(summary_md.split())) == shown, answer


@pytest.mark.parametrize(
    ("rho", "p", "verdict", "tail"),
    [
        (-0.9, 0.001, "agrees", "so r_Q agrees with the attacks; by attack: 2 negative, 1 positive."),
        (-0.3, 0.4, "leans the expected way (not significant)", "(not significant); by attack"),
        (
            0.9,
            0.001,
            "contradicts",
            "so r_Q contradicts the attacks: it ranks quantizers as MORE secure where the attacks are STRONGER; by",
        ),
        (
            0.3,
            0.4,
            "leans the opposite way (not significant)",
            "(not significant): it tends to rank quantizers as more secure where the attacks are stronger; by",
        ),
    ],
)
def test_indicator_agreement_states_the_observed_sign_against_the_expected_one(rho, p, verdict, tail):
    per_attack = SpearmanVsRQ.model_validate(
        {"attacks": {a: {"auroc": {"rho": v}} for a, v in (("loss", -0.5), ("ref", -0.2), ("zlib", 0.1))}}
    )
    out = indicator_agreement({"auroc": {"rho": rho, "p_value": p, "n_quantizers": 9}}, per_attack)
    assert out["verdict"] == verdict
    assert out["observed_sign"] == ("negative" if rho < 0 else "positive")
    assert out["attacks_by_sign"] == {"negative": 2, "positive": 1}
    assert out["sentence"].startswith(
        f"Across 9 quantizers, Spearman(r_Q, best-attack AUROC) = {rho:+.2f} (p = {p:.2g})"
    )
    assert tail in out["sentence"]
    assert "(not significant) the attacks" not in out["sentence"]
