"""The analysis' light table (`llmaudit.analyze.store_table`): the pool rows' token lists are never all in memory at
once, each quantizer's rows are read by the process that attacks it, and every number is the one the whole table
gives."""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.candidates_table import candidates_from_table
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.extraction import GREEDY, rows_greedy
from llmaudit.analyze.fidelity import divergence_from_table
from llmaudit.analyze.memorization import SEQUENCE_BITS, memorization_from_table, sequences_bits
from llmaudit.analyze.rq_aggregate import indicator_from_table
from llmaudit.analyze.store_analysis import load_store_table
from llmaudit.analyze.store_table import TOKEN_LISTS, UnitFile, final_steps, light_frame, read_store_table
from llmaudit.analyze.taskmetrics import task_metrics_from_table
from llmaudit.analyze.utility import trajectory_from_table, utility_from_table
from llmaudit.store.losstable import (
    REFERENCE_RUN,
    read_loss_table,
    read_parquet_file,
    validate_loss_table,
    write_loss_table,
)
from llmaudit.store.run_store import RunStore


def _json(result) -> str:
    return json.dumps(result, sort_keys=True, default=lambda v: v.tolist() if isinstance(v, np.ndarray) else str(v))


@pytest.fixture(scope="module")
def units(tmp_path_factory):
    """A synthetic table with a trajectory (each run's validation rows also at an earlier checkpoint), written as
    one file per unit (run, checkpoint, quantizer): (units, the whole table read back)."""
    root = tmp_path_factory.mktemp("units")
    table = synthetic_loss_table(4, 60, 3, seed=4)
    early = table[(table["split"] == "val") & (table["run"] != REFERENCE_RUN)].copy()
    early["checkpoint"] = 5
    early["token_losses"] = [(t * 1.5).astype(np.float32) for t in early["token_losses"]]
    early["loss"] = [float(t.mean()) for t in early["token_losses"]]
    table = pd.concat([early, table], ignore_index=True)
    out = []
    for (run, step, q), rows in table.groupby(["run", "checkpoint", "quantizer"], sort=True):
        path = write_loss_table(rows.reset_index(drop=True), root / f"{run}-{step}-{q}.parquet")
        out.append(UnitFile(int(run), int(step), str(q), path))
    return out, read_loss_table(root, files=[u.path for u in out])


def _is_list(value) -> bool:
    return isinstance(value, np.ndarray)


def test_the_light_table_keeps_token_lists_on_final_validation_rows_only_and_the_same_scalars(units):
    files, whole = units
    light = read_store_table(files[0].path.parent, files).light
    final = light.groupby(["run", "quantizer"])["checkpoint"].transform("max")
    kept = ((light["split"] == "val") & (light["checkpoint"] == final)).to_numpy()
    assert kept.any() and (light.loc[~kept, "split"] == "val").any() and (light.loc[~kept, "split"] == "pool").any()
    for column in TOKEN_LISTS:
        if column in light.columns:
            assert not light.loc[~kept, column].map(_is_list).any(), column
            assert light.loc[kept, column].map(_is_list).all(), column
    scalars = [c for c in whole.columns if c not in TOKEN_LISTS]
    pd.testing.assert_frame_equal(light[scalars], whole[scalars])
    np.testing.assert_array_equal(light[SEQUENCE_BITS].to_numpy(), sequences_bits(whole["token_losses"]))


def _light_column_by_column(frame: pd.DataFrame, finals: dict) -> pd.DataFrame:
    """The light frame as pandas makes it one column at a time."""
    frame = frame.copy()
    frame[GREEDY] = rows_greedy(frame).astype(np.float32)
    frame[SEQUENCE_BITS] = sequences_bits(frame["token_losses"])
    final = np.array([finals.get((int(r), str(q)), -1) for r, q in zip(frame["run"], frame["quantizer"])])
    keep = (frame["split"].to_numpy() == "val") & (frame["checkpoint"].to_numpy() == final)
    for column in TOKEN_LISTS:
        if column in frame.columns:
            frame[column] = frame[column].where(keep, None)
    return frame


def test_each_file_s_light_frame_is_the_column_by_column_one_and_leaves_the_file_s_frame_alone(units):
    files, _ = units
    finals = final_steps(files)
    for unit in files:
        frame = validate_loss_table(read_parquet_file(unit.path), source=str(unit.path))
        before = frame.copy()
        light = light_frame(frame, finals)
        pd.testing.assert_frame_equal(light, _light_column_by_column(before, finals), check_exact=True)
        pd.testing.assert_frame_equal(frame, before, check_exact=True)
        for column in TOKEN_LISTS:
            if column in light.columns:
                kept = light[column].map(_is_list).to_numpy()
                assert all(np.array_equal(a, b) for a, b in zip(light[column][kept], before[column][kept]))


def test_rows_of_a_quantizer_are_its_units_and_the_base_model_s_in_the_whole_table_s_order(units):
    files, whole = units
    table = read_store_table(files[0].path.parent, files)
    rows = table.rows_of("q1", "fp32")
    expected = whole[(whole["quantizer"] == "q1") | ((whole["run"] == REFERENCE_RUN) & (whole["quantizer"] == "fp32"))]
    pd.testing.assert_frame_equal(rows, expected.reset_index(drop=True))
    assert set(table.rows_of("fp32", "fp32")["quantizer"]) == {"fp32"}


@pytest.mark.parametrize("processes", [1, 2])
def test_attacks_on_the_light_table_give_the_whole_table_s_numbers(units, processes):
    if processes > 1 and "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("worker processes need the fork start method")
    files, whole = units
    table = read_store_table(files[0].path.parent, files)
    s = AttackRunSettings(n_boot=20, seed=3)
    kw = dict(decision=DecisionSettings(seed=3, resamples=50), reference_quantizer="fp32")
    expected = run_attacks(whole, s, **kw)
    got = run_attacks(table.light, s, rows_of=table.rows_of, processes=processes, **kw)
    assert _json(got) == _json(expected)
    assert "rmia" in got["quantizers"]["q1"]["attacks"]  # the attacks that read validation texts ran too


def test_each_quantizer_s_rows_are_read_once_by_its_attack(units):
    files, whole = units
    table = read_store_table(files[0].path.parent, files)
    asked = []

    def rows_of(quantizer, base_q):
        asked.append((quantizer, base_q))
        return table.rows_of(quantizer, base_q)

    run_attacks(table.light, AttackRunSettings(n_boot=0, attacks=["loss", "min_k"]), rows_of=rows_of)
    assert asked == [("fp32", "fp32"), ("q1", "fp32"), ("q2", "fp32")]


def test_attacks_on_a_light_table_without_its_rows_are_refused(units):
    """Without `rows_of`, the attacks on a light table would find no token lists and skip every attack that reads
    them as if the table had none: refused instead."""
    files, _ = units
    light = read_store_table(files[0].path.parent, files).light
    with pytest.raises(ValueError, match="light table .* rows_of"):
        run_attacks(light, AttackRunSettings(n_boot=0, attacks=["min_k"]))


def test_memorization_of_the_light_table_is_the_whole_table_s(units):
    files, whole = units
    light = read_store_table(files[0].path.parent, files).light

    def without_matched_base(t):
        return t[(t["run"] != REFERENCE_RUN) | (t["quantizer"] == "fp32")]

    expected = memorization_from_table(without_matched_base(whole), n_boot=50, seed=2)
    assert _json(memorization_from_table(without_matched_base(light), n_boot=50, seed=2)) == _json(expected)


def test_a_real_store_s_analysis_reads_the_whole_table_s_numbers_from_the_light_one(audited_tiny_store):
    """Every consumer of the light table in `analyze` on a real store (trajectories, divergence, generated texts)
    against the same consumer on the whole table."""
    store = RunStore(audited_tiny_store)
    table, quantizers, _ = load_store_table(store, store.config(), echo=lambda *a: None)
    whole = read_loss_table(store.scores_dir, files=[u.path for u in table.units])
    light, reference = table.light, quantizers[0]
    assert len(light) == len(whole) and not light.loc[light["split"] == "pool", "token_losses"].map(_is_list).any()
    assert "token_kl" in whole.columns  # the divergence reads the final validation rows' lists
    val = store.read_records("val")
    for compute in (
        lambda t: indicator_from_table(t, split="val", n_boot=50, seed=1),
        lambda t: candidates_from_table(t, reference_quantizer=reference, quantizers=quantizers, n_boot=50, seed=1),
        lambda t: divergence_from_table(t, quantizers, reference, n_boot=50, seed=1),
        lambda t: task_metrics_from_table(t, val, quantizers, reference, n_boot=50, seed=1),
        lambda t: utility_from_table(t, quantizers, reference, n_boot=50, seed=1),
        trajectory_from_table,
    ):
        assert _json(compute(light)) == _json(compute(whole))
    for q in quantizers:
        rows = table.rows_of(q, reference)
        assert rows["token_losses"].map(_is_list).all()
        assert (rows["quantizer"] == q).sum() == (whole["quantizer"] == q).sum()
