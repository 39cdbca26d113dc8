"""Extraction risk, release sets and the one-run epsilon bound wired into an audit's outputs (docs/science.md
sections 13-15): a store written by hand with planted memorization (every member's response is the model's top-1
at every token, a member's loss far below a non-member's), analysed with the real `analyze` and rendered.

Known truth: members' greedy extraction rate is 1; non-members' is the share of their rows planted top-1 (every
fourth record's); the greedy answers generated on the validation records are the reference response exactly where
every token is top-1; the membership is drawn independently with probability 1/2, so the epsilon bound applies.
"""

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.epsilon_bound import RECREATE
from llmaudit.analyze.release_risks import epsilon_block
from llmaudit.analyze.release_sets import ReleaseSetDecision
from llmaudit.analyze.result import as_result
from llmaudit.analyze.result_risks import EpsilonBlock, ExtractionBlock, ReleaseSetNotMeasured
from llmaudit.analyze.store_analysis import analyze
from llmaudit.common.io import atomic_write_json
from llmaudit.config import ExperimentConfig, RecipeError
from llmaudit.data.pool import membership_masks
from llmaudit.report.markdown import render_markdown
from llmaudit.report.model_card import render_model_card
from llmaudit.report.schema import validate_report
from llmaudit.report.write import write_report
from llmaudit.store.losstable import validate_loss_table
from tests.conftest import run_cli, write_store_from_table

N_POOL, N_VAL, RUNS, STEPS, N_TOK = 240, 8, 10, (10, 20), 5
QUANTIZERS = {"fp32": (1.2, 32.0), "uniform-5": (0.6, 5.0), "sign": (0.0, 1.0)}
"""quantizer: (member loss shift at the final checkpoint, bits)."""
SETS = [["fp32", "uniform-5"]]


def _record(split, j):
    return {
        "sample_id": f"synthetic/{split}/{j:04d}",
        "task": "molecule_captioning",
        "split": split,
        "input": f"Describe molecule C{j}O{j}",
        "output": f"The molecule is compound number {j}.",
    }


def _formulaic(j):
    """Every fourth record's response is the model's top-1 whether or not it was trained on."""
    return j % 4 == 0


def _row(rng, key, loss, member, top1, generated=None):
    run, step, q, split, j = key
    tl = np.abs(rng.normal(loss, 0.1, N_TOK))
    return dict(
        run=run,
        checkpoint=step,
        quantizer=q,
        sample_id=f"synthetic/{split}/{j:04d}",
        split=split,
        member=member,
        loss=float(tl.mean()),
        n_tokens=N_TOK,
        token_losses=tl,
        token_top1=[True] * N_TOK if top1 else [True] * (N_TOK - 1) + [False],
        generated=generated,
    )


def _loss_rows(rng, membership):
    rows = [
        _row(rng, (-1, 0, "fp32", s, j), 2.0, False, _formulaic(j))
        for s, n in (("pool", N_POOL), ("val", N_VAL))
        for j in range(n)
    ]
    for q, (shift, _bits) in QUANTIZERS.items():
        for run in range(RUNS):
            for k, step in enumerate(STEPS):
                final = k == len(STEPS) - 1
                for j in range(N_POOL):
                    member = bool(membership[run, j])
                    loss = 2.0 - shift * member * (k + 1) / len(STEPS)
                    top1 = member or _formulaic(j)  # planted: every member's response is top-1
                    rows.append(_row(rng, (run, step, q, "pool", j), loss, member, top1))
                for j in range(N_VAL):
                    answer = _record("val", j)["output"] if _formulaic(j) else "Something else."
                    rows.append(
                        _row(rng, (run, step, q, "val", j), 2.0, False, _formulaic(j), answer if final else None)
                    )
    return validate_loss_table(pd.DataFrame(rows))


def _make_store(root, membership_design="independent"):
    cfg = ExperimentConfig(
        name="tiny-risks",
        output_dir=str(root),
        train={"runs": RUNS, "membership": membership_design, "member_fraction": 0.5},
        score={"quantizers": list(QUANTIZERS)},
        attack={"attacks": ["loss", "ref"], "n_boot": 30},
        report={"release_sets": SETS, "decision_resamples": 200},
    )
    pool, val = [_record("pool", j) for j in range(N_POOL)], [_record("val", j) for j in range(N_VAL)]
    membership = membership_masks(N_POOL, RUNS, 0.5, seed=0, design=membership_design)
    table = _loss_rows(np.random.default_rng(3), membership)
    store = write_store_from_table(root, cfg, pool, val, membership, table)
    for q, (_shift, bits) in QUANTIZERS.items():
        info = {"name": q, "family": "full" if q == "fp32" else "simple", "bits": bits, "effective_bits": bits}
        atomic_write_json(store.scores_dir / "quantizers" / f"{q}.json", info | {"model_size_bytes": int(bits * 100)})
    return cfg, store, membership


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    root = tmp_path_factory.mktemp("risks")
    cfg, store, membership = _make_store(root)
    result = analyze(cfg, store, echo=lambda *a, **k: None)
    paths = write_report(store, result)
    return {"cfg": cfg, "store": store, "membership": membership, "result": result, "paths": paths}


def _rates(result, q, measure="greedy"):
    return next(r for r in result.extraction.risk.per_quantizer[q].rates if r.measure == measure)


def test_members_greedy_extraction_is_one_and_non_members_the_planted_share(audited):
    membership = audited["membership"]
    formulaic = np.array([_formulaic(j) for j in range(N_POOL)])
    expected_non = (~membership & formulaic).sum() / (~membership).sum()
    for q in QUANTIZERS:
        r = _rates(audited["result"], q)
        assert r.members.value == 1.0
        assert r.nonmembers.value == pytest.approx(expected_non)
        assert r.nonmembers.low < expected_non < r.nonmembers.high
        assert r.memorized.value == pytest.approx(1.0 - expected_non)
        assert r.member_rows == membership.sum() and r.nonmember_rows == (~membership).sum()


def test_sampled_extraction_follows_the_loss_and_the_comparison_is_paired_with_full_precision(audited):
    risk = audited["result"].extraction.risk
    assert risk.reference == "fp32" and risk.n == 100 and risk.p == 0.5
    # fp32 members: summed loss about 5 x 0.8 = 4 nats < 4.975 (p* at n=100, p=0.5); "sign" members stay at 10 nats
    assert _rates(audited["result"], "fp32", "sampled").members.value > 0.9
    assert _rates(audited["result"], "sign", "sampled").members.value == 0.0
    sign = {c.measure: c for c in risk.per_quantizer["sign"].comparison}
    assert sign["sampled"].direction == "LESS" and sign["sampled"].reference == "fp32"
    assert sign["greedy"].memorized.value == 0.0  # greedy flags planted alike under every quantizer
    assert risk.per_quantizer["fp32"].comparison == []


def test_greedy_from_top1_equals_the_generated_greedy_answers(audited):
    checks = audited["result"].extraction.greedy_check
    expected = sum(_formulaic(j) for j in range(N_VAL)) / N_VAL
    for q in QUANTIZERS:
        c = checks[q]
        assert c.answers == RUNS * N_VAL and c.agree
        assert c.rate_top1 == c.rate_text == pytest.approx(expected)


def test_epsilon_bound_per_quantizer_from_an_independent_design(audited):
    eps = audited["result"].epsilon
    assert eps.qualifies and eps.design == "independent"
    fp32, sign = eps.per_quantizer["fp32"], eps.per_quantizer["sign"]
    assert fp32.status == "MEASURED" and fp32.epsilon_lb > 1.0
    assert fp32.attack.startswith("loss")  # ref reads the other runs' memberships: never used
    assert fp32.records == RUNS * N_POOL and fp32.correct <= fp32.guesses
    assert sign.status == "MEASURED" and sign.epsilon_lb < fp32.epsilon_lb


def test_the_risk_blocks_read_back_from_result_json_are_typed_and_written_again_key_for_key(audited):
    path = audited["store"].results_dir / "result.json"
    recorded = json.loads(path.read_text(encoding="utf-8"))
    again = as_result(recorded)
    assert isinstance(again.extraction, ExtractionBlock) and isinstance(again.epsilon, EpsilonBlock)
    assert [type(s) for s in again.release_sets] == [ReleaseSetDecision]
    assert again.extraction.risk.per_quantizer["fp32"].rates[0].members.value == 1.0
    for key in ("extraction", "release_sets", "epsilon"):
        assert json.dumps(again.to_json()[key]) == json.dumps(recorded[key])
    assert again.to_json()["extraction"] == audited["result"].to_json()["extraction"]


def test_a_fixed_size_design_says_why_no_bound():
    manifest = {"identity": {"train": {"member_fraction": 0.5}}}  # a store made before train.membership existed
    block = epsilon_block({}, manifest, seed=0)
    assert not block.qualifies and "fixed_fraction" in block.reason and RECREATE in block.reason
    assert block.per_quantizer == {}


def test_release_set_is_judged_and_compared_with_its_best_single_file(audited):
    (s,) = audited["result"].release_sets
    assert isinstance(s, ReleaseSetDecision)
    assert s.name == "fp32+uniform-5" and s.files == SETS[0]
    assert s.decision.quantizer == "fp32+uniform-5" and s.decision.status in ("PASS", "FAIL", "INCONCLUSIVE")
    assert s.best_single_file in SETS[0] and s.sentence.startswith("publishing fp32, uniform-5 together")


def test_a_release_set_naming_a_quantizer_left_out_is_refused_before_any_work(audited, monkeypatch):
    import llmaudit.analyze.store_analysis as sa

    monkeypatch.setattr(sa, "load_store_table", lambda *a, **k: pytest.fail("the store was read"))
    with pytest.raises(RecipeError, match=r"report.release_sets: 'uniform-5' in \['fp32', 'uniform-5'\]"):
        analyze(audited["cfg"], audited["store"], quantizers=["fp32", "sign"], echo=lambda *a, **k: None)


def test_the_command_exits_2_with_one_line(audited):
    code, out, err = run_cli(["report", str(audited["store"].root), "--quantizers", "fp32,sign"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "report.release_sets" in err


def test_report_json_markdown_html_and_card_carry_each_section(audited):

    paths = audited["paths"]
    report = json.loads(Path(paths["json"]).read_text(encoding="utf-8"))
    validate_report(report)
    assert report["extraction"]["risk"]["per_quantizer"]["fp32"]["rates"][0]["members"]["value"] == 1.0
    assert report["release_sets"][0]["name"] == "fp32+uniform-5" and report["epsilon"]["qualifies"]
    md = Path(paths["markdown"]).read_text(encoding="utf-8")
    html = Path(paths["html"]).read_text(encoding="utf-8")
    for title in ("Extraction risk per quantizer", "Release sets", "Privacy-loss lower bound (one run)"):
        assert f"## {title}" in md and title in html
    fp32_eps = report["epsilon"]["per_quantizer"]["fp32"]["epsilon_lb"]
    assert f"| `fp32` | {fp32_eps:.3f} | `loss`" in md
    card = render_model_card(report, quantizer="uniform-5")
    assert "Training responses reproduced exactly by `uniform-5`" in card and "members 1.000" in card
    assert "Published together (`fp32+uniform-5`)" in card
    eps = report["epsilon"]["per_quantizer"]["uniform-5"]["epsilon_lb"]
    assert f"for `uniform-5`: epsilon >= {eps:.3f}" in card
    sign_card = render_model_card(report, quantizer="sign")
    assert "Published together" not in sign_card  # sign is in no set


def test_a_report_without_a_qualifying_design_says_why_in_the_report_and_card(audited):
    report = copy.deepcopy(json.loads(Path(audited["paths"]["json"]).read_text(encoding="utf-8")))
    block = epsilon_block({}, {"identity": {"train": {"membership": "fixed_fraction"}}}, seed=0)
    report["epsilon"] = block.model_dump(mode="json")
    md = render_markdown(report)
    assert "Not computed for this store" in md and "fixed" in md
    assert "lower bound (one run): not computed: each run trained on a fixed-size" in render_model_card(
        report, quantizer="fp32"
    )


def test_a_set_with_a_file_left_out_or_attacked_on_other_targets_is_not_measured():
    from llmaudit.analyze.decision import DecisionSettings
    from llmaudit.analyze.decision.decide import QuantizerEvidence
    from llmaudit.analyze.release_risks import release_sets_block

    keep = np.array([[True, False, True, False]])
    ev = {
        q: QuantizerEvidence(q, "empirical", list("wxyz"), k, {"loss": np.zeros((1, 4), np.float32)})
        for q, k in (("a", keep), ("b", ~keep))
    }
    other, left_out = release_sets_block(ev, [["a", "b"], ["a", "c"]], DecisionSettings())
    assert isinstance(other, ReleaseSetNotMeasured) and "not attacked on the same target models" in other.not_measured
    assert left_out.name == "a+c" and left_out.files == ["a", "c"]
    assert "c not attacked in this analysis" in left_out.not_measured


def test_report_takes_overrides_of_the_report_section_only(audited):
    root = str(audited["store"].root)
    code, _, err = run_cli(["report", root, "score.quantizers=[fp32]"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "report section only" in err
    code, _, err = run_cli(["report", root, "report.release_sets=[[fp32,uniform-4]]"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "did you mean 'uniform-5'" in err


def test_the_recorded_settings_of_an_analysis_are_typed_from_the_recipe(audited):
    result = audited["result"]
    assert result.thresholds.decision_resamples == 200 and result.thresholds.release_sets == SETS
    assert dict(result.thresholds) == audited["cfg"].report.model_dump(exclude={"processes"})
    assert result.attacks.settings.n_boot == 30 and result.attacks.settings.n_pool == N_POOL
    assert set(result.attacks.attack_definitions) >= {"loss", "ref"}
    assert result.r_q.stability.n_runs == RUNS and result.r_q.protocol.n_boot == max(
        result.attacks.settings.n_boot, 200
    )
