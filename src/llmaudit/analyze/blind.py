"""The blind baseline (docs/science.md section 9): how well the texts alone, without any model, tell a run's
members from its non-members.

A user's own training and held-out files often differ in distribution (other sources, other dates, other
tasks); then every membership attack "succeeds" by detecting the shift, not leakage [Das2024]. The blind
baseline measures that shift: a text-only classifier (TF-IDF of word 1-2-grams and character 3-5-grams,
fit inside each training fold only, and L2-regularised logistic regression), stratified k-fold
cross-validation, AUROC of the pooled out-of-fold probabilities with a percentile bootstrap interval over
samples. On llmaudit's own pools membership is a random subset per run, so the baseline must sit at 0.5.

Over a store (`blind_baseline_for_pool`) a warning is given when a run's interval lies above 0.5 (below it is no
shift the attacks could exploit: out-of-fold scores of a classifier on texts without signal are biased slightly
below 0.5), and, with several runs, the note that llmaudit's random splits should give about 0.5.

Pure functions: texts and labels in, a JSON-ready dict out; no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import rankdata

from llmaudit.data.records import record_text

CHANCE = 0.5

METHOD = (
    "text-only classifier: TF-IDF (word 1-2-grams + char 3-5-grams, sublinear tf, fit inside each training fold) "
    "+ L2 logistic regression (C=1); stratified k-fold out-of-fold probabilities; AUROC with a percentile "
    "bootstrap interval over samples (each class resampled)"
)

FEATURES = {
    "word": {"analyzer": "word", "ngram_range": [1, 2], "token_pattern": r"(?u)\b\w+\b", "sublinear_tf": True},
    "char": {"analyzer": "char_wb", "ngram_range": [3, 5], "sublinear_tf": True},
}
CLASSIFIER = {"model": "LogisticRegression", "penalty": "l2", "C": 1.0, "solver": "liblinear"}

RANDOM_SPLIT_NOTE = (
    "llmaudit's own pools split membership at random per run, independently of the text, so the blind "
    "baseline must be ~0.5 there; an interval excluding 0.5 points to a bug (membership leaking into the "
    "texts or ids) or, at the 5% level, to chance."
)


def _pipeline(seed: int) -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import FeatureUnion, make_pipeline

    features = FeatureUnion(
        [
            (name, TfidfVectorizer(**{k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}))
            for name, opts in FEATURES.items()
        ]
    )
    classifier = LogisticRegression(C=CLASSIFIER["C"], solver=CLASSIFIER["solver"], max_iter=1000, random_state=seed)
    return make_pipeline(features, classifier)


def _auroc(scores_in: np.ndarray, scores_out: np.ndarray) -> float:
    """P(score_in > score_out) + 0.5 P(equal): the Mann-Whitney form of the AUROC (ties count half)."""
    ranks = rankdata(np.concatenate([scores_in, scores_out]))
    n_in, n_out = scores_in.size, scores_out.size
    return float((ranks[:n_in].sum() - n_in * (n_in + 1) / 2) / (n_in * n_out))


def _result(
    n_in: int, n_out: int, *, folds: int | None, seed: int, n_boot: int, confidence: float, **values: Any
) -> dict[str, Any]:
    out = {
        "auroc": None,
        "ci_low": None,
        "ci_high": None,
        "excludes_chance": None,
        "n_in": n_in,
        "n_out": n_out,
        "folds": folds,
        "seed": seed,
        "n_boot": n_boot,
        "confidence": confidence,
        "chance": CHANCE,
        "method": METHOD,
        "features": FEATURES,
        "classifier": CLASSIFIER,
        "reason": None,
    }
    out.update(values)
    return out


def blind_baseline(
    texts: Sequence[str],
    labels: Sequence[bool] | np.ndarray,
    *,
    folds: int = 5,
    seed: int = 0,
    n_boot: int = 200,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Measure the cross-validated AUROC of a text-only classifier of membership, with a bootstrap interval.

    Fewer folds are used when a class is small (each test fold holds at least 2 of each class).

    Args:
        texts (Sequence[str]): the texts.
        labels (Sequence[bool] | np.ndarray): True = member (training file), one per text.
        folds (int): the most cross-validation folds.
        seed (int): the seed of the folds and the bootstrap.
        n_boot (int): bootstrap resamples.
        confidence (float): the interval's confidence.
    Returns:
        dict[str, Any]: auroc with ci_low, ci_high, excludes_chance, the counts and the method; auroc None and
        `reason` saying why with fewer than 4 of a class or a classifier that cannot be fit.
    Raises:
        ValueError: when texts and labels differ in length.
    """
    labels = np.asarray(labels, dtype=bool).ravel()
    texts = np.asarray([str(t) for t in texts], dtype=object)
    if texts.size != labels.size:
        raise ValueError(f"blind_baseline: {texts.size} texts but {labels.size} labels.")
    n_in, n_out = int(labels.sum()), int((~labels).sum())
    k = min(int(folds), min(n_in, n_out) // 2)
    common = dict(seed=seed, n_boot=n_boot, confidence=confidence)
    if k < 2:
        return _result(
            n_in,
            n_out,
            folds=None,
            reason=(
                f"too few samples: {n_in} member(s) and {n_out} non-member(s); cross-validation needs at least "
                "4 of each (2 of each class in each of 2 folds)"
            ),
            **common,
        )
    try:
        oof = _out_of_fold(texts, labels, k, seed)
    except ValueError as exc:  # e.g. an empty vocabulary: texts without words or 3 characters
        return _result(n_in, n_out, folds=k, reason=f"the classifier could not be fit ({exc})", **common)
    scores_in, scores_out = oof[labels], oof[~labels]
    auroc = _auroc(scores_in, scores_out)
    low, high = _bootstrap_interval(scores_in, scores_out, n_boot=n_boot, confidence=confidence, seed=seed)
    excludes = None if low is None else bool(low > CHANCE or high < CHANCE)
    return _result(n_in, n_out, folds=k, auroc=auroc, ci_low=low, ci_high=high, excludes_chance=excludes, **common)


def _out_of_fold(texts: np.ndarray, labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Out-of-fold member probabilities [n] of the text-only classifier, stratified k-fold (shuffled with `seed`)."""
    from sklearn.model_selection import StratifiedKFold

    oof = np.full(labels.size, np.nan)
    for train_idx, test_idx in StratifiedKFold(k, shuffle=True, random_state=seed).split(texts, labels):
        model = _pipeline(seed).fit(list(texts[train_idx]), labels[train_idx])
        oof[test_idx] = model.predict_proba(list(texts[test_idx]))[:, 1]
    return oof


def _bootstrap_interval(
    scores_in: np.ndarray, scores_out: np.ndarray, *, n_boot: int, confidence: float, seed: int
) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of the AUROC, each class resampled; (None, None) when n_boot = 0."""
    if n_boot <= 0:
        return None, None
    n_in, n_out = scores_in.size, scores_out.size
    rng = np.random.default_rng(seed)
    boots = np.array(
        [
            _auroc(
                scores_in[rng.integers(0, n_in, n_in)],
                scores_out[rng.integers(0, n_out, n_out)],
            )
            for _ in range(n_boot)
        ]
    )
    low, high = (float(v) for v in np.quantile(boots, [(1 - confidence) / 2, (1 + confidence) / 2]))
    return low, high


def blind_baseline_for_pool(
    pool_records: Sequence[dict],
    masks: np.ndarray | Sequence[Sequence[bool]],
    *,
    seed: int = 0,
    n_boot: int = 200,
    folds: int = 5,
    max_per_class: int = 5000,
) -> dict[str, Any]:
    """Measure the blind baseline of every run of a store: its members against its non-members in the pool.

    Args:
        pool_records (Sequence[dict]): the pool's records (`record_text` of each).
        masks (np.ndarray | Sequence[Sequence[bool]]): [runs, pool_size] membership, as `RunStore.membership()`.
        seed (int): the seed of the folds, bootstrap and subsampling.
        n_boot (int): bootstrap resamples.
        folds (int): the most cross-validation folds.
        max_per_class (int): a larger class is subsampled (deterministically) to bound the cost.
    Returns:
        dict[str, Any]: per-run results, their mean, min and max, the runs whose interval excludes 0.5, the
        warning and the note (module docstring).
    Raises:
        ValueError: when the masks do not match the pool.
    """
    masks = np.asarray(masks, dtype=bool)
    if masks.ndim != 2 or masks.shape[1] != len(pool_records):
        raise ValueError(
            f"blind_baseline_for_pool: masks of shape {masks.shape} do not match {len(pool_records)} pool records."
        )
    texts = np.asarray([record_text(r) for r in pool_records], dtype=object)
    per_run = []
    for run, row in enumerate(masks):
        chosen = _cap_per_class(row, max_per_class, np.random.default_rng([seed, run, 13]))
        result = blind_baseline(texts[chosen], row[chosen], folds=folds, seed=seed, n_boot=n_boot)
        per_run.append({"run": run, **result, "subsampled": bool(chosen.size < row.size)})
    measured = [r for r in per_run if r["auroc"] is not None]
    excluding = [r["run"] for r in measured if r["excludes_chance"]]
    mean = float(np.mean([r["auroc"] for r in measured])) if measured else None
    warning = _shift_warning(measured)
    return {
        "runs": int(masks.shape[0]),
        "per_run": per_run,
        "mean_auroc": mean,
        "min_auroc": min((r["auroc"] for r in measured), default=None),
        "max_auroc": max((r["auroc"] for r in measured), default=None),
        "runs_excluding_chance": excluding,
        "chance": CHANCE,
        "method": METHOD,
        "max_per_class": max_per_class,
        "warning": warning,
        "note": RANDOM_SPLIT_NOTE if masks.shape[0] > 1 else None,
        "reason": None if measured else (per_run[0]["reason"] if per_run else "no runs"),
    }


def _shift_warning(measured: list[dict[str, Any]]) -> str | None:
    """The warning of `blind_baseline_for_pool` when some run's interval lies above chance, else None."""
    above = [r for r in measured if r["excludes_chance"] and r["ci_low"] > CHANCE]
    if not above:
        return None
    worst = max(above, key=lambda r: r["auroc"])
    return (
        f"the texts alone tell members from non-members (blind AUROC {worst['auroc']:.3f} "
        f"[{worst['ci_low']:.3f}, {worst['ci_high']:.3f}] for run {worst['run']}; interval above 0.5 in "
        f"{len(above)} of {len(measured)} run(s)): an attack whose AUROC does not clearly exceed it shows "
        "a distribution shift between the files, not leakage (docs/science.md section 9)"
    )


def _cap_per_class(labels: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices keeping at most `cap` samples of each class (a random subset of a larger class)."""
    keep = []
    for value in (True, False):
        idx = np.flatnonzero(labels == value)
        keep.append(idx if idx.size <= cap else rng.choice(idx, cap, replace=False))
    return np.sort(np.concatenate(keep))
