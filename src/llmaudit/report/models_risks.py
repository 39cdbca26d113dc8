"""The typed sections of report.json for what an audit answers beyond the per-quantizer release decision: the
extraction risk of every quantizer, the release sets' decisions and the one-run epsilon lower bound
(docs/science.md sections 13-15). Each holds the analysis' own models (`llmaudit.analyze.extraction_risk`,
`release_sets`, `epsilon_audit`) as the analysis wrote them."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from llmaudit.analyze.epsilon_audit import EpsilonBound
from llmaudit.analyze.extraction import GreedyCheck
from llmaudit.analyze.extraction_risk import ExtractionResult
from llmaudit.analyze.release_sets import ReleaseSetDecision
from llmaudit.report.schema_base import _Open


class ExtractionSection(_Open):
    """Extraction risk per quantizer, and the greedy rate from the top-1 flags checked against the generated
    greedy answers (quantizers whose final units generated them)."""

    risk: ExtractionResult
    greedy_check: dict[str, GreedyCheck] = {}


class ReleaseSetNotMeasured(BaseModel):
    """A release set with a file the analysis did not attack (left out, not completely scored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    files: list[str]
    not_measured: str


class EpsilonSection(_Open):
    """The store's membership design, whether the one-run bound applies to it (else why not), and the bound of
    every quantizer."""

    design: str
    qualifies: bool
    reason: str = ""
    per_quantizer: dict[str, EpsilonBound] = {}


ReleaseSetEntry = ReleaseSetDecision | ReleaseSetNotMeasured
