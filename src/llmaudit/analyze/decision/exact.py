"""The exact FAIL test on few non-members (docs/science.md section 12, "A FAIL on few non-members").

With fewer than 10 / FPR non-member scores no TPR at the FPR can be estimated, so no PASS can be shown; a large
leak can still be shown. With n non-members, the k-th largest non-member score lies at or above the population's
(1 - FPR) quantile q unless fewer than k of the n exceed q: P[Bin(n, FPR) < k]. At such a threshold t >= q the
FPR is at most FPR and the TPR at most the TPR at q, and the members above t are binomial given t, so an exact
(Clopper-Pearson) lower bound of their proportion bounds the TPR at 1% FPR from below. The two errors add: with
alpha_t = P[Bin(n, FPR) < k] <= alpha / 2 and the bound at alpha - alpha_t, a quantizer whose every attack's true TPR
is at or below the limit FAILs with probability at most alpha, whatever the scores' distribution.

Choosing the attack on the same data would spend the threshold's error once per attack (the threshold that fell
low wins); the attack is instead chosen on a selection split (a share of the members and the non-members the
threshold can spare) and measured on the rest, which the choice never saw. One target model only: its members and
non-members are distinct records, independent given the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

from llmaudit.analyze.decision.settings import DecisionSettings

MIN_SELECTION_NONMEMBERS = 10
"""Non-members the selection split needs to choose among several attacks."""


@dataclass(frozen=True)
class ExactDesign:
    """How the exact test splits one target's scores: the selection split (where the attack is chosen), the
    measurement split, the order statistic k of the threshold and the two error rates (alpha_t + alpha_c = alpha)."""

    selection_members: int
    selection_nonmembers: int
    members: int
    nonmembers: int
    k: int
    alpha_threshold: float
    alpha_bound: float


def threshold_rank(n: int, fpr: float, alpha_t: float) -> tuple[int, float]:
    """Find the order statistic of the exact test's threshold.

    Args:
        n (int): non-member scores the threshold is read from.
        fpr (float): the false-positive rate the threshold must hold.
        alpha_t (float): the largest probability allowed for a threshold below the quantile.
    Returns:
        tuple[int, float]: (k, P[Bin(n, fpr) < k]): the largest k >= 1 with P[Bin(n, fpr) >= k] >= 1 - alpha_t, and
        the probability that the k-th largest of n non-members lies below the population's 1 - fpr quantile;
        (0, 1.0) where no k qualifies.
    """
    k = 0
    while k < n and stats.binom.sf(k, n, fpr) >= 1 - alpha_t:  # sf(k) = P[X >= k + 1]
        k += 1
    return k, (float(stats.binom.cdf(k - 1, n, fpr)) if k else 1.0)


def nonmembers_for_threshold(fpr: float, alpha_t: float) -> int:
    """Count the fewest non-members whose largest score holds the FPR with probability >= 1 - alpha_t.

    The count is ceil(log(alpha_t) / log(1 - fpr)) (367 at fpr 0.01, alpha_t 0.025).

    Args:
        fpr (float): the false-positive rate.
        alpha_t (float): the threshold's error rate.
    Returns:
        int: the count.
    """
    return int(math.ceil(math.log(alpha_t) / math.log1p(-fpr) - 1e-9))


def clopper_pearson(x: int, n: int, alpha: float) -> tuple[float, float]:
    """Compute the one-sided exact bounds of a binomial proportion x / n, each at level 1 - alpha.

    Args:
        x (int): successes.
        n (int): trials.
        alpha (float): the error rate of each bound.
    Returns:
        tuple[float, float]: (lower, upper).
    """
    lower = 0.0 if x <= 0 else float(stats.beta.ppf(alpha, x, n - x + 1))
    upper = 1.0 if x >= n else float(stats.beta.ppf(1 - alpha, x + 1, n - x))
    return lower, upper


def exact_design(members: int, nonmembers: int, n_attacks: int, s: DecisionSettings) -> ExactDesign | str:
    """Split one target's scores for the exact test, or say why it cannot be made.

    With one attack nothing is chosen and every score is measured; with several, the selection split takes
    1 / folds of the members and of the non-members, less where the threshold needs them (at least
    `MIN_SELECTION_NONMEMBERS`).

    Args:
        members (int): the target's scored members.
        nonmembers (int): the target's scored non-members.
        n_attacks (int): the attacks to choose among.
        s (DecisionSettings): the rule's settings (fpr, alpha, folds).
    Returns:
        ExactDesign | str: the design, or a sentence saying what is missing.
    """
    need = nonmembers_for_threshold(s.fpr, s.alpha / 2)
    select_non = 0 if n_attacks <= 1 else min(nonmembers // s.folds, nonmembers - need)
    select_mem = 0 if n_attacks <= 1 else members // s.folds
    least = need + (MIN_SELECTION_NONMEMBERS if n_attacks > 1 else 0)
    if nonmembers < least or (n_attacks > 1 and select_non < MIN_SELECTION_NONMEMBERS):
        return (
            f"{nonmembers} non-member scores: the exact FAIL test needs at least {least} ({need} for a threshold that "
            f"holds {s.fpr:.0%} FPR with probability {1 - s.alpha / 2:.3g}"
            + (f", {MIN_SELECTION_NONMEMBERS} to choose the attack)" if n_attacks > 1 else ")")
        )
    if members - select_mem < 1 or (n_attacks > 1 and select_mem < 1):
        return f"{members} member scores: too few to choose an attack and measure it"
    k, alpha_t = threshold_rank(nonmembers - select_non, s.fpr, s.alpha / 2)
    return ExactDesign(
        select_mem, select_non, members - select_mem, nonmembers - select_non, k, alpha_t, s.alpha - alpha_t
    )


@dataclass(frozen=True)
class ExactResult:
    """The exact test's reading: the attack chosen, its members above the threshold, the counts, the realised FPR,
    the exact lower bound (one-sided 1 - alpha in all), and the design."""

    attack: str
    hits: int
    false_positives: int
    lower: float
    design: ExactDesign

    @property
    def tpr(self) -> float:
        """The chosen attack's TPR on the measurement split.

        Returns:
            float: hits / members.
        """
        return self.hits / self.design.members

    @property
    def realised_fpr(self) -> float:
        """The realised false-positive rate on the measurement split.

        Returns:
            float: false positives / non-members.
        """
        return self.false_positives / self.design.nonmembers


def _split(member: np.ndarray, design: ExactDesign, seed: int) -> np.ndarray:
    """[N] True where a sample is in the selection split: a seeded draw of design.selection_members members and
    design.selection_nonmembers non-members."""
    rng = np.random.default_rng(seed)
    chosen = np.zeros(member.size, bool)
    for cls, size in ((True, design.selection_members), (False, design.selection_nonmembers)):
        idx = np.flatnonzero(member == cls)
        chosen[rng.permutation(idx)[:size]] = True
    return chosen


def _choice_key(scores: np.ndarray, member: np.ndarray) -> tuple[int, float]:
    """What the selection split says of an attack: members above its largest non-member (the same kind of
    threshold the measurement reads), then its AUROC (ties count one half)."""
    pos, neg = scores[member], scores[~member]
    hits = int((pos > neg.max()).sum()) if neg.size else 0
    ranks = stats.rankdata(np.r_[pos, neg])
    auroc = (ranks[: pos.size].sum() - pos.size * (pos.size + 1) / 2) / max(1, pos.size * neg.size)
    return hits, float(auroc)


def exact_test(scores: dict[str, np.ndarray], member: np.ndarray, s: DecisionSettings) -> ExactResult | str:
    """Run the exact FAIL test on one target's scores (module doc), or say why it cannot be made.

    Args:
        scores (dict[str, np.ndarray]): attack -> [N] scores (higher = member; NaN = not scored: a sample unscored
            by any attack is left out).
        member (np.ndarray): [N] membership.
        s (DecisionSettings): the rule's settings.
    Returns:
        ExactResult | str: the reading, or a sentence saying what is missing.
    """
    names = list(scores)
    if not names:
        return "no attack was scored"
    finite = np.logical_and.reduce([np.isfinite(v) for v in scores.values()])
    member = member[finite]
    design = exact_design(int(member.sum()), int((~member).sum()), len(names), s)
    if isinstance(design, str):
        return design
    pick = _split(member, design, s.seed)
    keys = [_choice_key(scores[a][finite][pick], member[pick]) for a in names] if len(names) > 1 else [(0, 0.0)]
    attack = names[max(range(len(names)), key=lambda i: keys[i])]  # ties: the first in order
    x = scores[attack][finite][~pick]
    pos, neg = x[member[~pick]], np.sort(x[~member[~pick]])
    threshold = neg[-design.k] if design.k >= 1 else np.inf
    hits = int((pos > threshold).sum())
    lower, _ = clopper_pearson(hits, pos.size, design.alpha_bound)
    return ExactResult(attack, hits, int((neg > threshold).sum()), lower, design)
