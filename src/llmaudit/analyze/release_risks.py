"""What an audit answers beyond the per-quantizer release decision, from what the analysis already holds: the
extraction risk of every quantizer (docs/science.md section 13), the decision of every release set of
`report.release_sets` (section 14) and the one-run epsilon lower bound of every quantizer (section 15).

Each block is a typed model of `llmaudit.analyze.result_risks` and goes to the result object under its own key
("extraction", "release_sets", "epsilon"); the report reads them as they are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from llmaudit.analyze.attacks.registry import attack_spec
from llmaudit.analyze.decision import DecisionSettings
from llmaudit.analyze.decision.decide import QuantizerEvidence
from llmaudit.analyze.epsilon_audit import EpsilonSettings, epsilon_audit, outputs_only
from llmaudit.analyze.epsilon_bound import inclusion_design
from llmaudit.analyze.extraction import ExtractionSettings, extraction_matrices, greedy_check_of_table
from llmaudit.analyze.extraction_risk import extraction_risk
from llmaudit.analyze.release_sets import SetNotComparable, check_release_sets, decide_release_set, set_name
from llmaudit.analyze.result_risks import EpsilonBlock, ExtractionBlock, ReleaseSetEntry, ReleaseSetNotMeasured

__all__ = ["check_release_sets", "epsilon_block", "extraction_block", "release_sets_block"]


def extraction_block(
    table: pd.DataFrame,
    quantizers: Sequence[str],
    reference: str | None,
    val_records: Sequence[Mapping[str, Any]],
    s: DecisionSettings,
) -> ExtractionBlock:
    """Measure the extraction risk of every quantizer and check greedy extraction against generated answers.

    The greedy rate read from the top-1 flags is checked against the greedy answers generated at each run's final
    checkpoint, where the store generated them.

    Args:
        table (pd.DataFrame): the store's light table (its rows carry the greedy flag, `store_table.light_frame`).
        quantizers (Sequence[str]): the quantizers analysed.
        reference (str | None): the store's full precision (the paired comparison's base).
        val_records (Sequence[Mapping[str, Any]]): the store's validation records (their reference responses,
            `output`).
        s (DecisionSettings): the release rule's settings (resamples and seed).
    Returns:
        ExtractionBlock: the `ExtractionResult` (n = 100, p = 0.5) and {quantizer: its `GreedyCheck`} for the
        quantizers with generated answers.
    """
    matrices = {q: extraction_matrices(table, q) for q in quantizers}
    risk = extraction_risk(matrices, reference, ExtractionSettings(), s)
    outputs = {str(r["sample_id"]): str(r["output"]) for r in val_records}
    checks = {q: greedy_check_of_table(table, q, outputs) for q in quantizers}
    return ExtractionBlock(risk=risk, greedy_check={q: c for q, c in checks.items() if c.answers})


def epsilon_block(evidence: Mapping[str, QuantizerEvidence], manifest: dict[str, Any], seed: int) -> EpsilonBlock:
    """Bound epsilon from below for every attacked quantizer, from its attacks that read models only.

    Args:
        evidence (Mapping[str, QuantizerEvidence]): {quantizer: its evidence} (raw scores in `raw`).
        manifest (dict[str, Any]): the store's manifest (its membership design, `inclusion_design`).
        seed (int): the seed of the split and of the order among tied scores.
    Returns:
        EpsilonBlock: the design, whether it qualifies, why not, and {quantizer: its `EpsilonBound`}, each NOT
        MEASURED with the reason where the design does not qualify.
    """
    design = inclusion_design(manifest)
    settings = EpsilonSettings(seed=seed)
    per_q = {}
    for q, ev in evidence.items():
        allowed = set(outputs_only({a: attack_spec(a).references for a in ev.raw}))
        scores = {a: v for a, v in ev.raw.items() if a in allowed}
        per_q[q] = epsilon_audit(q, scores, ev.keep, design, settings)
    return EpsilonBlock(design=design.design, qualifies=design.qualifies, reason=design.reason, per_quantizer=per_q)


def release_sets_block(
    evidence: Mapping[str, QuantizerEvidence], sets: Sequence[Sequence[str]], s: DecisionSettings
) -> list[ReleaseSetEntry]:
    """Judge every release set by the release rule and compare it with its best single file.

    A set with a file that was not attacked (left out of this analysis, not completely scored), or whose files were
    attacked on other target models or in another mode, is NOT MEASURED with why.

    Args:
        evidence (Mapping[str, QuantizerEvidence]): {quantizer: its evidence}.
        sets (Sequence[Sequence[str]]): the release sets (`report.release_sets`).
        s (DecisionSettings): the release rule's settings.
    Returns:
        list[ReleaseSetEntry]: one `ReleaseSetDecision` (or `ReleaseSetNotMeasured`) per set.
    """
    out: list[ReleaseSetEntry] = []
    for files in sets:
        missing = [f for f in files if f not in evidence]
        why = f"not measured: {', '.join(missing)} not attacked in this analysis (not completely scored)"
        if not missing:
            try:
                out.append(decide_release_set(evidence, files, s))
                continue
            except SetNotComparable as exc:
                why = f"not measured: {exc}"
        out.append(ReleaseSetNotMeasured(name=set_name(files), files=list(files), not_measured=why))
    return out
