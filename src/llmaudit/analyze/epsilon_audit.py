"""The one-run epsilon lower bound of one quantizer from its attacks' scores (docs/science.md section 15).

Every (run, pool record) pair is one record of the audited mechanism "train the M runs, then quantize": run r's
training set is the pool records with keep[r, i], each drawn independently with probability 1/2
(`train.membership: independent`), and changing one record of one run changes that run alone, so a mechanism that
is (epsilon, delta)-DP per run is (epsilon, delta)-DP per pair; quantization is post-processing. The guesser ranks
the M x N pairs by an attack's score and says "in" for the k+ highest, "out" for the k- lowest.

A guess may read every released model (all M runs, the base model, the validation texts) but never the membership
of another pair: a guess that reads the membership of the pairs it is counted with breaks the theorem (two guesses
that copy each other's membership are right or wrong together). Attacks that compare with the other runs' models
where a record was OUT (ref, LiRA, RMIA: `references` containing "runs") read memberships and are not used; each
attack that reads only models gets a second, centred score (minus the record's mean score over all M runs, a
reference that reads no membership).

k+ and k- (and the attack) are chosen honestly, one of two ways (`EpsilonSettings.strategy`):
- bonferroni (default): every attack x grid pair (k+/n, k-/n in `fractions`) on all pairs, each bound at
  significance / H (H the hypotheses of the family), the largest reported: all H hold at once with probability
  1 - significance (the reference code's multiplicity correction over thresholds, extended over attacks);
- split: the attack and the fractions chosen on half the runs (half the records with one run, by a seeded draw
  that never reads membership), the bound measured on the other half at the full significance. The choice reads
  the first half's memberships only, which are independent of the second half's: the theorem holds given them.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy import special

from llmaudit.analyze.epsilon_bound import InclusionDesign, epsilon_lower_bound

__all__ = ["EpsilonBound", "EpsilonSettings", "centred", "epsilon_audit", "outputs_only"]

STATEMENT = (
    "With probability at least 1 - significance, the mechanism that trained these runs and quantized them is not "
    "(epsilon, delta)-differentially private for any epsilon below epsilon_lb (Steinke, Nasr and Jagielski 2023, "
    "one run; quantization is post-processing, so the bound holds for training-then-quantizing). A lower bound "
    "from this suite of attacks: the true epsilon may be far larger."
)


@dataclass(frozen=True)
class EpsilonSettings:
    """How the bound is measured (docs/science.md section 15)."""

    significance: float = 0.05
    """Probability that the reported bound exceeds the true epsilon."""
    delta: float = 0.0
    """The delta of the (epsilon, delta) claims refuted: 0 = pure DP; a team checking a claim of (epsilon, delta)-DP
    sets its delta (e.g. 1e-5). The bound's p-value grows by 2 m delta alpha, so a large m x delta costs bound."""
    fractions: tuple[float, ...] = (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    """Grid of k+ / n and k- / n (n the scored pairs): every pair of values with k+ + k- >= 1 is a hypothesis."""
    strategy: Literal["bonferroni", "split"] = "bonferroni"
    """How the attack and k+ / k- are chosen honestly (module docstring)."""
    seed: int = 0
    """Seed of the split and of the order among tied scores (never reads membership)."""

    def check(self) -> None:
        """Check the settings.

        Raises:
            ValueError: when significance, delta, fractions or strategy is out of range.
        """
        if not 0 < self.significance < 1 or not 0 <= self.delta < 1:
            raise ValueError(
                f"significance in (0, 1) and delta in [0, 1) needed; got {self.significance}, {self.delta}"
            )
        if not self.fractions or any(not 0 <= f <= 0.5 for f in self.fractions) or max(self.fractions) <= 0:
            raise ValueError(f"fractions must lie in [0, 0.5], one of them positive; got {self.fractions}")
        if self.strategy not in ("bonferroni", "split"):
            raise ValueError(f"strategy must be bonferroni or split; got {self.strategy!r}")


class EpsilonBound(BaseModel):
    """The one-run lower bound of one quantizer (or why it is not reported)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quantizer: str
    status: Literal["MEASURED", "NOT MEASURED"]
    epsilon_lb: float | None
    significance: float
    delta: float
    strategy: Literal["bonferroni", "split"]
    attack: str | None = None
    k_plus: int | None = None
    k_minus: int | None = None
    guesses: int | None = None
    correct: int | None = None
    records: int | None = None
    """m: the (run, record) pairs of the measurement (those of the evaluation half with `split`)."""
    hypotheses: int = 0
    """H: the (attack, k+, k-) hypotheses searched (bonferroni: each bound at significance / H)."""
    reason: str = ""
    statement: str = STATEMENT


def outputs_only(references: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Select the attacks whose scores read models only, never another run's membership.

    Args:
        references (Mapping[str, tuple[str, ...]]): {attack: its references} (the registry's
            `AttackSpec.references`).
    Returns:
        list[str]: the attacks whose references do not include "runs".
    """
    return [a for a, refs in references.items() if "runs" not in refs]


def centred(scores: np.ndarray) -> np.ndarray:
    """Centre each score on its record's mean score over all M runs (NaN ignored).

    The mean is a per-record reference that reads every released model and no membership.

    Args:
        scores (np.ndarray): [M, N] scores.
    Returns:
        np.ndarray: [M, N] centred scores; NaN for a record no run scored.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a record no run scored stays NaN
        return scores - np.nanmean(scores, axis=0, keepdims=True)


@dataclass(frozen=True)
class _Ranked:
    """One attack's finite pairs ranked: correct "in" guesses among the top k, correct "out" among the bottom k."""

    in_correct: np.ndarray  # [n + 1] members among the k highest
    out_correct: np.ndarray  # [n + 1] non-members among the k lowest

    @property
    def n(self) -> int:
        return self.in_correct.size - 1


def _rank(scores: np.ndarray, member: np.ndarray, rng: np.random.Generator) -> _Ranked:
    ok = np.isfinite(scores)
    s, mem = scores[ok], member[ok].astype(np.int64)
    order = np.lexsort((rng.random(s.size), -s))  # highest first; ties in a random order that reads no membership
    mem = mem[order]
    top = np.concatenate([[0], np.cumsum(mem)])
    bottom = np.concatenate([[0], np.cumsum((1 - mem)[::-1])])
    return _Ranked(top, bottom)


def _grid(fractions: tuple[float, ...]) -> list[tuple[float, float]]:
    """Every (k+ / n, k- / n) pair of the grid but (0, 0)."""
    values = sorted(set(fractions))
    return [(a, b) for a in values for b in values if (a, b) != (0, 0)]


def _counts(r: _Ranked, f_plus: float, f_minus: float) -> tuple[int, int, int, int]:
    """(k+, k-, guesses, correct) of one grid point on ranked pairs."""
    kp, km = math.floor(f_plus * r.n), math.floor(f_minus * r.n)
    return kp, km, kp + km, int(r.in_correct[kp] + r.out_correct[km])


def _best(ranked: dict[str, _Ranked], grid, m: int, significance: float, delta: float) -> tuple[float, tuple]:
    """The largest bound over attacks x grid points at `significance` each, with its (attack, f+, f-, counts);
    grid points are tried in decreasing order of raw accuracy, and one whose accuracy cannot beat the best so far
    (the bound is below logit(v / r)) is skipped."""
    candidates = []
    for attack, r in ranked.items():
        for fp, fm in grid:
            kp, km, guesses, correct = _counts(r, fp, fm)
            if guesses > 0:
                candidates.append((correct / guesses, attack, fp, fm, (kp, km, guesses, correct)))
    best, arg = 0.0, (None, None, None, None)
    for accuracy, attack, fp, fm, counts in sorted(candidates, key=lambda c: -c[0]):
        if accuracy <= 0.5 or (best > 0 and special.logit(accuracy) <= best):
            break
        eps = epsilon_lower_bound(m, counts[2], counts[3], significance, delta)
        if eps > best:
            best, arg = eps, (attack, fp, fm, counts)
    return best, arg


def _not_measured(quantizer: str, s: EpsilonSettings, reason: str) -> EpsilonBound:
    return EpsilonBound(
        quantizer=quantizer,
        status="NOT MEASURED",
        epsilon_lb=None,
        significance=s.significance,
        delta=s.delta,
        strategy=s.strategy,
        reason=reason,
    )


def _ranked_all(scores: Mapping[str, np.ndarray], keep: np.ndarray, cells: np.ndarray, seed: int) -> dict:
    """{attack: _Ranked} of the pairs in `cells` ([M, N] bool), with every attack's centred score beside it (M >= 2)."""
    rng = np.random.default_rng([seed, 17])
    out = {}
    for attack, s in scores.items():
        variants = {attack: s} | ({f"{attack}-centred": centred(s)} if s.shape[0] >= 2 else {})
        for name, v in variants.items():
            out[name] = _rank(np.where(cells, v, np.nan).ravel(), keep.ravel(), rng)
    return out


def _halves(shape: tuple[int, int], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two complementary [M, N] masks: runs split in halves by a seeded draw (records, with one run)."""
    M, N = shape
    rng = np.random.default_rng([seed, 19])
    first = np.zeros(shape, dtype=bool)
    if M >= 2:
        first[rng.permutation(M)[: M // 2], :] = True
    else:
        first[:, rng.permutation(N)[: N // 2]] = True
    return first, ~first


def epsilon_audit(
    quantizer: str,
    scores: Mapping[str, np.ndarray],
    keep: np.ndarray,
    design: InclusionDesign,
    s: EpsilonSettings | None = None,
) -> EpsilonBound:
    """Bound epsilon from below for one quantizer (module docstring), or say why not.

    Args:
        quantizer (str): the quantizer's name.
        scores (Mapping[str, np.ndarray]): {attack: [M, N] raw scores} of attacks that read models only
            (`outputs_only`), higher = member.
        keep (np.ndarray): [M, N] membership of each (run, record) pair.
        design (InclusionDesign): the store's `inclusion_design`; one that does not qualify gives NOT MEASURED.
        s (EpsilonSettings | None): the settings (default `EpsilonSettings()`).
    Returns:
        EpsilonBound: the bound with the attack, k+, k-, guesses and correct guesses behind it, or NOT MEASURED
        with the reason.
    Raises:
        ValueError: when the settings are out of range.
    """
    s = s or EpsilonSettings()
    s.check()
    if not design.qualifies:
        return _not_measured(quantizer, s, design.reason)
    if not scores:
        return _not_measured(quantizer, s, "no attack that reads models only (not other runs' memberships) scored")
    grid = _grid(s.fractions)
    if s.strategy == "bonferroni":
        ranked = _ranked_all(scores, keep, np.ones(keep.shape, dtype=bool), s.seed)
        hypotheses, m = len(ranked) * len(grid), keep.size
        eps, (attack, _, _, counts) = _best(ranked, grid, m, s.significance / hypotheses, s.delta)
    else:
        choose, measure = _halves(keep.shape, s.seed)
        ranked = _ranked_all(scores, keep, choose, s.seed)
        hypotheses, m = len(ranked) * len(grid), int(measure.sum())
        _, (attack, fp, fm, _) = _best(ranked, grid, int(choose.sum()), s.significance, s.delta)
        eps, counts = 0.0, None
        if attack is not None:
            counts = _counts(_ranked_all(scores, keep, measure, s.seed)[attack], fp, fm)
            eps = epsilon_lower_bound(m, counts[2], counts[3], s.significance, s.delta) if counts[2] else 0.0
    return _measured(quantizer, s, eps, attack, counts, m, hypotheses)


def _measured(quantizer, s: EpsilonSettings, eps: float, attack, counts, m: int, hypotheses: int) -> EpsilonBound:
    kp, km, guesses, correct = counts if counts is not None else (None,) * 4
    return EpsilonBound(
        quantizer=quantizer,
        status="MEASURED",
        epsilon_lb=float(eps),
        significance=s.significance,
        delta=s.delta,
        strategy=s.strategy,
        attack=attack,
        k_plus=kp,
        k_minus=km,
        guesses=guesses,
        correct=correct,
        records=m,
        hypotheses=hypotheses,
    )
