"""Task metrics of generated answers against hand-computed values; missing libraries are NOT MEASURED with the
install hint; nothing is downloaded."""

from __future__ import annotations

import math
import socket

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze import taskmetrics as tm


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Every metric here must work offline: any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a task metric tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_canonical_smiles_make_kekule_and_aromatic_benzene_an_exact_match():
    assert tm.canonical_smiles("c1ccccc1") == tm.canonical_smiles("C1=CC=CC=C1") == "c1ccccc1"
    assert tm.canonical_smiles("C1CC") is None and tm.canonical_smiles("") is None
    out = tm.smiles_metrics(["C1=CC=CC=C1", "OCC", "C1CC", ""], ["c1ccccc1", "CCN", "CC", "CC"])
    assert out["smiles_exact_match"] == 0.25  # benzene only (OCC is ethanol, not ethylamine)
    assert out["smiles_validity"] == 0.5  # an unclosed ring and an empty answer are invalid
    # valid answers only: benzene vs benzene 1.0, ethanol vs ethylamine (Morgan r2 counts) 1/3
    assert out["smiles_tanimoto"] == pytest.approx((1.0 + 1 / 3) / 2)
    assert tm.morgan_tanimoto("CCO", "CCN") == pytest.approx(1 / 3)


def test_bleu_and_rouge_by_hand():
    hyp, ref = ["the cat sat on the mat"], ["the cat sat on a mat"]
    # unigrams 5/6, bigrams 3/5, trigrams 2/4, 4-grams 1/3, equal lengths (no brevity penalty)
    assert tm.corpus_bleu(hyp, ref, 2) == pytest.approx(math.sqrt(5 / 6 * 3 / 5))
    assert tm.corpus_bleu(hyp, ref, 4) == pytest.approx((5 / 6 * 3 / 5 * 2 / 4 * 1 / 3) ** 0.25)
    # LCS "the cat sat on mat" = 5 of 6 tokens each way: F = 5/6; an empty answer scores 0
    assert tm.rouge_l(hyp + [""], ref + ["x"]) == pytest.approx((5 / 6 + 0) / 2)
    assert tm.normalised_match(["a  b ", "a"], ["a b", "b"]) == 0.5


def test_families_and_answer_extraction():
    gen = {"task": "molecule_generation", "output": "<SMILES> CCO </SMILES>"}
    gen |= {"output_core_tag_left": "<SMILES>", "output_core_tag_right": "</SMILES>"}
    assert tm.task_family(gen) == "smiles"
    assert tm.extract_answer("Sure: <SMILES> C1=CC=CC=C1 </SMILES> done", gen) == "C1=CC=CC=C1"
    assert tm.extract_answer("CCO", gen) == "CCO"  # no tag: the whole answer
    assert tm.reference_answer(gen) == "CCO"
    mine = {"task": "input-output", "output": "<SMILES> CCN </SMILES>"}  # a user's record carrying SMILES
    assert tm.task_family(mine) == "smiles" and tm.reference_answer(mine) == "CCN"
    assert tm.task_family({"task": "molecule_captioning", "output": "A molecule."}) == "caption"
    assert tm.task_family({"task": "messages", "output": "Paris"}) == "text"


def _records():
    recs = []
    for j in range(4):
        if j % 2 == 0:
            recs.append(
                {
                    "sample_id": f"g{j}",
                    "task": "molecule_generation",
                    "output": "<SMILES> c1ccccc1 </SMILES>",
                    "output_core_tag_left": "<SMILES>",
                    "output_core_tag_right": "</SMILES>",
                }
            )
        else:
            recs.append({"sample_id": f"c{j}", "task": "molecule_captioning", "output": "the cat sat on a mat"})
    return recs


def _table(answers: dict[str, dict[int, dict[str, str]]]) -> pd.DataFrame:
    rows = []
    for q, runs in answers.items():
        for run, texts in runs.items():
            for step in (5, 10):
                for rec in _records():
                    text = texts.get(rec["sample_id"]) if step == 10 else None
                    rows.append(
                        dict(
                            run=run,
                            checkpoint=step,
                            quantizer=q,
                            sample_id=rec["sample_id"],
                            split="val",
                            generated=text,
                        )
                    )
    return pd.DataFrame(rows)


GOOD = {"g0": "<SMILES> C1=CC=CC=C1 </SMILES>", "c1": "the cat sat on the mat"}


def test_per_quantizer_values_over_runs_and_drop_vs_reference():
    bad = {"g0": "<SMILES> C1CC </SMILES>", "c1": ""}
    answers = {"fp32": {0: GOOD, 1: GOOD}, "q": {0: GOOD, 1: bad}}
    out = tm.task_metrics_from_table(_table(answers), _records(), ["fp32", "q"], "fp32", n_boot=100)
    assert out["measured"] and out["n_samples"] == 2 and not out["not_measured"]
    fp, q = out["per_quantizer"]["fp32"], out["per_quantizer"]["q"]
    assert fp["smiles_exact_match"]["value"] == 1.0 and q["smiles_exact_match"]["per_run"] == [1.0, 0.0]
    assert q["smiles_validity"]["value"] == 0.5
    assert q["smiles_tanimoto"]["per_run"][0] == 1.0 and math.isnan(q["smiles_tanimoto"]["per_run"][1])
    assert q["smiles_tanimoto"]["n_runs"] == 1  # no valid answer in run 1: left out, counted
    assert q["caption_bleu2"]["per_run"] == pytest.approx([math.sqrt(0.5), 0.0])
    assert q["smiles_exact_match"]["drop_vs_reference"]["value"] == pytest.approx(0.5)
    assert q["smiles_exact_match"]["drop_vs_reference"]["ci"] == pytest.approx([0.0, 1.0])
    assert fp["caption_rouge_l"]["drop_vs_reference"]["value"] == 0.0
    assert set(out["metrics"]) == {m for m in tm.TASK_METRICS if not m.startswith("text_")}


def test_different_subsets_or_no_answers_are_not_measured():
    other = {"g2": "<SMILES> CCO </SMILES>", "c3": "x"}
    out = tm.task_metrics_from_table(
        _table({"fp32": {0: GOOD}, "q": {0: other}}), _records(), ["fp32", "q"], "fp32", n_boot=10
    )
    assert not out["measured"] and "--refresh-utility" in out["reason"]
    none = tm.task_metrics_from_table(_table({"fp32": {0: {}}}), _records(), ["fp32"], "fp32", n_boot=10)
    assert not none["measured"] and "generation_samples" in none["reason"]


def test_a_missing_library_is_not_measured_with_the_install_hint(monkeypatch):
    real = tm._available

    def without_rdkit(module):
        return False if module == "rdkit" else real(module)

    monkeypatch.setattr(tm, "_available", without_rdkit)
    out = tm.task_metrics_from_table(_table({"fp32": {0: GOOD}}), _records(), ["fp32"], "fp32", n_boot=10)
    assert out["not_measured"]["smiles_exact_match"] == "RDKit is not installed (pip install 'llmaudit[chem]')"
    assert "smiles_validity" not in out["per_quantizer"]["fp32"] and "caption_bleu4" in out["per_quantizer"]["fp32"]
    assert np.isfinite(out["per_quantizer"]["fp32"]["caption_bleu4"]["value"])


def test_a_users_own_records_without_smiles_get_exact_match_and_rouge():
    """`llmaudit import` records (task 'messages'): normalised exact match and ROUGE-L; with SMILES tags the
    SMILES metrics instead."""
    records = [
        {"sample_id": "m0", "task": "messages", "output": "The capital is Paris."},
        {"sample_id": "m1", "task": "prompt-completion", "output": "<SMILES> CCO </SMILES>"},
    ]
    rows = [
        dict(run=0, checkpoint=3, quantizer="bf16", sample_id="m0", split="val", generated="The  capital is Paris."),
        dict(run=0, checkpoint=3, quantizer="bf16", sample_id="m1", split="val", generated="<SMILES> OCC </SMILES>"),
    ]
    out = tm.task_metrics_from_table(pd.DataFrame(rows), records, ["bf16"], "bf16", n_boot=10)
    got = {m: v["value"] for m, v in out["per_quantizer"]["bf16"].items()}
    assert got["text_exact_match"] == 1.0 and got["text_rouge_l"] == 1.0
    assert got["smiles_exact_match"] == 1.0 and got["smiles_validity"] == 1.0  # OCC is CCO
    assert not any(m.startswith("caption_") for m in got)
