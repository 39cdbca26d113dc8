"""Extraction risk per quantizer: the greedy and (n, p) extraction rates of members and of non-members with their
intervals, the memorized part (members minus non-members), and the paired comparison with full precision
(docs/science.md section 13).

Rates pool the (run, record) rows of the quantizer's final checkpoints on the pool: members are the rows whose run
trained on the record, non-members the others. The non-members' rate is what the task makes predictable without
memorization (a short, formulaic answer is reproduced whether or not it was trained on); the difference is what
was memorized. Intervals resample records with all their runs, with the multiplicities of the release decision
(`llmaudit.analyze.decision.counts.multiplicities`, the same seed and resamples: the same resamples as the decision
on the same records; with one run, members and non-members resampled separately): a rate's 95% interval is
Wilson's at the bootstrap's effective sample size, a difference's the 95% percentile interval. The comparison with
the reference is paired (the same records and resamples for both quantizers); its 1 - 2 alpha percentile interval
decides MORE / LESS / SAME (within +-margin) / CANNOT TELL as the release decision's comparison does, and it is
two-sided: quantization may restore what fine-tuning did not show (or what unlearning removed) as well as erase it.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from llmaudit.analyze.decision.bounds import percentile_interval, proportion_bounds, z_value
from llmaudit.analyze.decision.counts import multiplicities, ratio
from llmaudit.analyze.decision.models import Direction, Estimate
from llmaudit.analyze.decision.rule import DecisionSettings
from llmaudit.analyze.extraction import (
    ExtractionMatrices,
    ExtractionSettings,
    exact_probability_threshold,
    sampled_extractable,
)

Measure = Literal["greedy", "sampled"]

DEFINITIONS = {
    "greedy": "discoverable extraction (Carlini et al. 2023): greedy decoding of the prompt reproduces the response "
    "exactly, end-of-turn included; read from the top-1 flags (every response token the model's top-1)",
    "sampled": "(n, p)-discoverable extraction (Hayes et al. 2024): 1 - (1 - p_z)^n >= p with p_z = exp(-sum of the "
    "response's token losses), the probability of sampling the response exactly at temperature 1",
    "memorized": "members' rate minus non-members' rate: the part of the extraction that training on the record made",
}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExtractionRates(_Model):
    """One measure's rates on one quantizer."""

    measure: Measure
    members: Estimate
    nonmembers: Estimate
    memorized: Estimate
    member_rows: float
    nonmember_rows: float


class ExtractionChange(_Model):
    """One measure's paired differences quantizer - reference, with the direction of the memorized part."""

    measure: Measure
    reference: str
    members: Estimate
    nonmembers: Estimate
    memorized: Estimate
    direction: Direction
    sentence: str


class QuantizerExtraction(_Model):
    """Extraction risk of one quantizer."""

    quantizer: str
    n_targets: int
    n_samples: int
    rates: list[ExtractionRates]
    comparison: list[ExtractionChange] = Field(default_factory=list)
    not_measured: dict[str, str] = Field(default_factory=dict)
    """measure -> why it is not measured (no top-1 flags in the table, ...)."""


class ExtractionResult(_Model):
    """Extraction risk of every quantizer and the settings behind it."""

    n: int
    p: float
    p_exact_threshold: float
    reference: str | None
    definitions: dict[str, str]
    per_quantizer: dict[str, QuantizerExtraction]


def resampled_rates(flags: np.ndarray, keep: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Compute the extraction rates of members and non-members under each row of record multiplicities.

    Args:
        flags (np.ndarray): [M, N] 1.0 extracted, 0.0 not, NaN not measured (left out).
        keep (np.ndarray): [M, N] membership.
        weights (np.ndarray): [B + 1, N] record multiplicities, row 0 the observed data.
    Returns:
        np.ndarray: [B + 1, 5] (members' rate, non-members' rate, their difference, member rows, non-member rows).
    """
    ok = np.isfinite(flags)
    hit = np.where(ok, flags, 0.0)
    per_record = np.stack([(hit * keep).sum(0), (ok & keep).sum(0), (hit * ~keep).sum(0), (ok & ~keep).sum(0)])
    c = weights @ per_record.T  # [B + 1, 4]
    members, nonmembers = ratio(c[:, 0], c[:, 1]), ratio(c[:, 2], c[:, 3])
    return np.stack([members, nonmembers, members - nonmembers, c[:, 1], c[:, 3]], axis=1)


def _none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _rate(resampled: np.ndarray, rows: float) -> Estimate:
    lo, hi = proportion_bounds(resampled[0], resampled[1:], rows, z_value(0.025))
    if resampled[0] == 0.0:  # Wilson's lower end at a zero rate is 0; its floating-point rounding is not
        lo = 0.0
    return Estimate(
        value=_none(resampled[0]),
        low=_none(lo),
        high=_none(hi),
        confidence=0.95,
        method="Wilson at the bootstrap's effective sample size (records resampled with all their runs)",
    )


def _difference(resampled: np.ndarray, low_q: float, high_q: float, method: str) -> Estimate:
    lo, hi = percentile_interval(resampled[1:], low_q, high_q)
    return Estimate(value=_none(resampled[0]), low=_none(lo), high=_none(hi), confidence=high_q - low_q, method=method)


def rates_of(measure: Measure, resampled: np.ndarray) -> ExtractionRates:
    """Summarise one measure's resampled rates with their intervals.

    Args:
        measure (Measure): "greedy" or "sampled".
        resampled (np.ndarray): [B + 1, 5] the output of `resampled_rates`.
    Returns:
        ExtractionRates: the rates with 95% Wilson intervals, the memorized part with its percentile interval.
    """
    return ExtractionRates(
        measure=measure,
        members=_rate(resampled[:, 0], resampled[0, 3]),
        nonmembers=_rate(resampled[:, 1], resampled[0, 4]),
        memorized=_difference(resampled[:, 2], 0.025, 0.975, "percentile bootstrap (records with all their runs)"),
        member_rows=float(resampled[0, 3]),
        nonmember_rows=float(resampled[0, 4]),
    )


def direction_of(d: Estimate, margin: float) -> Direction:
    """Read the direction of a paired difference from its interval.

    Args:
        d (Estimate): the difference quantizer - reference with its interval.
        margin (float): the equivalence margin.
    Returns:
        Direction: MORE when the low end is above 0, LESS when the high end is below 0, SAME when the interval lies
        within (-margin, +margin), else CANNOT TELL; NOT MEASURED without an interval.
    """
    if d.value is None or d.low is None or d.high is None:
        return "NOT MEASURED"
    if d.low > 0:
        return "MORE"
    if d.high < 0:
        return "LESS"
    return "SAME" if -margin < d.low and d.high < margin else "CANNOT TELL"


def _change_sentence(measure: str, quantizer: str, reference: str, d: Estimate, direction: str, margin: float) -> str:
    if direction == "NOT MEASURED":
        return f"{quantizer}'s {measure} extraction cannot be compared with {reference}'s: no estimate on both"
    span = f"members - non-members {d.value:+.3f} [{d.low:+.3f}, {d.high:+.3f}] against {reference}"
    return {
        "MORE": f"{quantizer} gives back more of what was memorized than {reference} ({measure} extraction; {span})",
        "LESS": f"{quantizer} gives back less of what was memorized than {reference} ({measure} extraction; {span})",
        "SAME": f"{quantizer} gives back the same as {reference} within +-{margin:g} ({measure} extraction; {span})",
        "CANNOT TELL": f"the data cannot tell whether {quantizer} gives back more or less of what was memorized "
        f"than {reference} ({measure} extraction; {span})",
    }[direction]


def change_of(measure: Measure, quantizer: str, reference: str, q: np.ndarray, ref: np.ndarray, s: DecisionSettings):
    """Compare two quantizers' resampled rates made with the same multiplicities.

    Args:
        measure (Measure): "greedy" or "sampled".
        quantizer (str): the quantizer compared.
        reference (str): the reference it is compared with.
        q (np.ndarray): [B + 1, 5] the quantizer's `resampled_rates`.
        ref (np.ndarray): [B + 1, 5] the reference's, on the same records and resamples.
        s (DecisionSettings): the rule's settings (alpha, margin).
    Returns:
        ExtractionChange: the paired differences at 1 - 2 alpha and the direction of the memorized part.
    """
    method = "paired percentile bootstrap (the same records and resamples)"
    parts = [_difference(q[:, j] - ref[:, j], s.alpha, 1 - s.alpha, method) for j in range(3)]
    direction = direction_of(parts[2], s.margin)
    sentence = _change_sentence(measure, quantizer, reference, parts[2], direction, s.margin)
    return ExtractionChange(
        measure=measure,
        reference=reference,
        members=parts[0],
        nonmembers=parts[1],
        memorized=parts[2],
        direction=direction,
        sentence=sentence,
    )


def _flags(m: ExtractionMatrices, es: ExtractionSettings) -> dict[str, np.ndarray]:
    out = {"sampled": sampled_extractable(m.log_p_exact, es.n, es.p)}
    if m.greedy is not None:
        out = {"greedy": m.greedy} | out
    return out


NO_TOP1 = "the loss table has no top-1 flags (token_top1, loss-table version 2): greedy extraction is not measured"


def _weights(m: ExtractionMatrices, s: DecisionSettings) -> np.ndarray:
    strata = m.keep[0] if m.keep.shape[0] == 1 else None  # one run: members and non-members resampled apart
    return multiplicities(len(m.sample_ids), s.resamples, s.seed, strata)


def quantizer_extraction(m: ExtractionMatrices, es: ExtractionSettings, s: DecisionSettings):
    """Measure the extraction risk of one quantizer (without the comparison).

    Args:
        m (ExtractionMatrices): the quantizer's matrices.
        es (ExtractionSettings): the (n, p) of sampled extraction.
        s (DecisionSettings): the decision's settings (resamples, seed).
    Returns:
        tuple[QuantizerExtraction, dict[str, np.ndarray]]: the result, and {measure: resampled rates [B + 1, 5]}.
    """
    weights = _weights(m, s)
    resampled = {k: resampled_rates(f, m.keep, weights) for k, f in _flags(m, es).items()}
    result = QuantizerExtraction(
        quantizer=m.quantizer,
        n_targets=int(m.keep.shape[0]),
        n_samples=len(m.sample_ids),
        rates=[rates_of(k, r) for k, r in resampled.items()],  # type: ignore[arg-type]
        not_measured={} if m.greedy is not None else {"greedy": NO_TOP1},
    )
    return result, resampled


def _paired(q: ExtractionMatrices, ref: ExtractionMatrices, es: ExtractionSettings, s: DecisionSettings) -> list:
    """The changes of q against ref (the same runs) on the records both scored."""
    common = [x for x in ref.sample_ids if x in set(q.sample_ids)]
    q_c, ref_c = q.restricted(common), ref.restricted(common)
    weights = _weights(ref_c, s)
    ours = {k: resampled_rates(f, q_c.keep, weights) for k, f in _flags(q_c, es).items()}
    theirs = {k: resampled_rates(f, ref_c.keep, weights) for k, f in _flags(ref_c, es).items()}
    return [change_of(k, q.quantizer, ref.quantizer, ours[k], theirs[k], s) for k in ours if k in theirs]  # type: ignore[arg-type]


def extraction_risk(
    matrices: dict[str, ExtractionMatrices],
    reference: str | None,
    es: ExtractionSettings | None = None,
    s: DecisionSettings | None = None,
) -> ExtractionResult:
    """Measure the extraction risk of every quantizer, each compared with the reference where possible.

    A quantizer is compared with `reference` (the store's full precision) where the reference is among them and has
    the same runs.

    Args:
        matrices (dict[str, ExtractionMatrices]): {quantizer: `extraction_matrices(df, quantizer)`}.
        reference (str | None): the reference quantizer.
        es (ExtractionSettings | None): the (n, p) of sampled extraction (default `ExtractionSettings()`).
        s (DecisionSettings | None): the decision's settings (default `DecisionSettings()`).
    Returns:
        ExtractionResult: the result of every quantizer and the settings behind it.
    Raises:
        ValueError: when settings are out of range.
    """
    es, s = es or ExtractionSettings(), s or DecisionSettings()
    es.check()
    s.check()
    per_q = {}
    for name, m in matrices.items():
        result, _ = quantizer_extraction(m, es, s)
        if reference in matrices and name != reference:
            if m.runs == matrices[reference].runs:
                result = result.model_copy(update={"comparison": _paired(m, matrices[reference], es, s)})
            else:
                why = f"not the same runs as {reference} ({list(m.runs)} vs {list(matrices[reference].runs)})"
                result = result.model_copy(update={"not_measured": result.not_measured | {"comparison": why}})
        per_q[name] = result
    return ExtractionResult(
        n=es.n,
        p=es.p,
        p_exact_threshold=exact_probability_threshold(es.n, es.p),
        reference=reference if reference in matrices else None,
        definitions=DEFINITIONS,
        per_quantizer=per_q,
    )
