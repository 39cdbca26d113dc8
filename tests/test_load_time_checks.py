"""Every name, option and combination of a recipe is checked when it loads, before any work: one line, exit 2,
the key, the value, the closest allowed name, and where it came from (the recipe file or the command line)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import run_cli


def refused_at_load(args: list[str], tmp_path) -> str:
    out = tmp_path / "run"
    t0 = time.monotonic()
    code, _, err = run_cli([*args, "--out", out])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert time.monotonic() - t0 < 10
    assert not out.exists()  # nothing trained, nothing written
    return err


def test_an_unknown_attack_stops_the_audit_before_training(tmp_path):
    err = refused_at_load(["audit", "demo-cpu", "attack.attacks=[loss,foo]"], tmp_path)
    assert "unknown attack 'foo'" in err and "from the command line: 'attack.attacks=[loss,foo]'" in err


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("score.quantizers=[fp32,bnb-nf3]", "unknown quantizer 'bnb-nf3' (did you mean 'bnb-nf4'?)"),
        ("attack.attacks=[loss,lira_ofline]", "unknown attack 'lira_ofline' (did you mean 'lira_offline'?)"),
        ("score.quantizer_options={hqq-3: {group_size: 16}}", "options for 'hqq-3' (did you mean 'hqq-4'?)"),
        ("score.quantizer_options={hqq-4: {group_size: 7}}", "score.quantizer_options.hqq-4: hqq-4: bad value"),
        ("score.quantizer_options={hqq-4: {bogus: 1}}", "score.quantizer_options.hqq-4"),
        ("trian.epochs=3", "unknown key (did you mean 'train'?)"),
    ],
)
def test_names_and_options_are_checked_when_the_recipe_loads(override, expected, tmp_path):
    assert expected in refused_at_load(["finetune", "demo-cpu", override], tmp_path)


def test_a_type_error_of_an_override_is_blamed_on_the_command_line(tmp_path):
    err = refused_at_load(["finetune", "demo-cpu", "score.quantizers=fp32"], tmp_path)
    assert "invalid command-line override" in err and "demo-cpu.yaml" not in err
    assert "from the command line: 'score.quantizers=fp32'" in err and "score.quantizers='[fp32]'" in err


def test_a_misspelt_recipe_name_gets_the_closest_one(tmp_path):
    assert "recipe demo-cpuu not found (did you mean 'demo-cpu'?)" in refused_at_load(
        ["finetune", "demo-cpuu"], tmp_path
    )
