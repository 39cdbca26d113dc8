"""The release decision: the strongest attack chosen honestly, a three-way verdict against the limit whose error
rates are stated, and the paired comparison with full precision (docs/science.md section 12)."""

from llmaudit.analyze.decision.decide import QuantizerEvidence, decide, decision_mode
from llmaudit.analyze.decision.models import QuantizerDecision, ReleaseDecision
from llmaudit.analyze.decision.settings import DecisionSettings

__all__ = ["DecisionSettings", "QuantizerDecision", "QuantizerEvidence", "ReleaseDecision", "decide", "decision_mode"]
