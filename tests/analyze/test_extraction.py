"""Extraction risk (docs/science.md section 13): greedy extraction read from the top-1 flags equals what greedy
decoding produces, the (n, p) rule, the rates of members and non-members with their intervals, and the paired
comparison with full precision."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.extraction import (
    ExtractionMatrices,
    ExtractionSettings,
    exact_probability_threshold,
    extraction_matrices,
    greedy_check,
    greedy_check_of_table,
    greedy_extracted,
    sampled_extractable,
)
from llmaudit.analyze.extraction_risk import extraction_risk, resampled_rates
from llmaudit.score.engine import score_examples
from llmaudit.score.generate import greedy_generate
from tests.tiny_models import tiny_causal_lm

VOCAB = 96


def test_the_n_p_rule_and_its_threshold():
    for n, p in ((100, 0.5), (1, 0.5), (10, 0.9), (1000, 0.01)):
        star = exact_probability_threshold(n, p)
        assert 1 - (1 - star) ** n == pytest.approx(p, rel=1e-9)
        hits = sampled_extractable(np.log([star * 1.0001, star * 0.9999, np.nan]), n, p)
        assert hits[0] == 1.0 and hits[1] == 0.0 and np.isnan(hits[2])
    assert exact_probability_threshold(100, 0.5) == pytest.approx(0.006908, abs=1e-6)
    with pytest.raises(ValueError, match="n >= 1 and p in"):
        exact_probability_threshold(0, 0.5)


def test_greedy_extraction_of_flags():
    assert greedy_extracted([True, True, True]) == 1.0
    assert greedy_extracted(np.array([True, False, True])) == 0.0
    assert math.isnan(greedy_extracted(None)) and math.isnan(greedy_extracted([]))


def _tiny_model():
    return tiny_causal_lm(
        "llama",
        seed=0,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.3,  # peaked next-token distributions: no argmax ties in float32
        tie_word_embeddings=False,
    )


def _records(model, rng) -> tuple[list[tuple[list[int], list[int], str]], int]:
    """([(prompt, response ending with the stop token, kind)], the stop token): the model's own greedy answer
    (extracted), the same answer with one token changed, and the answer cut short by a stop token where the model
    would go on. The stop token (a stand-in for the end-of-turn token) is the one the model emits most often."""
    prompts = [rng.integers(1, VOCAB, size=int(rng.integers(3, 12))).tolist() for _ in range(60)]
    free = greedy_generate(model, prompts, max_new_tokens=12, stop_ids=[], pad_id=0)
    stop = int(np.bincount([t for row in free for t in row[2:] if t != 0]).argmax())  # never the pad id
    out = []
    for prompt, own in zip(prompts, greedy_generate(model, prompts, max_new_tokens=16, stop_ids=[stop], pad_id=0)):
        if own[-1] != stop or len(own) < 3:
            continue
        changed = list(own)
        j = int(rng.integers(0, len(own) - 1))
        changed[j] = 1 + (changed[j] + int(rng.integers(0, VOCAB - 2))) % (VOCAB - 1)  # another token, never 0
        out += [(prompt, own, "own"), (prompt, changed, "changed"), (prompt, own[:-2] + [stop], "cut")]
    return out, stop


def test_top1_flags_say_exactly_whether_greedy_decoding_reproduces_the_response_end_of_turn_included():
    """Teacher forcing on prompt + response against real greedy decoding of the prompt, token for token: every
    response token (the end-of-turn included) is the top-1 iff the decoder emits the response and stops there."""
    model = _tiny_model()
    rng = np.random.default_rng(0)
    records, stop = _records(model, rng)
    examples = [(p + r, [False] * len(p) + [True] * len(r)) for p, r, _ in records]
    scores = score_examples(model, examples, pad_id=0)
    limit = math.ceil(1.5 * max(len(r) for _, r, _ in records))  # as the scorer plans generation
    generated = greedy_generate(model, [p for p, _, _ in records], max_new_tokens=limit, stop_ids=[stop], pad_id=0)
    flags = [greedy_extracted(s.top1) for s in scores]
    reproduced = [float(g == r) for g, (_, r, _) in zip(generated, records)]
    assert flags == reproduced
    kinds = {k: [f for f, (_, _, kk) in zip(flags, records) if kk == k] for k in ("own", "changed", "cut")}
    assert len(kinds["own"]) >= 8 and all(f == 1.0 for f in kinds["own"])
    assert all(f == 0.0 for f in kinds["cut"])  # every token but the early stop is top-1: not extracted
    assert all(f == 0.0 for f in kinds["changed"])  # the changed token is not the top-1 there


def test_greedy_check_counts_rows_where_flags_and_generated_answers_disagree():
    top1 = [[True, True], [True, False], [True, True], [False], None, [True]]
    generated = ["CCO", "CCN", "C=O", "xyz", "CCO", None]
    refs = [" CCO", "CCN", "CO", "abc", "CCO", "N"]
    check = greedy_check("q", top1, generated, refs)
    assert (check.answers, check.both, check.top1_only, check.text_only) == (4, 1, 1, 1)
    assert check.rate_top1 == 0.5 and check.rate_text == 0.5 and not check.agree
    assert greedy_check("q", top1[:1], generated[:1], refs[:1]).agree


def _table(greedy: np.ndarray, losses: np.ndarray, keep: np.ndarray, quantizer: str, top1: bool = True):
    """A loss table's pool rows at each run's final checkpoint (and an earlier one that must be ignored)."""
    rows = []
    M, N = keep.shape
    for m in range(M):
        for i in range(N):
            flags = [True, True, bool(greedy[m, i])]
            tokens = np.full(3, losses[m, i] / 3, dtype=np.float32)
            for step in (5, 10):
                row = dict(run=m, checkpoint=step, quantizer=quantizer, sample_id=f"s{i}", split="pool")
                row |= dict(member=bool(keep[m, i]), loss=float(tokens.mean()), n_tokens=3, token_losses=tokens)
                if top1:
                    row["token_top1"] = flags if step == 10 else [False] * 3
                rows.append(row)
    return pd.DataFrame(rows)


def _world(seed: int, M: int = 4, N: int = 300, boost: float = 0.15):
    rng = np.random.default_rng(seed)
    keep = rng.random((M, N)) < 0.5
    propensity = rng.beta(1, 9, size=N)  # some records are predictable whoever trained on them
    greedy = rng.random((M, N)) < np.clip(propensity + boost * keep, 0, 1)
    losses = np.where(rng.random((M, N)) < propensity + boost * keep, 2.0, 9.0)  # summed nats: 2 < 4.975 < 9
    return keep, greedy, losses


def test_rates_are_the_shares_of_members_and_non_members_with_intervals_around_them():
    keep, greedy, losses = _world(1)
    df = pd.concat([_table(greedy, losses, keep, "fp32"), _table(greedy, losses, keep, "q4")])
    result = extraction_risk({q: extraction_matrices(df, q) for q in ("fp32", "q4")}, "fp32", s=_settings())
    rates = {r.measure: r for r in result.per_quantizer["fp32"].rates}
    assert rates["greedy"].members.value == pytest.approx(greedy[keep].mean())
    assert rates["greedy"].nonmembers.value == pytest.approx(greedy[~keep].mean())
    assert rates["sampled"].members.value == pytest.approx((losses[keep] < 4.975).mean())
    g = rates["greedy"]
    assert g.memorized.value == pytest.approx(g.members.value - g.nonmembers.value)
    for e in (g.members, g.nonmembers, g.memorized):
        assert e.low < e.value < e.high
    assert g.member_rows == keep.sum() and g.nonmember_rows == (~keep).sum()
    same = result.per_quantizer["q4"].comparison
    assert {c.measure for c in same} == {"greedy", "sampled"}
    assert all(c.direction == "SAME" and c.memorized.value == 0 for c in same)  # identical files: no difference


def _settings(**kw) -> DecisionSettings:
    return DecisionSettings(resamples=300, **kw)


def test_a_quantizer_that_erases_memorization_reads_less_and_one_that_restores_it_more():
    keep, greedy, losses = _world(2, M=6, N=400, boost=0.3)
    erased = greedy & ~keep | (greedy & keep & (np.random.default_rng(0).random(keep.shape) < 0.3))
    restored = greedy | (keep & (np.random.default_rng(1).random(keep.shape) < 0.3))
    df = pd.concat(
        [
            _table(greedy, losses, keep, "bf16"),
            _table(erased, losses, keep, "q2"),
            _table(restored, losses, keep, "q8"),
        ]
    )
    result = extraction_risk({q: extraction_matrices(df, q) for q in ("bf16", "q2", "q8")}, "bf16", s=_settings())
    change = {q: {c.measure: c for c in result.per_quantizer[q].comparison} for q in ("q2", "q8")}
    assert change["q2"]["greedy"].direction == "LESS" and change["q8"]["greedy"].direction == "MORE"
    assert change["q2"]["greedy"].nonmembers.value == 0  # only members' extraction changed
    assert change["q2"]["greedy"].sentence.startswith("q2 gives back less of what was memorized than bf16 (greedy")


def test_the_rates_intervals_cover_the_truth():
    """300 simulated audits of known expected rates (members 0.25, non-members 0.10, records of different
    predictability scored by 4 runs): each 95% interval covers the truth in at least 90% of them."""
    covered = np.zeros(3)
    for seed in range(300):
        keep, greedy, losses = _world(100 + seed, M=4, N=300)
        ids = tuple(f"s{i}" for i in range(300))
        m = ExtractionMatrices("q", (0, 1, 2, 3), ids, keep, greedy.astype(float), -losses)
        r = extraction_risk({"q": m}, None, s=DecisionSettings(resamples=200)).per_quantizer["q"].rates[0]
        covered += [
            r.members.low <= 0.25 <= r.members.high,
            r.nonmembers.low <= 0.10 <= r.nonmembers.high,
            r.memorized.low <= 0.15 <= r.memorized.high,
        ]
    assert (covered / 300 >= 0.9).all(), covered / 300


def test_one_run_resamples_members_and_non_members_apart_and_a_table_without_flags_measures_sampled_only():
    keep, greedy, losses = _world(3, M=1, N=500)
    m = extraction_matrices(_table(greedy, losses, keep, "q", top1=False), "q")
    assert m.greedy is None
    result = extraction_risk({"q": m}, None, s=_settings()).per_quantizer["q"]
    assert [r.measure for r in result.rates] == ["sampled"] and "top-1" in result.not_measured["greedy"]
    weights = np.random.default_rng(0).integers(0, 3, size=(4, 500)).astype(float)
    by_hand = resampled_rates(np.where(losses < 4.975, 1.0, 0.0), keep, weights)
    w = weights[:, None, :] * np.ones_like(keep)[None]
    hit = (losses < 4.975)[None]
    assert by_hand[:, 0] == pytest.approx((w * hit * keep).sum((1, 2)) / (w * keep).sum((1, 2)))


def test_a_light_table_without_the_greedy_column_is_refused_rather_than_read_as_unmeasured():
    keep, greedy, losses = _world(4, M=2, N=20)
    light = _table(greedy, losses, keep, "q").assign(sequence_bits=9.0 / np.log(2), token_top1=None)
    with pytest.raises(ValueError, match="light table"):
        extraction_matrices(light, "q")
    flagged = extraction_matrices(light.assign(greedy_extracted=1.0), "q")
    assert (flagged.greedy == 1.0).all() and flagged.log_p_exact == pytest.approx(np.full(keep.shape, -9.0))


def test_greedy_check_of_a_table_reads_the_final_checkpoints_generated_answers():
    rows = []
    for run in (0, 1):
        for step, text in ((5, "wrong"), (10, "CCO")):
            rows.append(
                dict(run=run, checkpoint=step, quantizer="q", sample_id="v0", split="val", generated=text)
                | dict(token_top1=[True, step == 10 and run == 0])
            )
    check = greedy_check_of_table(pd.DataFrame(rows), "q", {"v0": "CCO"})
    assert (check.answers, check.both, check.text_only) == (2, 1, 1)  # run 1's answer matches without the flags


def test_extraction_settings_are_checked():
    with pytest.raises(ValueError):
        ExtractionSettings(n=0).check()
    with pytest.raises(ValueError):
        ExtractionSettings(p=1.0).check()
