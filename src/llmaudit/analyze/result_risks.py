"""The typed store-wide risk blocks of the analysis result (`llmaudit.analyze.result.AnalysisResult`): the extraction
risk of every quantizer, the decision of every release set and the one-run epsilon lower bound (docs/science.md
sections 13-15). Each holds the analysis' own models (`llmaudit.analyze.extraction_risk`, `release_sets`,
`epsilon_audit`); report.json carries them as they are (`llmaudit.report.models_risks`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from llmaudit.analyze.epsilon_audit import EpsilonBound
from llmaudit.analyze.extraction import GreedyCheck
from llmaudit.analyze.extraction_risk import ExtractionResult
from llmaudit.analyze.release_sets import ReleaseSetDecision
from llmaudit.analyze.result_base import ResultBlock


class ExtractionBlock(ResultBlock):
    """Extraction risk per quantizer, and the greedy rate from the top-1 flags checked against the generated
    greedy answers (quantizers whose final units generated them)."""

    risk: ExtractionResult
    greedy_check: dict[str, GreedyCheck] = {}


class ReleaseSetNotMeasured(BaseModel):
    """A release set with a file the analysis did not attack (left out, not completely scored), or whose files
    cannot be judged together, and why."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    files: list[str]
    not_measured: str


ReleaseSetEntry = ReleaseSetDecision | ReleaseSetNotMeasured
"""One release set: judged by the release rule, or not measured with why."""


class EpsilonBlock(ResultBlock):
    """The store's membership design, whether the one-run bound applies to it (else why not), and the bound of
    every quantizer."""

    design: str
    qualifies: bool
    reason: str = ""
    per_quantizer: dict[str, EpsilonBound] = {}
