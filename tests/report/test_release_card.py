"""`llmaudit report RUN_DIR --release Q` on a store whose report is up to date writes Q's card from report.json in
seconds, without the analysis; an unknown Q is refused in one line and nothing is written."""

from __future__ import annotations

import time

from tests.conftest import run_cli
from tests.report.test_model_card import audited  # noqa: F401 (the fixture)


def stamps(report_dir) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in report_dir.iterdir() if p.is_file()}


def test_a_card_for_another_quantizer_comes_from_report_json(audited):  # noqa: F811
    report_dir = audited["root"] / "report"
    others = [q for q in audited["report"]["quantizers"] if q != audited["report"]["recommendation"]["quantizer"]]
    before = stamps(report_dir)
    t0 = time.monotonic()
    code, out, err = run_cli(["report", audited["root"], "--release", others[0]])
    assert code == 0, err
    assert time.monotonic() - t0 < 30 and "from " in out and "report.json" in out
    after = stamps(report_dir)
    assert after["report.json"] == before["report.json"] and after["report.md"] == before["report.md"]
    assert f"Released quantization: `{others[0]}`" in (report_dir / "model_card.md").read_text()


def test_an_unknown_release_writes_nothing(audited):  # noqa: F811
    report_dir = audited["root"] / "report"
    before = {p.name: p.read_bytes() for p in report_dir.iterdir() if p.is_file()}
    code, _, err = run_cli(["report", audited["root"], "--release", "hqq-9"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "hqq-9" in err
    assert {p.name: p.read_bytes() for p in report_dir.iterdir() if p.is_file()} == before
