"""Every attack on every quantizer's final checkpoints, each run in turn as the target, with naive,
calibrated and per-sample evaluations (docs/science.md section 4).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from llmaudit import __version__
from llmaudit.analyze.attacks.context import AttackContext
from llmaudit.analyze.attacks.lira import (
    leave_one_out,
    lira_offline,
    lira_statistic,
    normality_check,
    out_reference_counts,
    parse_fpc,
)
from llmaudit.analyze.attacks.matrices import Target, base_quantizer, final_pool, target_matrices
from llmaudit.analyze.attacks.registry import AttackUnavailable
from llmaudit.analyze.attacks.settings import AttackRunSettings
from llmaudit.analyze.attacks.workers import attack_in_workers
from llmaudit.analyze.decision import DecisionSettings, QuantizerEvidence, decide, decision_mode
from llmaudit.analyze.decision.counts import normal_scores
from llmaudit.analyze.decision.decide import decide_one
from llmaudit.analyze.memorization import SEQUENCE_BITS
from llmaudit.analyze.metrics import fpr_key, roc_curve_loglog
from llmaudit.analyze.metrics_pooled import per_sample_tpr, pooled_calibrated, pooled_naive
from llmaudit.common.stats import spearman
from llmaudit.quantize import full_precision_reference
from llmaudit.store.losstable import REFERENCE_RUN, uniform_vocab_mean_evidence

__all__ = ["AttackRunSettings", "final_pool", "leave_one_out", "run_attacks", "spearman_vs_indicator"]


def _reference_name(quantizers: Sequence[str], reference_quantizer: str | None) -> str | None:
    if reference_quantizer is not None:
        if reference_quantizer not in quantizers:
            raise ValueError(f"reference quantizer {reference_quantizer!r} is not in the table ({list(quantizers)}).")
        return reference_quantizer
    return full_precision_reference(quantizers)


HEADLINE_METRICS = ("auroc", "tpr_at_1pct_naive", "tpr_at_1pct_calibrated")


def _headline(entry: dict) -> dict:
    """The numbers compared across quantizers and with r_Q."""
    naive = entry["pooled_naive"]
    calib = entry.get("pooled_calibrated", {})
    key = fpr_key(0.01)
    return {
        "auroc": naive["auroc"],
        "tpr_at_1pct_naive": naive["tpr_at_fpr"].get(key, {}).get("tpr", float("nan")),
        "tpr_at_1pct_calibrated": calib.get("tpr_at_fpr", {}).get(key, {}).get("tpr", float("nan")),
    }


def spearman_vs_indicator(results: Mapping, r_q: Mapping[str, float]) -> dict:
    """Spearman rho (and p-value) across quantizers between r_Q and each attack's headline metrics.

    Higher r_Q means more secure, so the expected sign is NEGATIVE; a correlation needs at least 3 common
    quantizers.

    Args:
        results: the result of `run_attacks`.
        r_q: {quantizer: mean r_Q}.

    Returns:
        {"quantizers": the common quantizers, "expected_sign", "attacks": {attack: {metric: rho, p-value, n}}}.
    """
    per_q = results["quantizers"]
    common = [q for q in per_q if q in r_q and np.isfinite(r_q[q])]
    out: dict = {"quantizers": common, "expected_sign": "negative (higher r_Q = more secure)", "attacks": {}}
    attacks = sorted({a for q in common for a in per_q[q]["attacks"]})
    for attack in attacks:
        out["attacks"][attack] = {}
        qs = [q for q in common if attack in per_q[q]["attacks"]]
        for metric in HEADLINE_METRICS:
            x = [r_q[q] for q in qs]
            y = [per_q[q]["attacks"][attack]["headline"][metric] for q in qs]
            out["attacks"][attack][metric] = spearman(x, y).to_dict("n_quantizers")
    return out


def _score_matrices(ctx: AttackContext, attacks: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, str], dict]:
    """[M, N] membership scores of every attack asked for that can run on this table (registry specs), the reasons
    of those that cannot, and what the reference-based attacks used (base quantizer, matched base, RMIA's a)."""
    matrices: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    for name in attacks:
        try:
            matrices[name] = ctx.scores(name)
        except AttackUnavailable as exc:
            skipped[name] = str(exc)
    used = {
        "base_model_quantizer": ctx.base_q if ctx.base is not None else None,
        "matched_base": ctx.matched is not None,
    }
    return matrices, skipped, used | ctx.info


def _table_warnings(t: Target) -> list[str]:
    """What the table itself makes doubtful (a vocabulary mean that is not under the model's distribution)."""
    rows = t.rows
    if "token_vocab_mean" not in rows.columns or not rows["token_vocab_mean"].notna().all():
        return []
    why = uniform_vocab_mean_evidence(list(rows["token_losses"]), list(rows["token_vocab_mean"]))
    if why is None:
        return []
    warnings.warn(f"Min-K%++: {why}", stacklevel=2)
    return [f"min_k_plus_plus: {why}"]


def _unusable(attack: str, scores: np.ndarray, keep: np.ndarray, n_ref: np.ndarray) -> str | None:
    """Why an attack's scores cannot be evaluated (e.g. LiRA with one out-reference per sample), or None."""
    fin = np.isfinite(scores)
    if fin.any() and 0 < keep[fin].sum() < fin.sum():
        return None
    why = f"no finite scores with both members and non-members ({int(fin.sum())} finite of {scores.size})"
    if attack.startswith("lira"):
        why += f": median {np.median(n_ref):g} out-reference runs per sample, LiRA needs >= 2; train more runs"
    return why


CALIBRATION_NEEDS = (
    "per-sample calibration needs each sample's scores under at least 2 other models where it was OUT "
    "(more fine-tuning runs on overlapping subsets)"
)


ZERO_SPREAD = (
    "no calibrated scores of both members and non-members although samples have >= 2 OUT references: the "
    "attack's score has zero spread across the models where each sample was OUT (a counting score that does not "
    "resolve them), so per-sample calibration cannot standardize it; the pooled naive evaluation still stands"
)


def _calibration_missing(n_ref: np.ndarray) -> str:
    """Why no pooled calibrated evaluation exists: too few OUT references, or (with enough) no spread among them."""
    return ZERO_SPREAD if (np.asarray(n_ref) >= 2).any() else CALIBRATION_NEEDS


def _evaluate(
    attack: str, scores: np.ndarray, keep: np.ndarray, n_ref: np.ndarray, fpc_value: float | None, s: AttackRunSettings
) -> tuple[dict, np.ndarray, np.ndarray | None]:
    """Pooled naive, pooled calibrated and per-sample evaluations of one attack's [M, N] scores; with the calibrated
    scores z [M, N] and the number of references behind each (None: the normal threshold applies to all)."""
    kw = dict(n_boot=s.n_boot, seed=s.seed, confidence=s.confidence)
    # Calibration standardizes each score by that sample's out-scores under the other models
    # (offline LiRA is its own calibration).
    # A sample whose OUT references tie (counting scores: WBC, RMIA) is standardized by the pooled sd.
    z = (
        scores
        if attack == "lira_offline"
        else leave_one_out(lira_offline, scores, keep, fpc_value, zero_spread="pooled")
    )
    n_ref_eff = None if s.lira_variance == "global" and attack == "lira_offline" else n_ref
    fin, zfin = np.isfinite(scores), np.isfinite(z)
    entry = {
        "n_nan_scores": int(np.isnan(scores).sum()),
        "pooled_naive": pooled_naive(scores, keep, s.fprs, **kw),
        "roc_curve": {"pooled_naive": roc_curve_loglog(scores[fin], keep[fin])},
    }
    if zfin.any() and 0 < keep[zfin].sum() < zfin.sum():
        entry["pooled_calibrated"] = pooled_calibrated(z, keep, s.fprs, n_ref_eff, t_cutoff=s.t_cutoff, **kw)
    else:  # one run, or no sample out in two other runs, or no spread: nothing to calibrate against
        entry["not_measured"] = {"pooled_calibrated": _calibration_missing(n_ref)}
    if scores.shape[0] > 1 and (keep.any(0) & (~keep).any(0)).any():
        entry["per_sample"] = per_sample_tpr(scores, keep, s.fprs, **kw)
    else:
        entry.setdefault("not_measured", {})["per_sample"] = (
            "needs every sample as a member of some runs and a non-member of others"
        )
    if zfin.any() and 0 < keep[zfin].sum() < zfin.sum():
        entry["roc_curve"]["pooled_calibrated"] = roc_curve_loglog(z[zfin], keep[zfin])
    entry["headline"] = _headline(entry)
    return entry, z, n_ref_eff


@dataclass
class _EvidenceBuilder:
    """Collects what the release decision reads from each attack of one quantizer (`QuantizerEvidence`): the
    per-sample calibrated scores on the normal scale (calibrated mode) or the raw scores (empirical mode), and the
    loss matrix."""

    quantizer: str
    mode: str
    samples: list[str]
    keep: np.ndarray
    loss: np.ndarray
    scores: dict = field(default_factory=dict)
    unjudged: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict)

    def add(self, attack: str, raw: np.ndarray, z: np.ndarray, entry: dict) -> None:
        self.raw[attack] = raw.astype(np.float32)
        if self.mode == "empirical":
            self.scores[attack] = raw.astype(np.float32)
        elif "pooled_calibrated" in entry:
            self.scores[attack] = z.astype(np.float32)
        else:
            self.unjudged[attack] = entry["not_measured"]["pooled_calibrated"]

    def evidence(self) -> QuantizerEvidence:
        return QuantizerEvidence(
            self.quantizer, self.mode, self.samples, self.keep, self.scores, self.unjudged, self.loss, self.raw
        )


def _evaluate_attacks(
    t: Target,
    matrices: dict[str, np.ndarray],
    skipped: dict[str, str],
    s: AttackRunSettings,
    fpc_value: float | None,
    builder: _EvidenceBuilder | None,
) -> dict:
    """The evaluation of every scored attack in the order asked for (an attack whose scores cannot be evaluated joins
    `skipped` with its reason); what the release decision reads goes to `builder`."""
    n_ref = out_reference_counts(t.keep)
    results: dict = {}
    for attack in (a for a in s.attacks if a in matrices):
        why = _unusable(attack, matrices[attack], t.keep, n_ref)
        if why:
            skipped[attack] = why
            continue
        results[attack], z, n_ref_eff = _evaluate(attack, matrices[attack], t.keep, n_ref, fpc_value, s)
        if builder is not None:
            builder.add(attack, matrices[attack], normal_scores(z, n_ref_eff, s.t_cutoff), results[attack])
    return results


def attack_quantizer(
    df: pd.DataFrame,
    quantizer: str,
    s: AttackRunSettings,
    base_q: str | None = None,
    decision: DecisionSettings | None = None,
) -> tuple[dict, dict, QuantizerEvidence | None]:
    """Every attack on one quantizer's final checkpoints, each run in turn as the target.

    Args:
        df: the loss table (light, with the token lists of this quantizer's final units).
        quantizer: the quantizer attacked.
        s: the attack settings, built once for the whole analysis.
        base_q: the quantizer of the base-model rows that "base" means (`base_quantizer`), or None.
        decision: the release rule's settings; None leaves out what the decision reads.

    Returns:
        (the quantizer's result block, the attack definitions with its FPC, what the release decision reads
        when `decision` settings are given, else None).
    """
    t = target_matrices(df, quantizer)
    pool_size = int(s.n_pool) if s.n_pool is not None else len(t.samples) + t.n_dropped
    train_size = float(s.n_train) if s.n_train is not None else float(t.keep.sum(1).mean())
    fpc_value = parse_fpc(s.fpc, n_train=train_size, n_pool=pool_size)
    definitions = s.definitions(fpc_value)
    matrices, skipped, used = _score_matrices(AttackContext(df, quantizer, t, s, fpc_value, base_q), s.attacks)
    builder = None
    if decision is not None:
        mode = decision_mode(int(t.runs.size), decision.min_runs)
        builder = _EvidenceBuilder(quantizer, mode, list(t.samples), t.keep, t.loss)
    results = _evaluate_attacks(t, matrices, skipped, s, fpc_value, builder)
    for attack in results:
        results[attack] = {"definition": definitions[attack]} | results[attack]
    if builder is not None:
        builder.unjudged |= {a: why for a, why in skipped.items() if a in s.attacks}
    non_lira = [a for a in results if not a.startswith("lira")]
    block = {
        "runs": [int(r) for r in t.runs],
        "final_checkpoints": t.final,
        "n_models": int(t.runs.size),
        "n_samples": len(t.samples),
        "n_samples_dropped": t.n_dropped,
        "n_train": train_size,
        "n_pool": pool_size,
        "fpc": fpc_value,
        **used,
        "warnings": _table_warnings(t),
        "lira_statistic": s.statistic,
        "normality": normality_check(lira_statistic(t.loss, s.statistic), t.keep),
        "attacks": results,
        "skipped": skipped,
        "best_attack": max(non_lira, key=lambda a: results[a]["headline"]["auroc"]) if non_lira else None,
    }
    return block, definitions, None if builder is None else builder.evidence()


QuantizerRows = Callable[[str, str | None], pd.DataFrame]
"""Reads the pool rows, token lists included, that the attacks on a quantizer read (given the quantizer and the base
model's quantizer): `llmaudit.analyze.store_table.StoreTable.rows_of`."""


@dataclass(frozen=True)
class QuantizerJob:
    """What attacking each quantizer reads besides its name.

    Args:
        df: the loss table (a light table, without pool token lists, when `rows_of` is given).
        settings: how the attacks run and are evaluated.
        base_q: the quantizer of the base-model rows that "base" means (`base_quantizer`).
        decision: the release rule's settings; None: no release decision.
        rows_of: reads a quantizer's rows whole when `df` is a light table; None: `df` holds them.
    """

    df: pd.DataFrame
    settings: AttackRunSettings
    base_q: str | None
    decision: DecisionSettings | None
    rows_of: QuantizerRows | None = None

    def attack(self, quantizer: str) -> tuple:
        """`attack_quantizer` on one quantizer, and its own release decision (`decide_one`) with decision settings.

        Args:
            quantizer: the quantizer attacked.

        Returns:
            (its result block, the attack definitions with its FPC, the evidence the decision read or None, its
            own decision or None).
        """
        rows = self.df if self.rows_of is None else self.rows_of(quantizer, self.base_q)
        block, definitions, ev = attack_quantizer(rows, quantizer, self.settings, self.base_q, self.decision)
        return block, definitions, ev, None if ev is None else decide_one(ev, self.decision)


def _add_vs_reference(per_q: dict, reference: str | None) -> None:
    """Each attack's headline minus the reference quantizer's, in place ("vs_reference"); nothing without one."""
    if reference is None:
        return
    for block in per_q.values():
        for attack, entry in block["attacks"].items():
            ref_entry = per_q[reference]["attacks"].get(attack)
            if ref_entry is not None:
                entry["vs_reference"] = {m: entry["headline"][m] - ref_entry["headline"][m] for m in entry["headline"]}


def _attacked_quantizers(df: pd.DataFrame, asked: Sequence[str] | None, rows_of: QuantizerRows | None) -> list[str]:
    """The quantizers asked for (default: every one with pool rows of fine-tuned runs), each checked to have them;
    a light table (pool rows without their token lists) is refused without the `rows_of` that reads them."""
    if rows_of is None and SEQUENCE_BITS in df.columns:
        raise ValueError(
            "a light table (pool rows without their token lists) was given without rows_of: pass "
            "rows_of=StoreTable.rows_of so each quantizer's rows are read whole for its attacks."
        )
    available = sorted(df.loc[(df["split"] == "pool") & (df["run"] != REFERENCE_RUN), "quantizer"].unique())
    quantizers = list(available if asked is None else asked)
    missing = sorted(set(quantizers) - set(available))
    if missing:
        raise ValueError(f"quantizer(s) {missing} have no pool rows of fine-tuned runs; available: {available}.")
    return quantizers


def run_attacks(
    df: pd.DataFrame,
    settings: AttackRunSettings | None = None,
    *,
    quantizers: Sequence[str] | None = None,
    r_q: Mapping[str, float] | None = None,
    reference_quantizer: str | None = None,
    decision: DecisionSettings | None = None,
    processes: int = 1,
    rows_of: QuantizerRows | None = None,
) -> dict:
    """Every attack on a validated loss table, each run in turn as the target (leave-one-out).

    Per quantizer: each run's final checkpoint on split "pool", the samples every run scored (others dropped,
    counted); per attack the pooled naive, pooled calibrated (standardized per sample by the other models'
    out-scores) and per-sample evaluations, with bootstrap intervals over samples (docs/science.md section 4).

    Args:
        df: the loss table.
        settings: how the attacks run and are evaluated (None: `AttackRunSettings()`).
        quantizers: the quantizers attacked (None: every one with pool rows of fine-tuned runs).
        r_q: {quantizer: mean r_Q} to correlate the attacks with; None: no correlation.
        reference_quantizer: the quantizer the others are compared with (None: the full-precision one).
        decision: the release rule's settings; None: no release decision.
        processes: the quantizers are attacked in at most this many worker processes (the same numbers).
        rows_of: with a light table, reads each quantizer's rows whole (`StoreTable.rows_of`).

    Returns:
        The JSON-ready result (`attacks_with_evidence`'s, without the evidence; its release decision dumped as JSON).

    Raises:
        ValueError: a quantizer without pool rows, an unknown reference quantizer, or a light table without
            `rows_of`.
    """
    out = attacks_with_evidence(
        df,
        settings,
        quantizers=quantizers,
        r_q=r_q,
        reference_quantizer=reference_quantizer,
        decision=decision,
        processes=processes,
        rows_of=rows_of,
    )[0]
    return out | {"decision": out["decision"].model_dump(mode="json")} if out.get("decision") is not None else out


def attacks_with_evidence(
    df: pd.DataFrame,
    settings: AttackRunSettings | None = None,
    *,
    quantizers: Sequence[str] | None = None,
    r_q: Mapping[str, float] | None = None,
    reference_quantizer: str | None = None,
    decision: DecisionSettings | None = None,
    processes: int = 1,
    rows_of: QuantizerRows | None = None,
) -> tuple[dict, dict[str, QuantizerEvidence]]:
    """Every attack on a validated loss table (`run_attacks`), with the evidence the release decision read.

    Args:
        df: the loss table (a light table, without pool token lists, with `rows_of`).
        settings: how the attacks run and are evaluated (None: `AttackRunSettings()`).
        quantizers: the quantizers attacked (None: every one with pool rows of fine-tuned runs).
        r_q: {quantizer: mean r_Q} to correlate the attacks with (None: no correlation).
        reference_quantizer: the quantizer the others are compared with (None: the full-precision one).
        decision: the release rule's settings; each quantizer's decision is added as "decision" (None: none).
        processes: worker processes for the quantizers (`attack_in_workers`; the same numbers).
        rows_of: reads a quantizer's rows whole when `df` is a light table (`StoreTable.rows_of`).

    Returns:
        (the result: JSON-ready but its "decision", the typed `ReleaseDecision`; {quantizer: the `QuantizerEvidence`
        the decision read}, empty without `decision`).

    Raises:
        ValueError: a quantizer without pool rows, an unknown reference quantizer, a light table without `rows_of`.
    """
    s = AttackRunSettings() if settings is None else settings
    quantizers = _attacked_quantizers(df, quantizers, rows_of)
    reference = _reference_name(quantizers, reference_quantizer)
    base_q, definitions, per_q, evidence, own = base_quantizer(df, reference), s.definitions(), {}, {}, {}
    attacked = attack_in_workers(QuantizerJob(df, s, base_q, decision, rows_of), quantizers, processes)
    for q, (block, q_definitions, ev, q_own) in zip(quantizers, attacked):
        per_q[q], definitions = block, q_definitions  # every quantizer's definitions, with its own FPC
        if ev is not None:
            evidence[q], own[q] = ev, q_own
    _add_vs_reference(per_q, reference)
    out = {
        "llmaudit_version": __version__,
        "attack_definitions": definitions,
        "settings": s.as_dict(),
        "reference_quantizer": reference,
        "quantizers": per_q,
    }
    out["spearman_vs_r_q"] = spearman_vs_indicator(out, r_q) if r_q else None
    if decision is not None:
        out["decision"] = decide(evidence, reference, decision, own)
    return out, evidence
