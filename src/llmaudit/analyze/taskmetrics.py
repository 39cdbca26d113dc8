"""Task metrics of the greedy answers the scorer generated (column `generated`), as the SMolInstruct / LlaSMol
line of work scores its tasks; docs/science.md section 11.

Each generation-subset record falls in one family by what its answer is:
- smiles: SMolInstruct's tasks whose answer is a molecule (molecule_generation, forward_synthesis,
  retrosynthesis, name_conversion-i2s) and any record whose output is wrapped in <SMILES> ... </SMILES> (a user's
  own data). The answer is the text between the output's core tags when the record has them (LlaSMol's
  extraction), else the whole answer. exact match = RDKit canonical (isomeric) SMILES equal to the reference's;
  validity = RDKit parses a non-empty answer; Tanimoto = Morgan count fingerprints of radius 2 (RDKit's
  GetMorganFingerprint, as LlaSMol and MolT5 compute it), averaged over the VALID answers only, LlaSMol's
  convention (validity beside it says how many there are). Needs RDKit (`pip install 'llmaudit[chem]'`).
- caption: molecule_captioning: corpus BLEU-2 and BLEU-4 (sacrebleu, its standard 13a tokenization, exponential
  smoothing; on a 0-1 scale) and ROUGE-L (Google's rouge-score, F-measure, its default tokenizer, no stemming),
  mean over records. LlaSMol tokenizes BLEU with SciBERT's WordPiece, a hub download; 13a is the reproducible
  standard, so absolute BLEU values differ from theirs while the ranking of quantizers is what matters here.
  METEOR is left out: nltk's needs the WordNet corpus downloaded. Needs `pip install 'llmaudit[text]'`.
- text: anything else (a user's own records without SMILES): exact match of the whitespace-normalised answer
  and ROUGE-L.
Empty answers count (exact match 0, invalid, BLEU and ROUGE against nothing); LlaSMol drops them from BLEU/ROUGE,
which would reward a model that answers nothing.

Per run (final checkpoint, the same subset for every run and quantizer), one value per metric; per quantizer the
mean over runs with a 95% bootstrap interval over runs, and the drop below the reference quantizer
(reference - quantizer, paired by run) with its interval.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from llmaudit.common.stats import bootstrap_mean_interval
from llmaudit.store.losstable import REFERENCE_RUN

SMILES_TASKS = ("molecule_generation", "forward_synthesis", "retrosynthesis", "name_conversion-i2s")
CAPTION_TASKS = ("molecule_captioning",)

TASK_METRICS: dict[str, tuple[str, str]] = {
    "smiles_exact_match": ("smiles", "share of answers whose canonical SMILES equals the reference's"),
    "smiles_validity": ("smiles", "share of answers RDKit parses"),
    "smiles_tanimoto": ("smiles", "Morgan (radius 2, counts) Tanimoto similarity to the reference, valid answers"),
    "caption_bleu2": ("caption", "corpus BLEU-2 (sacrebleu 13a), 0-1"),
    "caption_bleu4": ("caption", "corpus BLEU-4 (sacrebleu 13a), 0-1"),
    "caption_rouge_l": ("caption", "ROUGE-L F-measure (rouge-score), mean over answers"),
    "text_exact_match": ("text", "share of answers equal to the reference (whitespace normalised)"),
    "text_rouge_l": ("text", "ROUGE-L F-measure (rouge-score), mean over answers"),
}
"""Every task metric (higher is better for all): (family, what it is)."""

INSTALL_HINTS = {"rdkit": "pip install 'llmaudit[chem]'", "text": "pip install 'llmaudit[text]'"}


@functools.cache
def _available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing_library(metric: str) -> str | None:
    """Say why a task metric cannot be computed here.

    Args:
        metric (str): a key of TASK_METRICS.
    Returns:
        str | None: the missing library with its install hint, or None.
    """
    family = TASK_METRICS[metric][0]
    if family == "smiles" and not _available("rdkit"):
        return f"RDKit is not installed ({INSTALL_HINTS['rdkit']})"
    needs_text = metric.startswith("caption_") or metric == "text_rouge_l"
    if needs_text and not (_available("sacrebleu") and _available("rouge_score")):
        return f"sacrebleu and rouge-score are not installed ({INSTALL_HINTS['text']})"
    return None


def task_family(rec: dict) -> str:
    """Classify a record by what its answer is: smiles, caption or text (module docstring).

    Args:
        rec (dict): the record (task, output, output_core_tag_left).
    Returns:
        str: "smiles", "caption" or "text".
    """
    task = str(rec.get("task") or "")
    if (
        task in SMILES_TASKS
        or "<SMILES>" in str(rec.get("output_core_tag_left") or "")
        or "<SMILES>" in str(rec.get("output") or "")
    ):
        return "smiles"
    return "caption" if task in CAPTION_TASKS else "text"


def extract_answer(text: str, rec: dict) -> str:
    """Extract the answer from a generated text.

    Args:
        text (str): the generated text.
        rec (dict): its record; its output's core tags (e.g. <SMILES> ... </SMILES>) delimit the answer.
    Returns:
        str: the text inside the core tags when the record has them and the text contains the left one, else the
        whole text; stripped.
    """
    left = str(rec.get("output_core_tag_left") or "")
    right = str(rec.get("output_core_tag_right") or "")
    if not left and "<SMILES>" in str(rec.get("output") or ""):
        left, right = "<SMILES>", "</SMILES>"
    if left and left in text:
        text = text.split(left, 1)[1]
        if right and right in text:
            text = text.split(right, 1)[0]
    return text.strip()


def reference_answer(rec: dict) -> str:
    """Read a record's reference answer the way an answer is read (its core tags removed).

    Args:
        rec (dict): the record.
    Returns:
        str: the reference answer.
    """
    return extract_answer(str(rec.get("output") or ""), rec)


def canonical_smiles(smiles: str) -> str | None:
    """Canonicalise a SMILES string with RDKit (isomeric; RDKit's log silenced).

    Args:
        smiles (str): the SMILES; spaces are removed.
    Returns:
        str | None: the canonical SMILES, or None for an empty or unparsable string.
    """
    from rdkit import Chem, rdBase

    text = smiles.replace(" ", "")
    if not text:
        return None
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(text)
    return None if mol is None else Chem.MolToSmiles(mol)


def morgan_tanimoto(smiles_a: str, smiles_b: str) -> float:
    """Compute the Tanimoto similarity of the radius-2 Morgan count fingerprints of two valid SMILES.

    Args:
        smiles_a (str): the first SMILES.
        smiles_b (str): the second SMILES.
    Returns:
        float: the similarity, in [0, 1].
    """
    from rdkit import Chem, DataStructs, rdBase
    from rdkit.Chem import rdFingerprintGenerator

    generator = rdFingerprintGenerator.GetMorganGenerator(radius=2)
    with rdBase.BlockLogs():
        fps = [generator.GetSparseCountFingerprint(Chem.MolFromSmiles(s)) for s in (smiles_a, smiles_b)]
    return float(DataStructs.TanimotoSimilarity(*fps))


def smiles_metrics(answers: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Compute exact match, validity and Tanimoto of SMILES answers against their references.

    References RDKit cannot parse are left out (counted); Tanimoto is over the valid answers only.

    Args:
        answers (Sequence[str]): the answers [n].
        references (Sequence[str]): their reference answers [n].
    Returns:
        dict[str, float]: smiles_exact_match, smiles_validity, smiles_tanimoto (NaN when no answer is valid), n,
        n_unparsable_references (all NaN and n = 0 when no reference parses).
    """
    pairs = [(canonical_smiles(a), canonical_smiles(r)) for a, r in zip(answers, references)]
    kept = [(a, r) for a, r in pairs if r is not None]
    if not kept:
        return {"smiles_exact_match": math.nan, "smiles_validity": math.nan, "smiles_tanimoto": math.nan, "n": 0}
    valid = [(a, r) for a, r in kept if a is not None]
    return {
        "smiles_exact_match": sum(a == r for a, r in kept) / len(kept),
        "smiles_validity": len(valid) / len(kept),
        "smiles_tanimoto": float(np.mean([morgan_tanimoto(a, r) for a, r in valid])) if valid else math.nan,
        "n": len(kept),
        "n_unparsable_references": len(pairs) - len(kept),
    }


def corpus_bleu(answers: Sequence[str], references: Sequence[str], order: int) -> float:
    """Compute sacrebleu's corpus BLEU with n-grams up to `order` (13a tokenization, exponential smoothing).

    Args:
        answers (Sequence[str]): the answers [n].
        references (Sequence[str]): their reference answers [n].
        order (int): the largest n-gram order (2 or 4).
    Returns:
        float: BLEU on a 0-1 scale.
    """
    from sacrebleu.metrics import BLEU

    return BLEU(max_ngram_order=order).corpus_score(list(answers), [list(references)]).score / 100.0


def rouge_l(answers: Sequence[str], references: Sequence[str]) -> float:
    """Compute the mean ROUGE-L F-measure (rouge-score's LCS, default tokenizer, no stemming).

    Args:
        answers (Sequence[str]): the answers [n].
        references (Sequence[str]): their reference answers [n].
    Returns:
        float: the mean F-measure.
    """
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return float(np.mean([scorer.score(r, a)["rougeL"].fmeasure for a, r in zip(answers, references)]))


def normalised_match(answers: Sequence[str], references: Sequence[str]) -> float:
    """Compute the share of answers equal to their reference after collapsing whitespace.

    Args:
        answers (Sequence[str]): the answers [n].
        references (Sequence[str]): their reference answers [n].
    Returns:
        float: the share.
    """

    def norm(s: str) -> str:
        return re.sub(r"\s+", " ", s).strip()

    return float(np.mean([norm(a) == norm(r) for a, r in zip(answers, references)]))


def family_metrics(family: str, answers: list[str], references: list[str]) -> dict[str, float]:
    """Compute every metric of one family on one run's answers (those whose library is installed).

    Args:
        family (str): "smiles", "caption" or "text".
        answers (list[str]): the answers.
        references (list[str]): their reference answers.
    Returns:
        dict[str, float]: metric -> value.
    """
    names = [m for m, (f, _) in TASK_METRICS.items() if f == family and missing_library(m) is None]
    out: dict[str, float] = {}
    if family == "smiles" and names:
        out.update({k: v for k, v in smiles_metrics(answers, references).items() if k in names})
    for name in names:
        if name in ("caption_bleu2", "caption_bleu4"):
            out[name] = corpus_bleu(answers, references, 2 if name.endswith("2") else 4)
        elif name.endswith("rouge_l"):
            out[name] = rouge_l(answers, references)
        elif name == "text_exact_match":
            out[name] = normalised_match(answers, references)
    return out


def _final_generated(val: pd.DataFrame, quantizer: str) -> dict[int, dict[str, str]]:
    """{run: {sample_id: generated answer}} of a quantizer's final checkpoints (runs whose final unit has none: {})."""
    out = {}
    for run, rows in val[val["quantizer"] == quantizer].groupby("run"):
        final = rows[rows["checkpoint"] == rows["checkpoint"].max()]
        texts = final["generated"] if "generated" in final.columns else pd.Series(dtype=object)
        out[int(run)] = {s: t for s, t in zip(final["sample_id"], texts) if isinstance(t, str)}
    return out


def _run_values(generated: dict[str, str], records: dict[str, dict]) -> dict[str, float]:
    by_family: dict[str, tuple[list[str], list[str]]] = {}
    for sample_id, text in sorted(generated.items()):
        rec = records[sample_id]
        answers, refs = by_family.setdefault(task_family(rec), ([], []))
        answers.append(extract_answer(text, rec))
        refs.append(reference_answer(rec))
    out: dict[str, float] = {}
    for family, (answers, refs) in by_family.items():
        out.update(family_metrics(family, answers, refs))
    return out


def _summary(values: np.ndarray, *, n_boot: int, seed: int) -> dict[str, Any]:
    finite = values[np.isfinite(values)]
    low, high = bootstrap_mean_interval(finite, n_boot=n_boot, seed=seed)
    return {"value": float(finite.mean()) if finite.size else math.nan, "ci": [low, high], "n_runs": int(finite.size)}


def _consistent_subsets(per_q: dict[str, dict[int, dict[str, str]]]) -> str | None:
    """Why the quantizers' answers cannot be compared (different subsets or runs), or None."""
    subsets = {frozenset(g) for runs in per_q.values() for g in runs.values()}
    if len(subsets) > 1 or not subsets or not next(iter(subsets)):
        return (
            "the final units were generated on different subsets, or some without generation (scored by an earlier "
            "llmaudit or with other settings); `llmaudit score RUN_DIR --refresh-utility` regenerates them"
        )
    return None


def task_metrics_from_table(
    df: pd.DataFrame,
    records: list[dict],
    quantizers: list[str],
    reference: str,
    *,
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure every task metric per quantizer, with intervals and the drop from the reference.

    Args:
        df (pd.DataFrame): the loss table (its `generated` column).
        records (list[dict]): the validation records (their reference answers).
        quantizers (list[str]): the quantizers to measure.
        reference (str): the reference quantizer.
        n_boot (int): bootstrap resamples over runs.
        seed (int): the resampling seed.
    Returns:
        dict[str, Any]: per quantizer and metric the mean over runs, interval, per-run values and drop vs the
        reference; for every metric not measured, why (a missing library, missing or mismatched generations).
    """
    val = df[(df["split"] == "val") & (df["run"] != REFERENCE_RUN)]
    per_q = {q: _final_generated(val, q) for q in quantizers}
    if "generated" not in val.columns or not any(g for runs in per_q.values() for g in runs.values()):
        return {
            "measured": False,
            "reason": "no answers were generated (score.generation_samples = 0, or an earlier llmaudit)",
        }
    why = _consistent_subsets(per_q)
    if why:
        return {"measured": False, "reason": why}
    by_id = {str(r["sample_id"]): r for r in records}
    values = {q: {run: _run_values(g, by_id) for run, g in sorted(runs.items())} for q, runs in per_q.items()}
    families = {task_family(by_id[s]) for s in next(iter(next(iter(per_q.values())).values()))}
    metrics = [m for m, (f, _) in TASK_METRICS.items() if f in families]
    out: dict[str, Any] = {
        "measured": True,
        "metrics": {},
        "not_measured": {},
        "per_quantizer": {q: {} for q in quantizers},
    }
    for m in metrics:
        if missing_library(m):
            out["not_measured"][m] = missing_library(m)
            continue
        out["metrics"][m] = TASK_METRICS[m][1]
        ref_runs = values.get(reference, {})
        for q in quantizers:
            runs = sorted(values[q])
            per_run = np.array([values[q][r].get(m, math.nan) for r in runs], dtype=np.float64)
            entry = _summary(per_run, n_boot=n_boot, seed=seed) | {"per_run": per_run.tolist()}
            if set(runs) <= set(ref_runs):
                drop = np.array([ref_runs[r].get(m, math.nan) for r in runs]) - per_run
                entry["drop_vs_reference"] = _summary(drop, n_boot=n_boot, seed=seed)
            out["per_quantizer"][q][m] = entry
    out["n_samples"] = len(next(iter(next(iter(per_q.values())).values())))
    return out
