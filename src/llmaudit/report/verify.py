"""When report.json may stand in for the analysis (`verified_report`), and when it may not.

`llmaudit report RUN_DIR --release Q` writes another quantizer's model card from report.json in seconds when the
report is verified: the store passes its integrity check (`store.integrity.verify_store`: the manifest's digest,
every checkpoint's recorded files, every loss table readable, complete and consistent with the manifest's masks),
report.json is newer than every loss table, parses and agrees with itself (`report.readback.read_report`), and holds
exactly what its analysis gives (`build_report` of results/result.json, and of the result it embeds: every verdict,
number and sentence; only when it was written and its figures' names are not compared). A report.json that
disagrees is refused (exit 2), never shown; one of another llmaudit version is analysed again.

The release gate (`--gate`) never takes report.json's word: it always analyses the verified loss tables again
(`commands.report`), so an edited report.json or a loss table replaced with its time put back cannot clear a
quantizer.
"""

from __future__ import annotations

from typing import Any

from llmaudit import __version__
from llmaudit.analyze.result import as_result
from llmaudit.common.errors import UserError
from llmaudit.common.io import read_json
from llmaudit.config import ExperimentConfig
from llmaudit.report.build import build_report
from llmaudit.report.models import ReportJson, dump_report, read_built
from llmaudit.report.readback import REWRITE, ReportFileError, read_report
from llmaudit.report.schema import REPORT_SCHEMA_VERSION
from llmaudit.store.integrity import verify_store
from llmaudit.store.run_store import RunStore

UNCHECKED = ("generated_utc", "plots")
"""The keys of report.json its analysis does not give: when it was written, and the figures' file names."""


def first_difference(shown: Any, derived: Any, where: str = "") -> str | None:
    """The dotted path of the first value where two reports (plain data) differ.

    Args:
        shown: report.json's content.
        derived: what its analysis gives.
        where: the path of `shown` within the whole report.

    Returns:
        The path, None when they are equal.
    """
    if isinstance(shown, dict) and isinstance(derived, dict):
        for key in [*shown, *(k for k in derived if k not in shown)]:
            found = first_difference(shown.get(key), derived.get(key), f"{where}.{key}" if where else str(key))
            if found:
                return found
        return None
    if isinstance(shown, list) and isinstance(derived, list) and len(shown) == len(derived):
        for i, (a, b) in enumerate(zip(shown, derived)):
            found = first_difference(a, b, f"{where}.{i}")
            if found:
                return found
        return None
    return None if shown == derived else (where or "(the whole report)")


def _derived(result: Any, report: ReportJson, store: RunStore) -> dict[str, Any]:
    """The report.json content `result` gives (what `write_report` writes, its unchecked keys aside)."""
    if not isinstance(result, dict):
        raise TypeError("not a result object")
    typed = as_result(result)  # a ValidationError (a ValueError) where it is not an analysis result
    records = store.read_records("pool") if report.include_samples else None
    built = build_report(typed, include_samples=report.include_samples, sample_records=records)
    return {k: v for k, v in dump_report(read_built(built)).items() if k not in UNCHECKED}


def _disagreement(shown: dict[str, Any], result: Any, report: ReportJson, store: RunStore, source: str) -> str | None:
    """Where report.json (`shown`, its unchecked keys aside) differs from what `result` gives, or None."""
    try:
        derived = _derived(result, report, store)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError, StopIteration) as exc:
        if isinstance(exc, UserError):
            raise
        return f"{source} does not give a report ({type(exc).__name__})"
    where = first_difference(shown, derived)
    return None if where is None else f"{where} is not what {source} gives"


def verified_report(store: RunStore, cfg: ExperimentConfig, *, up_to_date: bool) -> ReportJson | None:
    """report.json when it may stand in for the analysis (see the module docstring), None when the analysis must run
    (no report, older than a loss table, a store with a problem, a report of another llmaudit version or without the
    result it was built from: the analysis then runs, or names the problem).

    Args:
        store: the run store.
        cfg: its config (`planning.targets.config_from_run_dir`).
        up_to_date: whether report.json is newer than every loss table (`planning.status.report_is_current`).

    Returns:
        The verified report, or None.

    Raises:
        ReportFileError: report.json does not parse, contradicts itself, or is not what its analysis gives.
    """
    path, results = store.report_dir / "report.json", store.results_dir / "result.json"
    if not up_to_date or not path.is_file() or not results.is_file() or not verify_store(store, cfg).ok:
        return None
    report = read_report(path)
    same_version = report.llmaudit_version == __version__ and report.report_schema_version == REPORT_SCHEMA_VERSION
    if not report.result or not same_version:
        return None
    shown = {k: v for k, v in dump_report(report).items() if k not in UNCHECKED}
    stored = read_json(results, what="analysis result", fix=REWRITE)
    for result, source in ((report.result, "the result it embeds"), (stored, str(results))):
        why = _disagreement(shown, result, report, store, source)
        if why:
            raise ReportFileError(f"{path} disagrees with its analysis: {why}; {REWRITE}")
    return report
