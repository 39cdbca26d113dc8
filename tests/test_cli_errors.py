"""Exit codes say whose fault a failure is: bad input (a UserError) exits 2 with one line, an internal error
exits 1 with one line that says it is a bug and where to report it, never dressed as bad input."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli


def test_an_unknown_plan_device_is_one_line_before_any_work(monkeypatch):
    monkeypatch.setattr("llmaudit.jobs.plan.draw_experiment", lambda *a, **k: pytest.fail("work started"))
    code, _, err = run_cli(["plan", "demo-cpu", "--device", "rtx4090"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--device 'rtx4090' is not known" in err and "h100" in err


@pytest.mark.parametrize("raised", [ValueError("x must be positive"), TypeError("'NoneType' object"), KeyError("k")])
def test_an_internal_error_is_not_bad_input(raised, monkeypatch):
    def broken(*args, **kwargs):
        raise raised

    monkeypatch.setattr("llmaudit.quantize.list_quantizers", broken)  # the command imports it when it runs
    code, _, err = run_cli(["quantizers"])
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("internal error (a bug in llmaudit") and type(raised).__name__ in err
    assert "report it to" in err and "LLMAUDIT_DEBUG=1" in err


def test_a_bad_shard_is_bad_input():
    code, _, err = run_cli(["score", "demo-cpu", "--shard", "5/2"])
    assert code == 2 and err.startswith("error: --shard '5/2'")


@pytest.mark.parametrize("fpc", ["sometimes", "1.5"])
def test_a_bad_attack_fpc_is_one_line_before_the_table_is_read(fpc, monkeypatch, tmp_path):
    monkeypatch.setattr("llmaudit.store.losstable.read_loss_table", lambda *a, **k: pytest.fail("work started"))
    code, _, err = run_cli(["attack", str(tmp_path / "scores"), "--fpc", fpc, "--out", str(tmp_path / "a.json")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("error: --fpc: fpc must") and f"got {fpc}." in err.replace("'", "")
    assert "Fix: --fpc auto, --fpc off, or a number in (0, 1]" in err
