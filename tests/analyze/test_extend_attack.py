"""An attack added in one module (tests/analyze/extension_attack.py), touching no other file: it runs in the
evaluation with the score of its formula, is judged by the release decision and shows in the report."""

from __future__ import annotations

import importlib
import json
import shutil
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.registry import attack_spec, registered_attacks, unregister
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.attacks import AttackRunSettings
from llmaudit.cli import app

MODULE = "tests.analyze.extension_attack"


@pytest.fixture
def extension():
    """The extension module imported (its attack registered), and its attack removed when the test ends."""
    sys.modules.pop(MODULE, None)
    module = importlib.import_module(MODULE)
    yield module
    unregister(module.SPEC.name)
    sys.modules.pop(MODULE, None)


def test_the_formula(extension):
    top_token_loss = extension.top_token_loss
    assert top_token_loss(np.array([1.0, 5.0, 2.0, 3.0, 4.0, 0.0, 0.5, 0.5, 0.5, 0.5])) == 4.5  # top 2 of 10
    assert top_token_loss(np.array([2.0, 7.0])) == 7.0  # at least one token


def test_the_new_attack_is_registered_and_scored_by_its_formula(extension):
    name = extension.SPEC.name
    assert registered_attacks()[-1] == name and attack_spec(name) is extension.SPEC
    df = synthetic_loss_table(4, 60, 1, seed=5)
    res = run_attacks(df, AttackRunSettings(attacks=["loss", name], n_boot=0))
    block = res["quantizers"]["fp32"]
    assert set(block["attacks"]) == {"loss", name}
    assert res["attack_definitions"][name] == "1:-mean(top 0.2 of l_t)"
    # members' token losses are lower in the synthetic table: minus the top losses ranks them above chance
    assert block["attacks"][name]["headline"]["auroc"] > 0.5


def test_the_new_attack_is_judged_and_reported(extension, audited_tiny_store, tmp_path):
    name = extension.SPEC.name
    store = tmp_path / "store"
    shutil.copytree(audited_tiny_store, store)
    result = CliRunner().invoke(app, ["report", str(store)])  # the recorded attack.attacks is "all"
    assert result.exit_code == 0, result.output
    attacks = json.loads((store / "report" / "report.json").read_text())["result"]["attacks"]
    for block in attacks["quantizers"].values():
        assert block["attacks"][name]["definition"] == "1:-mean(top 0.2 of l_t)"
    judged = {a["attack"] for q in attacks["decision"]["per_quantizer"].values() for a in q["attacks"]}
    assert name in judged
    assert "minus the mean of the text's largest token losses" in (store / "report" / "report.md").read_text()
