"""The attack registry: an attack added through `register` alone runs in the evaluation, is judged by the release
decision, appears in the report with its recorded definition; names are checked when a recipe loads."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.evaluate import run_attacks
from llmaudit.analyze.attacks.registry import AttackUnavailable, resolve_attacks, unregister
from llmaudit.analyze.cost import synthetic_loss_table
from llmaudit.attacks import AttackRunSettings, AttackSpec, register, registered_attacks
from llmaudit.cli import app
from llmaudit.config import RecipeError
from llmaudit.jobs.targets import config_from_recipe


def _largest_token_loss(ctx: AttackContext) -> np.ndarray:
    """The toy attack of docs/architecture.md: minus each text's largest token loss."""
    largest = np.array([float(np.max(t)) for t in ctx.target.rows["token_losses"]])
    return ctx.per_row(-largest)


TOY = AttackSpec(
    "max_token_loss",
    1,
    _largest_token_loss,
    "-max_t(l_t)",
    "minus the largest token loss of the text",
)


@pytest.fixture
def toy_attack():
    register(TOY)
    yield TOY.name
    unregister(TOY.name)


def test_a_new_attack_added_through_the_registry_alone_appears_in_the_report(toy_attack, audited_tiny_store, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(audited_tiny_store, store)
    result = CliRunner().invoke(app, ["report", str(store)])
    assert result.exit_code == 0, result.output
    report = json.loads((store / "report" / "report.json").read_text())
    attacks = report["result"]["attacks"]
    assert attacks["attack_definitions"][toy_attack] == "1:-max_t(l_t)"
    for block in attacks["quantizers"].values():
        entry = block["attacks"][toy_attack]
        assert 0.0 <= entry["headline"]["auroc"] <= 1.0
        assert entry["definition"] == "1:-max_t(l_t)"
    judged = {a["attack"] for q in attacks["decision"]["per_quantizer"].values() for a in q["attacks"]}
    assert toy_attack in judged  # the release decision weighs it like every other attack
    markdown = (store / "report" / "report.md").read_text()
    assert toy_attack in markdown and "minus the largest token loss" in markdown


def test_a_registered_attack_scores_like_its_formula(toy_attack):
    df = synthetic_loss_table(4, 60, 1, seed=5)
    res = run_attacks(df, AttackRunSettings(attacks=["loss", toy_attack], n_boot=0))
    block = res["quantizers"]["fp32"]
    assert set(block["attacks"]) == {"loss", toy_attack}
    rows = df[(df["run"] == 0) & (df["split"] == "pool")]
    assert block["n_samples"] == len(rows)  # every pool sample scored by every run
    assert toy_attack in res["attack_definitions"] and res["attack_definitions"]["calibration"].startswith("3:")


def test_an_attack_that_needs_a_missing_column_is_skipped_with_its_reason():
    spec = AttackSpec("needs_column", 1, lambda ctx: -ctx.target.loss, "x", "x", columns=("token_entropy",))
    register(spec)
    try:
        res = run_attacks(
            synthetic_loss_table(3, 40, 1, seed=1), AttackRunSettings(attacks=["loss", "needs_column"], n_boot=0)
        )
    finally:
        unregister(spec.name)
    assert res["quantizers"]["fp32"]["skipped"]["needs_column"] == "loss table has no token_entropy column"


def test_a_builder_that_cannot_run_says_why():
    def refuse(ctx):
        raise AttackUnavailable("needs a second tokenizer")

    register(AttackSpec("refuses", 1, refuse, "x", "x"))
    try:
        res = run_attacks(
            synthetic_loss_table(3, 40, 1, seed=1), AttackRunSettings(attacks=["refuses", "loss"], n_boot=0)
        )
    finally:
        unregister("refuses")
    assert res["quantizers"]["fp32"]["skipped"] == {"refuses": "needs a second tokenizer"}


def test_registration_rules():
    with pytest.raises(ValueError, match="already registered"):
        register(AttackSpec("loss", 1, lambda ctx: ctx.target.loss, "x", "x"))
    with pytest.raises(ValueError, match="every attack"):
        register(AttackSpec("all", 1, lambda ctx: ctx.target.loss, "x", "x"))
    with pytest.raises(ValueError, match="non-empty name"):
        AttackSpec("a b", 1, lambda ctx: ctx.target.loss, "x", "x")
    with pytest.raises(ValueError, match="unknown reference kind"):
        AttackSpec("ab", 1, lambda ctx: ctx.target.loss, "x", "x", references=("oracle",))
    with pytest.raises(ValueError, match=r"unknown attack 'lira_ofline' \(did you mean 'lira_offline'\?\)"):
        resolve_attacks(["loss", "lira_ofline"])
    with pytest.raises(ValueError, match="repeat"):
        resolve_attacks(["loss", "loss"])
    assert resolve_attacks(["all"]) == registered_attacks()
    assert registered_attacks()[:2] == ("loss", "min_k") and registered_attacks()[-1] == "rmia_online"


def test_the_recipe_loader_checks_names_against_the_registry(toy_attack):
    cfg = config_from_recipe("demo-cpu", [f"attack.attacks=[loss,{toy_attack}]"])
    assert cfg.attack.attacks == ["loss", toy_attack]
    unregister(toy_attack)
    with pytest.raises(RecipeError, match="unknown attack 'max_token_loss'"):
        config_from_recipe("demo-cpu", [f"attack.attacks=[loss,{toy_attack}]"])
