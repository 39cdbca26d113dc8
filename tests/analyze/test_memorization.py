"""Memorization in bits: hand-computed answers (arithmetic in the comments).

Token losses are written as bits x ln 2 nats, so every H below is a whole number of bits."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.memorization import (
    MemorizationError,
    mem_u_bits,
    memorization_from_table,
    per_sample_memorization,
    sequence_bits,
)
from llmaudit.analyze.memorization_capacity import membership_f1_sigmoid_law
from llmaudit.commands.memorization import memorization_command
from llmaudit.report.memorization_md import markdown_section
from llmaudit.store.losstable import write_loss_table

LN2 = math.log(2.0)


def _row(run, checkpoint, quantizer, sample_id, token_bits, member=False):
    split = "val" if sample_id == "v" else "pool"
    nats = [b * LN2 for b in token_bits]
    return {
        "run": run,
        "checkpoint": checkpoint,
        "quantizer": quantizer,
        "sample_id": sample_id,
        "split": split,
        "member": member,
        "loss": float(np.mean(nats)),
        "n_tokens": len(nats),
        "token_losses": nats,
    }


# Base model (run -1): every sample is two tokens of 4 bits, H(x | ref) = 8 bits.
BASE = {s: [4, 4] for s in "abcdv"}
# Final checkpoint (10) of each run, per quantizer: token bits per sample.
TARGET = {
    # run 0 trains on a, b.  H(x|target): a 2, b 0, c 9, d 7, v 7
    # mem_U = 8 - min(8, H):   a 6, b 8, c 0, d 1, v 1
    (0, "fp32"): {"a": [1, 1], "b": [0, 0], "c": [4, 5], "d": [3, 4], "v": [4, 3]},
    # run 1 trains on c, d.  H: a 10, b 8, c 4, d 6, v 8  ->  mem_U: a 0, b 0, c 4, d 2, v 0
    (1, "fp32"): {"a": [5, 5], "b": [4, 4], "c": [2, 2], "d": [2, 4], "v": [4, 4]},
    # int8 run 0 agrees with the base everywhere -> mem_U 0 for all samples.
    (0, "int8"): dict(BASE),
    # int8 run 1: only c differs, H(c) = 7 -> mem_U(c) = 1, everything else 0.
    (1, "int8"): {**BASE, "c": [4, 3]},
}
MEMBERS = {0: {"a", "b"}, 1: {"c", "d"}}


def hand_table() -> pd.DataFrame:
    rows = [_row(-1, 0, "fp32", s, bits) for s, bits in BASE.items()]
    for (run, quantizer), samples in TARGET.items():
        for s, bits in samples.items():
            rows.append(_row(run, 10, quantizer, s, bits, member=s in MEMBERS[run]))
    # An early checkpoint of run 0 that memorised everything: must be ignored (not the final one).
    rows += [_row(0, 5, "fp32", s, [0, 0], member=s in MEMBERS[0]) for s in "abcdv"]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- math


def test_sequence_bits_sums_tokens_in_bits():
    # -ln(1/2) nats = 1 bit, -ln(1/4) = 2 bits: the sequence holds 1 + 2 = 3 bits (a sum, not a mean).
    assert sequence_bits([math.log(2), math.log(4)]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="one sequence"):
        sequence_bits(np.zeros((2, 3)))


def test_mem_u_is_zero_when_target_and_reference_agree():
    h = np.array([0.0, 3.5, 12.0, 100.0])
    np.testing.assert_array_equal(mem_u_bits(h, h), np.zeros(4))


def test_mem_u_equals_reference_bits_when_target_gives_probability_one():
    # p(x | target) = 1: every token loss is 0, H(x | target) = 0, so mem_U = H(x | ref) - 0.
    h_ref = np.array([8.0, 2.5, 40.0])
    h_target = np.array([sequence_bits(np.zeros(3)) for _ in h_ref])
    np.testing.assert_allclose(mem_u_bits(h_ref, h_target), h_ref)


def test_mem_u_never_negative_and_is_max_of_zero_and_difference():
    rng = np.random.default_rng(0)
    h_ref = rng.uniform(0, 50, size=1000)
    h_target = rng.uniform(0, 50, size=1000)
    mem = mem_u_bits(h_ref, h_target)
    assert mem.shape == (1000,)
    assert (mem >= 0).all()
    np.testing.assert_allclose(mem, np.maximum(h_ref - h_target, 0.0))
    # A target worse than the reference (h_target > h_ref) gives exactly 0: max(p) keeps the reference.
    assert mem_u_bits(5.0, 9.0) == 0.0


def test_mem_u_is_additive_over_a_data_set():
    # mem_U(D) is the sum of mem_U(x): the total over a split equals the sum over its two halves.
    rng = np.random.default_rng(1)
    h_ref, h_target = rng.uniform(0, 20, (2, 10))
    total = mem_u_bits(h_ref, h_target).sum()
    halves = mem_u_bits(h_ref[:5], h_target[:5]).sum() + mem_u_bits(h_ref[5:], h_target[5:]).sum()
    assert total == pytest.approx(halves)


def test_sigmoid_law_hand_value():
    # capacity 36 bits / 2 samples = 18; c2 * (18 + c3) = 1 * (18 - 18) = 0; sigmoid(0) = 1/2;
    # F1 = 1/2 * (1 + 1 * 1/2) = 0.75.
    assert membership_f1_sigmoid_law(36.0, 2.0, c1=1.0, c2=1.0, c3=-18.0) == pytest.approx(0.75)


# --------------------------------------------------------------------------------------------- table


def test_per_sample_uses_final_checkpoint_and_hand_values():
    samples, ref, notes = per_sample_memorization(hand_table())
    assert ref == {"kind": "base", "run": -1, "quantizer": "fp32", "checkpoint": 0, "n_samples": 5}
    assert set(samples["checkpoint"]) == {10}
    fp32_run0 = samples[(samples["run"] == 0) & (samples["quantizer"] == "fp32")].set_index("sample_id")
    assert fp32_run0["mem_u_bits"].to_dict() == pytest.approx({"a": 6, "b": 8, "c": 0, "d": 1, "v": 1})
    assert fp32_run0["h_joint_bits"].to_dict() == pytest.approx({"a": 2, "b": 0, "c": 8, "d": 7, "v": 7})
    assert notes == []


def test_aggregates_match_hand_computation():
    result = memorization_from_table(hand_table(), adapter_params=4, model_params=10, n_boot=1000)
    json.dumps(result, allow_nan=False)  # strict JSON
    runs = {(r["quantizer"], r["run"]): r for r in result["per_run"]}

    # run 0 fp32: members a, b -> 6 + 8 = 14 bits, mean 7; non-members c, d, v -> 0 + 1 + 1 = 2, mean 2/3.
    r0 = runs[("fp32", 0)]
    assert (r0["n_members"], r0["n_nonmembers"]) == (2, 3)
    assert r0["member_total_bits"] == pytest.approx(14)
    assert r0["member_mean_bits"] == pytest.approx(7)
    assert r0["nonmember_total_bits"] == pytest.approx(2)
    assert r0["nonmember_mean_bits"] == pytest.approx(2 / 3)
    assert r0["mean_difference_bits"] == pytest.approx(7 - 2 / 3)
    assert r0["excess_member_bits"] == pytest.approx(14 - 2 * 2 / 3)  # 38/3
    assert r0["member_bits_per_adapter_param"] == pytest.approx(14 / 4)
    assert r0["member_bits_per_model_param"] == pytest.approx(14 / 10)

    # run 1 fp32: members c, d -> 4 + 2 = 6, mean 3; non-members a, b, v -> 0.
    r1 = runs[("fp32", 1)]
    assert r1["member_total_bits"] == pytest.approx(6)
    assert r1["nonmember_mean_bits"] == pytest.approx(0)
    assert r1["excess_member_bits"] == pytest.approx(6)

    # Over runs (fp32): member total (14 + 6)/2 = 10; mean (7 + 3)/2 = 5; excess (38/3 + 6)/2 = 28/3;
    # per adapter parameter (3.5 + 1.5)/2 = 2.5; per model parameter (1.4 + 0.6)/2 = 1.0.
    fp32 = result["per_quantizer"]["fp32"]
    assert fp32["runs"] == [0, 1]
    assert fp32["member_total_bits"]["mean"] == pytest.approx(10)
    assert fp32["member_mean_bits"]["mean"] == pytest.approx(5)
    assert fp32["nonmember_mean_bits"]["mean"] == pytest.approx(1 / 3)
    assert fp32["excess_member_bits"]["mean"] == pytest.approx(28 / 3)
    assert fp32["member_bits_per_adapter_param"]["mean"] == pytest.approx(2.5)
    assert fp32["member_bits_per_model_param"]["mean"] == pytest.approx(1.0)
    # Bootstrap over 2 runs: resampled means are 6, 10 or 14 (prob 1/4, 1/2, 1/4), so the 2.5% and
    # 97.5% quantiles are the two runs' values themselves.
    assert fp32["member_total_bits"]["low"] == pytest.approx(6)
    assert fp32["member_total_bits"]["high"] == pytest.approx(14)

    # int8: run 0 agrees with the base (0 bits), run 1 memorises 1 bit of c -> mean 0.5.
    int8 = result["per_quantizer"]["int8"]
    assert int8["member_total_bits"]["mean"] == pytest.approx(0.5)
    assert int8["nonmember_total_bits"]["mean"] == pytest.approx(0)


def test_capacity_view_hand_values_and_extrapolation_label():
    law = {"c1": 1.0, "c2": 1.0, "c3": -18.0}
    result = memorization_from_table(hand_table(), adapter_params=4, model_params=10, scaling_law=law)
    cap = result["capacity"]
    # capacity = 10 params x 3.6 = 36 bits; adapter 4 x 3.6 = 14.4 bits.
    assert cap["model_capacity_bits"] == pytest.approx(36)
    assert cap["adapter_capacity_bits"] == pytest.approx(14.4)
    run0 = cap["per_run"][0]
    # 2 members x 2 tokens; information = 2 x 8 bits = 16; 36 / 16 = 2.25; 14.4 / 16 = 0.9.
    assert (run0["n_member_samples"], run0["n_member_tokens"]) == (2, 4)
    assert run0["member_information_bits"] == pytest.approx(16)
    assert run0["model_capacity_over_information"] == pytest.approx(2.25)
    assert run0["adapter_capacity_over_information"] == pytest.approx(0.9)
    ex = cap["extrapolation"]
    assert ex["label"] == "extrapolation" and "EXTRAPOLATION" in ex["warning"]
    assert ex["constants"] == law
    # 36 bits / 2 samples = 18 -> F1 = 0.75 (see test_sigmoid_law_hand_value).
    assert ex["per_run"][0]["predicted_membership_f1"] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="c1, c2, c3"):
        memorization_from_table(hand_table(), model_params=10, scaling_law={"c1": 1.0})
    # Capacity per parameter is an input.
    other = memorization_from_table(hand_table(), model_params=10, capacity_bits_per_param=2.0)
    assert other["capacity"]["model_capacity_bits"] == pytest.approx(20)


def test_missing_reference_rows_name_what_to_score():
    table = hand_table()
    with pytest.raises(MemorizationError, match=r"run == -1.*Score the reference model"):
        memorization_from_table(table[table["run"] != -1])
    partial = table[~((table["run"] == -1) & (table["sample_id"] == "v"))]
    with pytest.raises(MemorizationError, match=r"1 scored sample\(s\) have no reference loss.*'v'"):
        memorization_from_table(partial)
    with pytest.raises(MemorizationError, match="no rows for the named reference"):
        memorization_from_table(table, reference={"run": 7, "quantizer": "fp32"})


def test_named_reference_and_reference_table():
    table = hand_table()
    # Reference = run 0 fp32 (final checkpoint): run 1 fp32 on c has H_ref 9, H_target 4 -> 5 bits;
    # on a: H_ref 2, H_target 10 -> 0.
    samples, ref, _ = per_sample_memorization(table, reference={"run": 0, "quantizer": "fp32"})
    assert (ref["kind"], ref["run"], ref["checkpoint"]) == ("named", 0, 10)
    assert not ((samples["run"] == 0) & (samples["quantizer"] == "fp32")).any()
    run1 = samples[(samples["run"] == 1) & (samples["quantizer"] == "fp32")].set_index("sample_id")
    assert run1.loc["c", "mem_u_bits"] == pytest.approx(5)
    assert run1.loc["a", "mem_u_bits"] == pytest.approx(0)

    # A separate table from a bigger model that gives every sample 12 bits: run 0 fp32 a -> 12 - 2 = 10.
    big = pd.DataFrame([_row(-1, 0, "fp32", s, [6, 6]) for s in "abcdv"])
    samples, ref, _ = per_sample_memorization(table, reference=big)
    assert ref["kind"] == "loss table"
    row = samples[(samples["run"] == 0) & (samples["quantizer"] == "fp32") & (samples["sample_id"] == "a")]
    assert row["mem_u_bits"].item() == pytest.approx(10)


def test_base_reference_with_several_quantizers_prefers_full_precision_else_asks():
    table = hand_table()
    base_int8 = pd.DataFrame([_row(-1, 0, "int8", s, [1, 1]) for s in "abcdv"])
    _, ref, _ = per_sample_memorization(pd.concat([table, base_int8], ignore_index=True))
    assert ref["quantizer"] == "fp32"
    bf16 = table.assign(quantizer=np.where(table["run"] == -1, "bf16", table["quantizer"]))  # a bf16 store's base
    _, ref, _ = per_sample_memorization(pd.concat([bf16, base_int8], ignore_index=True))
    assert ref["quantizer"] == "bf16"
    no_full = table.assign(quantizer=np.where(table["run"] == -1, "nf4", table["quantizer"]))
    with pytest.raises(MemorizationError, match="several quantizers"):
        per_sample_memorization(pd.concat([no_full, base_int8], ignore_index=True))


def test_quantizer_missing_at_final_checkpoint_is_noted():
    table = hand_table()
    table = table[~((table["run"] == 1) & (table["quantizer"] == "int8"))]
    extra = pd.DataFrame([_row(1, 5, "int8", s, [4, 4], member=s in MEMBERS[1]) for s in "abcdv"])
    result = memorization_from_table(pd.concat([table, extra], ignore_index=True))
    assert result["per_quantizer"]["int8"]["runs"] == [0]
    assert any("run 1" in n and "int8" in n for n in result["notes"])


def test_command_writes_json_and_markdown(tmp_path):
    path = write_loss_table(hand_table(), tmp_path / "losses.parquet")
    out, md = tmp_path / "out" / "mem.json", tmp_path / "mem.md"
    result = memorization_command(
        path, out, adapter_params=4, model_params=10, markdown_out=md, scaling_law="c1=1,c2=1,c3=-18"
    )
    written = json.loads(out.read_text())
    assert written["per_quantizer"]["fp32"]["member_total_bits"]["mean"] == pytest.approx(10)
    assert written == json.loads(json.dumps(result))
    text = md.read_text()
    assert text.startswith("## Memorization in bits")
    # One summary row per quantizer: fp32 members' total mean 10 [6, 14].
    assert "| `fp32` | 2 | 5 [3, 7] |" in text
    assert "| 10 [6, 14] |" in text
    assert "### `int8` per run" in text and "Extrapolation (not a measurement)" in text
    # Reference from a separate table on disk, and the key=value form.
    big = write_loss_table(pd.DataFrame([_row(-1, 0, "fp32", s, [6, 6]) for s in "abcdv"]), tmp_path / "big.parquet")
    assert memorization_command(path, tmp_path / "b.json", reference=str(big))["reference"]["kind"] == "loss table"
    named = memorization_command(path, tmp_path / "n.json", reference="run=0,quantizer=fp32,checkpoint=10")
    assert named["reference"]["kind"] == "named"
    with pytest.raises(ValueError, match="neither 'base'"):
        memorization_command(path, tmp_path / "x.json", reference="nonexistent.parquet")


def test_markdown_section_without_parameter_counts():
    text = markdown_section(memorization_from_table(hand_table(), n_boot=0))
    assert "| `int8` | 2 |" in text
    assert "–" in text  # bits per parameter unknown without parameter counts
    assert "Extrapolation" not in text
