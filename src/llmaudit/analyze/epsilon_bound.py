"""A lower bound on the privacy loss epsilon of differential privacy from one audit (docs/science.md section 15):
the one-run bound of Steinke, Nasr and Jagielski (2023, "Privacy auditing with one (1) training run", their
theorem for guessers that may abstain), and the question whether a store's membership design allows it.

With m records each included independently with probability 1/2, a guesser that says "in" for k+ records,
"out" for k- others and abstains on the rest (r = k+ + k- guesses) and gets v right refutes (epsilon, delta)-DP
at significance level s when p(epsilon, delta) <= s, where with q = e^epsilon / (1 + e^epsilon)

    beta  = P[Binomial(r, q) >= v]
    alpha = max over i = 1..v of P[v - i <= Binomial(r, q) < v] / i
    p(epsilon, delta) = min(1, beta + 2 m delta alpha).

p increases with epsilon; the bound is the epsilon where p reaches s (0 when p(0) > s already). Pure functions of
counts; the guessing from attack scores is `llmaudit.analyze.epsilon_audit`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import optimize, special, stats

__all__ = ["InclusionDesign", "epsilon_lower_bound", "inclusion_design", "one_run_p_value"]


def _check_counts(m: int, r: int, v: int) -> None:
    if not (0 <= v <= r <= m):
        raise ValueError(f"the counts must satisfy 0 <= correct <= guesses <= records; got v={v}, r={r}, m={m}.")


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """Compute the p-value of v correct guesses out of r on m records under (epsilon, delta)-DP (module docstring).

    Args:
        m (int): records included independently with probability 1/2 (the delta term grows with it).
        r (int): guesses made (the guesser abstains on the other m - r records).
        v (int): correct guesses.
        epsilon (float): the privacy loss tested (>= 0).
        delta (float): the delta of the (epsilon, delta) claim tested, in [0, 1].
    Returns:
        float: min(1, beta + 2 m delta alpha): the probability, under the claim, of v or more correct guesses
        (bounded).
    Raises:
        ValueError: counts that contradict each other, a negative epsilon or a delta outside [0, 1].
    """
    _check_counts(m, r, v)
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"epsilon must be >= 0 and delta in [0, 1]; got {epsilon}, {delta}.")
    if v == 0:
        return 1.0
    q = float(special.expit(epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0:
        return min(1.0, beta)
    i = np.arange(1, v + 1)
    between = stats.binom.sf(v - i - 1, r, q) - beta  # P[v - i <= B < v]
    alpha = float(np.max(between / i))
    return min(1.0, beta + 2 * m * delta * alpha)


def epsilon_lower_bound(m: int, r: int, v: int, significance: float = 0.05, delta: float = 0.0) -> float:
    """Find the largest epsilon that v correct guesses out of r on m records refute at `significance`.

    It is the root of p(epsilon, delta) = significance (`one_run_p_value`), found by stepping epsilon up by 1 while
    p stays below the level and then bisecting (Brent's method, to 1e-9).

    Args:
        m (int): records included independently with probability 1/2.
        r (int): guesses made.
        v (int): correct guesses.
        significance (float): the level s in (0, 1): with probability at least 1 - s the true epsilon is at least
            the bound.
        delta (float): the delta of the claims refuted, in [0, 1].
    Returns:
        float: epsilon_lb >= 0; 0 when p(0, delta) is already above the level; capped at 60 (e^60 / (1 + e^60) is 1
        in double precision).
    Raises:
        ValueError: as `one_run_p_value`, or a significance outside (0, 1).
    """
    if not 0 < significance < 1:
        raise ValueError(f"significance must lie in (0, 1); got {significance}.")
    _check_counts(m, r, v)

    def gap(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, delta) - significance

    if v == 0 or gap(0.0) >= 0:
        return 0.0
    low = 0.0
    while low < 60 and gap(low + 1.0) < 0:
        low += 1.0
    if low >= 60:
        return 60.0
    return float(optimize.brentq(gap, low, low + 1.0, xtol=1e-9))


Design = Literal["fixed_fraction", "independent", "import", "unknown"]


@dataclass(frozen=True)
class InclusionDesign:
    """How a store's records were included in each fine-tuning run, and whether the one-run bound applies."""

    design: Design
    member_fraction: float | None
    qualifies: bool
    reason: str
    """Why the bound is not reported (empty when it qualifies): the sentence the report prints instead."""


RECREATE = "recreate the store with train.membership=independent and train.member_fraction=0.5"


def inclusion_design(manifest: dict[str, Any]) -> InclusionDesign:
    """Read the membership design recorded in a store's manifest and whether the one-run bound applies.

    The bound needs every pool record in every run with probability 1/2, independently (`train.membership:
    independent` with `train.member_fraction: 0.5`). A fixed-size subset per run (`fixed_fraction`, the default,
    and the design of a manifest that records none) makes the inclusions of one run dependent; an imported
    fine-tune's training sets were chosen by whoever trained it.

    Args:
        manifest (dict[str, Any]): the store's manifest (`RunStore.manifest()`): its `origin` and `identity.train`.
    Returns:
        InclusionDesign: the design, with the reason the report prints instead of a number where it does not
        qualify.
    """
    if manifest.get("origin") == "import":
        return InclusionDesign(
            "import",
            None,
            False,
            "imported fine-tunes: their training sets were chosen by whoever trained them, not drawn record by "
            "record with probability 1/2, so the one-run bound does not apply",
        )
    train = ((manifest.get("identity") or {}).get("train")) or {}
    design = train.get("membership", "fixed_fraction")
    fraction = train.get("member_fraction")
    fraction = float(fraction) if isinstance(fraction, int | float) else None
    if design == "fixed_fraction":
        return InclusionDesign(
            "fixed_fraction",
            fraction,
            False,
            "each run trains on a fixed-size random subset of the pool (train.membership=fixed_fraction): one run's "
            f"inclusions are not independent, which the one-run bound needs; {RECREATE}",
        )
    if design != "independent":
        return InclusionDesign("unknown", fraction, False, f"unknown membership design {design!r}; {RECREATE}")
    if fraction is None or not math.isclose(fraction, 0.5):
        return InclusionDesign(
            "independent",
            fraction,
            False,
            f"records are included independently but with probability {fraction}, and the one-run bound needs "
            f"1/2; {RECREATE}",
        )
    return InclusionDesign("independent", fraction, True, "")
