"""Write a report: report.json (schema-validated), report.md, report.html and the PNG figures."""

from __future__ import annotations

import json
from typing import Any

from llmaudit.common.io import atomic_write_bytes, atomic_write_text
from llmaudit.report.build import build_report
from llmaudit.report.html import render_html
from llmaudit.report.markdown import render_markdown
from llmaudit.report.model_card import UnknownQuantizerError, render_model_card
from llmaudit.report.plots import render_all
from llmaudit.report.schema import validate_report
from llmaudit.store.run_store import RunStore


def write_report(
    store: RunStore, result: dict[str, Any], include_samples: bool = False, release: str | None = None
) -> dict[str, str]:
    """Write report/report.json (validated against REPORT_SCHEMA; raises ReportSchemaError on mismatch),
    report.md, report.html, report/plots/*.png and model_card.md, the model card's privacy section for the
    quantizer `release` (default: the recommended one). Returns {kind: path}. An unknown `release` is refused
    (UnknownQuantizerError) after the report itself is written, so the analysis is never lost."""

    records = store.read_records("pool") if include_samples else None
    report = build_report(result, include_samples=include_samples, sample_records=records)
    figures = render_all(report)
    report["plots"] = {name: f"plots/{name}.png" for name in figures}
    validate_report(report)
    out = store.report_dir
    paths: dict[str, str] = {}
    for name, png in figures.items():
        atomic_write_bytes(out / "plots" / f"{name}.png", png)
    paths["json"] = str(atomic_write_text(out / "report.json", json.dumps(report, indent=2, allow_nan=False) + "\n"))
    paths["markdown"] = str(atomic_write_text(out / "report.md", render_markdown(report)))
    paths["html"] = str(atomic_write_text(out / "report.html", render_html(report, figures)))
    paths["plots"] = str(out / "plots")
    try:
        card = render_model_card(report, quantizer=release)
    except UnknownQuantizerError as exc:
        raise UnknownQuantizerError(f"{exc} (report.json, report.md and report.html are written in {out})") from exc
    paths["model_card"] = str(atomic_write_text(out / "model_card.md", card))
    return paths
