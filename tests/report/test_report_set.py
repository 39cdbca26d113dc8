"""The report's files are one set: a report killed while it writes leaves the previous report.json, report.md,
report.html, plots and model_card.md whole (never new files beside old ones), and no temporary directory."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from llmaudit.common import io
from llmaudit.report import write
from llmaudit.report.model_card import UnknownQuantizerError


def listing(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def beside(directory) -> list[str]:
    """What lies beside the report's directory but the lock its writers take turns with (`common.io.directory_lock`)."""
    return sorted(n for n in os.listdir(directory.parent) if n != f".{directory.name}.lock")


@pytest.fixture
def fake_report(monkeypatch, tmp_path):
    """write_report with every renderer replaced by one that writes `version` into its file."""
    state = {"version": "v1", "card": lambda report, quantizer: f"card {state['version']}"}
    monkeypatch.setattr(write, "build_report", lambda result, **kw: {"v": state["version"]})
    monkeypatch.setattr(write, "render_all", lambda report: {"roc": state["version"].encode()})
    monkeypatch.setattr(write, "validate_report", lambda report: None)
    monkeypatch.setattr(write, "read_built", lambda report: report)
    monkeypatch.setattr(write, "dump_report", lambda report: report)
    monkeypatch.setattr(write, "render_markdown", lambda report: f"md {state['version']}")
    monkeypatch.setattr(write, "render_html", lambda report, figures: f"html {state['version']}")
    monkeypatch.setattr(write, "render_model_card", lambda report, quantizer=None: state["card"](report, quantizer))
    store = SimpleNamespace(report_dir=tmp_path / "run" / "report", read_records=lambda split: [])
    return store, state


def test_a_report_killed_while_writing_leaves_the_previous_set(fake_report):
    store, state = fake_report
    write.write_report(store, {})
    first = listing(store.report_dir)
    assert set(first) == {"report.json", "report.md", "report.html", "plots/roc.png", "model_card.md"}
    state["version"] = "v2"

    def killed(report, quantizer):
        raise KeyboardInterrupt

    state["card"] = killed  # the last file of the set
    with pytest.raises(KeyboardInterrupt):
        write.write_report(store, {})
    assert listing(store.report_dir) == first
    assert beside(store.report_dir) == ["report"]  # no temporary directory left


def test_a_swap_that_fails_halfway_puts_the_previous_set_back(fake_report, monkeypatch):
    store, state = fake_report
    write.write_report(store, {})
    first = listing(store.report_dir)
    state["version"] = "v2"
    real = os.replace

    def second_rename_fails(src, dst):
        if str(dst) == str(store.report_dir) and ".old." not in str(src):  # the new set into place (old one aside)
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(io.os, "replace", second_rename_fails)
    with pytest.raises(io.WriteError, match="No space left"):
        write.write_report(store, {})
    assert listing(store.report_dir) == first
    assert beside(store.report_dir) == ["report"]


def test_an_unknown_release_writes_the_report_and_leaves_no_card_of_another_run(fake_report):
    store, state = fake_report
    write.write_report(store, {})
    state["version"] = "v2"

    def unknown(report, quantizer):
        raise UnknownQuantizerError(f"--release {quantizer!r}: the report has no such quantizer")

    state["card"] = unknown
    with pytest.raises(UnknownQuantizerError, match="report.json, report.md and report.html are written"):
        write.write_report(store, {}, release="q9")
    written = listing(store.report_dir)
    assert set(written) == {"report.json", "report.md", "report.html", "plots/roc.png"}  # no model_card.md
    assert '"v": "v2"' in written["report.json"] and written["report.md"] == "md v2"
