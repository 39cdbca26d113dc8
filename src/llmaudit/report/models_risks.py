"""The typed sections of report.json for what an audit answers beyond the per-quantizer release decision: the
extraction risk of every quantizer, the release sets' decisions and the one-run epsilon lower bound
(docs/science.md sections 13-15). Each is the analysis' own block (`llmaudit.analyze.result_risks`), read as a
report section: every key the builder writes required in a built report and in the generated JSON Schema."""

from __future__ import annotations

from llmaudit.analyze.result_risks import EpsilonBlock, ExtractionBlock, ReleaseSetEntry, ReleaseSetNotMeasured
from llmaudit.report.schema_base import _Open

__all__ = ["EpsilonSection", "ExtractionSection", "ReleaseSetEntry", "ReleaseSetNotMeasured"]


class ExtractionSection(_Open, ExtractionBlock):
    """The analysis' extraction block (`ExtractionBlock`) as report.json's section."""


class EpsilonSection(_Open, EpsilonBlock):
    """The analysis' epsilon block (`EpsilonBlock`) as report.json's section."""
