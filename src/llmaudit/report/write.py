"""Write a report: report.json (schema-validated), report.md, report.html and the PNG figures."""

from __future__ import annotations

import json

from llmaudit.analyze.result import AnalysisResult
from llmaudit.common.io import atomic_write_text, directory_lock, replace_directory
from llmaudit.report.build import build_report
from llmaudit.report.html import render_html
from llmaudit.report.markdown import render_markdown
from llmaudit.report.model_card import UnknownQuantizerError, render_model_card
from llmaudit.report.models import dump_report, read_built
from llmaudit.report.plots import render_all
from llmaudit.report.readback import read_report
from llmaudit.report.schema import validate_report
from llmaudit.store.run_store import RunStore


def write_report(
    store: RunStore, result: AnalysisResult, include_samples: bool = False, release: str | None = None
) -> dict[str, str]:
    """Write the report's files as one set.

    report/report.json (validated against REPORT_SCHEMA), report.md, report.html, report/plots/*.png and model_card.md
    (the model card's privacy section for the quantizer `release`) are written as one set (`replace_directory`: a
    report killed mid-write leaves the previous set whole). An unknown `release` is refused after the report is
    written without a card, so the analysis is never lost and no card of another run stays.

    Args:
        store (RunStore): the run store.
        result (dict[str, Any]): the analysis' result.
        include_samples (bool): also write the per-sample scores into report.json.
        release (str | None): the quantizer of the model card, None for the recommended one.

    Returns:
        dict[str, str]: {kind: path} of the files written.

    Raises:
        ReportSchemaError: report.json does not match its schema.
        UnknownQuantizerError: `release` is not in the report (the report is written, without a card).
    """

    records = store.read_records("pool") if include_samples else None
    report = build_report(result, include_samples=include_samples, sample_records=records)
    figures = render_all(report)
    report["plots"] = {name: f"plots/{name}.png" for name in figures}
    validate_report(report)
    typed = read_built(report)  # every key the builder writes present and typed
    content = dump_report(typed)
    out = store.report_dir
    files = {f"plots/{name}.png": png for name, png in figures.items()}
    files["report.json"] = (json.dumps(content, indent=2, allow_nan=False) + "\n").encode()
    files["report.md"] = render_markdown(typed).encode()
    files["report.html"] = render_html(typed, figures).encode()
    paths = {"json": str(out / "report.json"), "markdown": str(out / "report.md"), "html": str(out / "report.html")}
    paths["plots"] = str(out / "plots")
    try:
        files["model_card.md"] = render_model_card(typed, quantizer=release).encode()
    except UnknownQuantizerError as exc:
        replace_directory(out, files)
        raise UnknownQuantizerError(f"{exc} (report.json, report.md and report.html are written in {out})") from exc
    replace_directory(out, files)
    paths["model_card"] = str(out / "model_card.md")
    return paths


def write_model_card(store: RunStore, release: str) -> str:
    """Write model_card.md for the quantizer `release`, from the store's report.json alone (no analysis).

    An unknown `release` or a report.json the card cannot read is refused before anything is written.

    Args:
        store (RunStore): the run store (its report/report.json is read).
        release (str): the quantizer of the card.

    Returns:
        str: the path of model_card.md.

    Raises:
        UnknownQuantizerError: `release` is not in the report.
    """
    with directory_lock(store.report_dir):  # the set is not replaced while its card is written
        report = read_report(store.report_dir / "report.json")  # parsed and consistent, or refused naming the field
        card = render_model_card(report, quantizer=release)
        return str(atomic_write_text(store.report_dir / "model_card.md", card))
