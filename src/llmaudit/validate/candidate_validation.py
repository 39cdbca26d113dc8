"""Validation of the candidate attack-free indicators (docs/science.md section 8).

`llmaudit validate indicators` runs `validate_indicators_command`: every candidate of
`llmaudit.analyze.candidates.CANDIDATES`

(a) on the synthetic protocol (docs/science.md section 5) against the baseline MIS, `synthetic_validation`:
    per data set Spearman over the quantizers between the candidate's mean over runs and the MIS; the mean
    over data sets with its bootstrap spread over runs; rank stability at 5, 10, 15 and 30 runs; and, as
    labelled extra columns, the pooled Spearman over all (data set, quantizer) cells and the share of the
    nested-quantizer pairs ordered as the data-processing inequality demands (DPI pairs);
(b) on any run store that has been reported (results/result.json holds the attacks), `store_validation`:
    Spearman with p-value across quantizers between each candidate (`candidates_from_table` on the store's
    loss tables) and each attack's AUROC; expected sign NEGATIVE (higher = more secure goes with weaker
    attacks); the reference attack ("ref") and offline LiRA ("lira_offline") are the ground truth, LOSS
    is shown beside them (the member-vs-held-out candidates are effect sizes of its score);

and writes one table (indicators.json, indicators.md) with each candidate's `validation_status`.

Part (a) is `llmaudit.validate.candidates_synthetic`, part (b) `llmaudit.validate.candidates_stores`; this
module holds the command, the table and the pass rule, and re-exports both parts' public names.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from llmaudit.analyze.candidates import (
    CANDIDATES,
    CONTROL_FAMILIES,
    ORIENTATION,
)
from llmaudit.common.io import atomic_write_json, atomic_write_text
from llmaudit.config import RecipeError, load_recipe
from llmaudit.store.run_store import RunStore
from llmaudit.validate.candidates_stores import (
    DAMAGE_CONTROL,
    GROUND_TRUTH_ATTACKS,
    PASS_P_VALUE,
    SHOWN_ATTACKS,
    is_store_dir,
    store_validation,
)
from llmaudit.validate.candidates_synthetic import (
    DPI_CHAIN,
    QUICK_OVERRIDES,
    STABILITY_K_RUNS,
    STABILITY_RESAMPLES,
    synthetic_dataset_arrays,
    synthetic_validation,
)
from llmaudit.validate.synthetic.config import load_config

STATUS_K_RUNS = 15
"""The stability column of the summary table."""
PASS_SYNTHETIC_MEAN_SPEARMAN = 0.86
"""Pass rule, synthetic part: mean Spearman against the MIS at least the value the indicator paper reports."""
REAL_MODEL_RECIPES = ("smollm2-135m-cpu", "qwen2.5-0.5b-smolinstruct")
"""The shipped real-model recipes whose run stores (default output directories) are validated by default
when they exist: the 2-core CPU audit of SmolLM2-135M-Instruct and the indicator paper's Qwen2.5 grid."""

# ---- (c) the command, the table and the pass rule ----------------------------------------------------------


def default_stores() -> list[Path]:
    """The run stores of the shipped real-model recipes (`REAL_MODEL_RECIPES`, their default output
    directories relative to the working directory) that exist, as absolute paths; else none."""
    found = []
    for recipe in REAL_MODEL_RECIPES:
        try:
            path = load_recipe(recipe).resolved_output_dir()
        except RecipeError:
            continue  # a recipe this installation does not ship
        if is_store_dir(path):
            found.append(path.resolve())
    return found


def validation_status(name: str, results: Mapping[str, Any]) -> dict[str, Any]:
    """The pass rule of docs/science.md section 8 for candidate `name`, from the results of
    `validate_indicators_command` ({"synthetic": ..., "stores": [...]}).

    passed: synthetic mean Spearman >= 0.86 (full protocol, not quick mode) AND, on the real stores, a
    significantly negative Spearman (p < 0.05) against the AUROC of at least one ground-truth attack with none
    significantly positive. failed: a criterion is measured and not met. not validated: otherwise (a criterion
    could not be measured: no synthetic run, quick mode, no reported store, or the candidate is not computable
    from the stores). Returns {"status", "criteria"}."""
    synth = results.get("synthetic")
    crit_syn: dict[str, Any] = {"rule": f"synthetic mean Spearman vs MIS >= {PASS_SYNTHETIC_MEAN_SPEARMAN}"}
    if not synth or name not in synth.get("candidates", {}):
        crit_syn.update(status="not measured", value=None, why="no synthetic validation")
    elif synth.get("quick"):
        value = synth["candidates"][name]["mean_spearman"]
        crit_syn.update(status="not measured", value=value, why="quick mode (a smoke test) does not count")
    else:
        value = synth["candidates"][name]["mean_spearman"]
        ok = value is not None and math.isfinite(value) and value >= PASS_SYNTHETIC_MEAN_SPEARMAN
        crit_syn.update(status="passed" if ok else "failed", value=value)

    crit_real: dict[str, Any] = {
        "rule": f"Spearman vs the AUROC of {' or '.join(GROUND_TRUTH_ATTACKS)}: at least one significantly "
        f"negative (p < {PASS_P_VALUE}), none significantly positive",
        "evidence": [],
    }
    for st in results.get("stores") or []:
        entry = (st.get("candidates") or {}).get(name)
        if not st.get("reported") or entry is None:
            continue
        for a in GROUND_TRUTH_ATTACKS:
            c = (entry.get("spearman_vs_auroc") or {}).get(a)
            if c and c.get("rho") is not None:
                crit_real["evidence"].append(
                    {"store": st["source"], "attack": a, "rho": c["rho"], "p_value": c["p_value"]}
                )
    ev = crit_real["evidence"]
    if not ev:
        crit_real["status"] = "not measured"
    else:
        neg = any(e["rho"] < 0 and e["p_value"] < PASS_P_VALUE for e in ev)
        pos = any(e["rho"] > 0 and e["p_value"] < PASS_P_VALUE for e in ev)
        crit_real["status"] = "passed" if neg and not pos else "failed"
    states = (crit_syn["status"], crit_real["status"])
    status = "failed" if "failed" in states else "passed" if states == ("passed", "passed") else "not validated"
    if name in CANDIDATES and CANDIDATES[name].family in CONTROL_FAMILIES:
        # a control is measured with the same rule to show what the rule can tell apart; never eligible
        return {"status": "control", "rule_outcome": status, "criteria": {"synthetic": crit_syn, "real": crit_real}}
    return {"status": status, "criteria": {"synthetic": crit_syn, "real": crit_real}}


def _f(x: Any, fmt: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, fmt)


def _table_head(synth: Mapping[str, Any] | None, stores: Sequence[Mapping[str, Any]], k: str) -> list[str]:
    """The column names of indicators.md: the candidate, the synthetic columns, each reported store's columns."""
    head = ["candidate", "family", "version"]
    if synth:
        head += [
            "synthetic mean rho vs MIS (+- boot sd)",
            f"stability at {k} runs",
            "extra: pooled rho (all cells)",
            "extra: DPI pairs right",
        ]
    for i, st in enumerate(stores):
        for a in SHOWN_ATTACKS:
            if a in st["attacks"]:
                gt = "" if a in GROUND_TRUTH_ATTACKS else " (not ground truth)"
                head.append(f"store {i + 1}: rho (p) vs {a} AUROC{gt}")
        for a in GROUND_TRUTH_ATTACKS:
            if a in st["attacks"]:
                head.append(f"extra, store {i + 1}: partial rho (p) vs {a} AUROC given held-out loss")
    head.append("status")
    return head


def _table_preamble(results: Mapping[str, Any], synth: Mapping[str, Any] | None) -> list[str]:
    """The lines of indicators.md above the table: title, orientation, the synthetic protocol, the stores."""
    lines = [
        "# Candidate attack-free indicators (docs/science.md section 8)",
        "",
        f"Orientation: {ORIENTATION} for every candidate. Expected sign: positive against the MIS, negative "
        "against an attack's AUROC.",
        "",
    ]
    if synth:
        cfg = synth["config"]
        lines.append(
            f"Synthetic: {len(synth['datasets'])} data sets x {cfg['n_runs']} runs, {cfg['epochs']} epochs, batch "
            f"{cfg['batch_size']}"
            + (" (QUICK mode: a smoke test, not the protocol)" if synth.get("quick") else "")
            + f"; MIS estimate's own DPI pairs right: {_f(synth['mis_dpi_pairs']['share'], '.2f')}."
        )
    for i, st in enumerate(results.get("stores") or []):
        if st.get("reported"):
            lines.append(
                f"Store {i + 1}: {st['source']} ({len(st['quantizers'])} quantizers, {len(st['runs'])} runs, "
                f"reference {st['reference_quantizer']})."
            )
        else:
            lines.append(f"Store {st['source']}: not used ({st.get('reason')}).")
    return lines


def _synthetic_cells(s: Mapping[str, Any] | None, k: str) -> list[str]:
    """A candidate's synthetic cells of indicators.md ("-" when the candidate was not run)."""
    if s is None:
        return ["-"] * 4
    return [
        f"{_f(s['mean_spearman'], '+.2f')} +- {_f(s['boot_sd'], '.2f')}",
        _f(s["stability"].get(k), ".2f"),
        _f(s["extra_pooled_spearman"]["rho"], "+.2f"),
        _f(s["extra_dpi_pairs"]["share"], ".2f"),
    ]


def _store_cells(e: Mapping[str, Any] | None, st: Mapping[str, Any]) -> list[str]:
    """A candidate's cells of indicators.md for one reported store: rho (p) per shown attack, then the partial
    rho (p) per ground-truth attack; "not computable" or "-" where there is no number."""
    row = []
    for a in SHOWN_ATTACKS:
        if a not in st["attacks"]:
            continue
        corr = (e or {}).get("spearman_vs_auroc", {}).get(a)
        if e is None or not e["computable"]:
            row.append("not computable")
        elif corr is None or corr.get("rho") is None:
            row.append("-")
        else:
            row.append(f"{corr['rho']:+.2f} ({corr['p_value']:.2g})")
    for a in GROUND_TRUTH_ATTACKS:
        if a not in st["attacks"]:
            continue
        part = (e or {}).get("partial_vs_auroc_given_damage", {}).get(a)
        if e is None or not e["computable"]:
            row.append("not computable")
        elif part is None or part.get("rho") is None:
            row.append("-")
        else:
            row.append(f"{part['rho']:+.2f} ({part['p_value']:.2g})")
    return row


def _table_footer() -> list[str]:
    """The lines of indicators.md below the table: the pass rule and what the controls and extras mean."""
    return [
        "",
        f"Pass rule: synthetic mean rho >= {PASS_SYNTHETIC_MEAN_SPEARMAN} (full protocol) AND on a real store a "
        f"significantly negative rho (p < {PASS_P_VALUE}) against the AUROC of "
        + " or ".join(GROUND_TRUTH_ATTACKS)
        + ", none significantly positive. 'not computable': the store lacks the inputs (e.g. training-sample losses "
        "at every checkpoint) or the candidate is a data-free control needing parameters.",
        "",
        "Controls (family 'control ...') go through the same rule and are never eligible: they show what the rule "
        f"can tell apart. The extra partial columns remove the damage control ({DAMAGE_CONTROL}, the mean held-out "
        "loss) from both sides: a quantizer that destroys the model destroys every attack too, so a candidate that "
        "tracks leakage beyond damage keeps a negative partial rho. They are not part of the pre-registered rule "
        "(Student's t p-value, n - 3 degrees of freedom).",
    ]


def markdown_table(results: Mapping[str, Any]) -> str:
    """indicators.md: one row per candidate."""
    synth = results.get("synthetic")
    stores = [s for s in results.get("stores") or [] if s.get("reported")]
    k = str(STATUS_K_RUNS)
    head = _table_head(synth, stores, k)
    lines = _table_preamble(results, synth)
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, c in CANDIDATES.items():
        row = [name, c.family, c.version]
        if synth:
            row += _synthetic_cells(synth["candidates"].get(name), k)
        for st in stores:
            row += _store_cells(st["candidates"].get(name), st)
        state = results.get("status", {}).get(name, {})
        outcome = state.get("rule_outcome")
        row.append(state.get("status", "-") + (f" (the rule alone: {outcome})" if outcome else ""))
        lines.append("| " + " | ".join(row) + " |")
    lines += _table_footer()
    return "\n".join(lines) + "\n"


def validate_indicators_command(
    out_dir: str | Path,
    *,
    synthetic_recipe: str | Path | None = None,
    overrides: Sequence[str] = (),
    stores: Sequence[RunStore | str | Path] | None = None,
    quick: bool = False,
    synthetic: bool = True,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """`llmaudit validate indicators`: every candidate on the synthetic protocol and on run stores.

    out_dir: where indicators.json, indicators.md and the synthetic cache (cache/) go. synthetic_recipe /
    overrides: the synthetic protocol's recipe (default: its defaults, = recipes/synthetic-validation.yaml)
    and key=value overrides. stores: run directories (or RunStores) to validate against their attacks;
    None = `default_stores()` (the real-model recipes' stores that exist); [] = none. quick: 2 data sets
    x 40 runs, 6 epochs (QUICK_OVERRIDES, before `overrides`). synthetic=False skips the synthetic part.
    Returns {"synthetic", "stores", "status", "files"}."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"synthetic": None, "stores": []}
    if synthetic:
        cfg = load_config(synthetic_recipe, [*(QUICK_OVERRIDES if quick else ()), *overrides])
        log(
            f"indicators: synthetic protocol, {len(cfg.k_modes) * len(cfg.sigmas)} data sets x {cfg.n_runs} runs, "
            f"{len(CANDIDATES)} candidates -> {out}"
        )
        results["synthetic"] = synthetic_validation(cfg, cache_dir=out / "cache", quick=quick, log=log)
    for st in default_stores() if stores is None else stores:
        log(f"indicators: store {st.root if isinstance(st, RunStore) else st}")
        results["stores"].append(store_validation(st))
    results["status"] = {n: validation_status(n, results) for n in CANDIDATES}
    command = " ".join(
        ["llmaudit validate indicators", "--out", str(out)]
        + [f"--store {s['source']}" for s in results["stores"]]
        + (["--quick"] if quick else [])
        + (["--no-synthetic"] if not synthetic else [])
        + list(overrides)
    )
    results["files"] = _write_validation(out, results, command)
    return results


def _write_validation(out: Path, results: dict[str, Any], command: str) -> dict[str, str]:
    """indicators.json, indicators.md and registry.json (the validation registry, with the command that made it)."""
    return {
        "json": str(atomic_write_json(out / "indicators.json", results)),
        "markdown": str(atomic_write_text(out / "indicators.md", markdown_table(results))),
        "registry": str(atomic_write_json(out / "registry.json", registry_from_results(results, command=command))),
    }


def beyond_damage(name: str, results: Mapping[str, Any]) -> dict[str, Any]:
    """Whether candidate `name` tracks the ground-truth attacks beyond the damage control on the real stores:
    "yes" when some partial Spearman (damage partialled out) is significantly negative and none significantly
    positive, "no" when they are measured and none is significantly negative, "not measured" otherwise."""
    ev = []
    for st in results.get("stores") or []:
        entry = (st.get("candidates") or {}).get(name) or {}
        if not st.get("reported") or not entry.get("computable"):
            continue
        for a, c in (entry.get("partial_vs_auroc_given_damage") or {}).items():
            if c.get("rho") is not None:
                ev.append({"store": st["source"], "attack": a, "rho": c["rho"], "p_value": c["p_value"]})
    if not ev:
        return {"answer": "not measured", "evidence": ev}
    neg = any(e["rho"] < 0 and e["p_value"] < PASS_P_VALUE for e in ev)
    pos = any(e["rho"] > 0 and e["p_value"] < PASS_P_VALUE for e in ev)
    return {"answer": "yes" if neg and not pos else "no", "evidence": ev}


def registry_from_results(
    results: Mapping[str, Any], *, measured: str | None = None, command: str | None = None
) -> dict[str, Any]:
    """The registry llmaudit ships (`llmaudit/analyze/indicator_validation.json`, read by every report) from
    the results of a full `validate_indicators_command`: per candidate its status and the numbers behind it,
    and whether it tracks the attacks beyond damage (an extra, outside the pass rule)."""
    synth = results.get("synthetic") or {}
    cfg = synth.get("config") or {}
    out: dict[str, Any] = {
        "about": "Validation status of every candidate attack-free indicator (docs/science.md section 8), written "
        "by `llmaudit validate indicators` (file registry.json of its output directory). A report labels each "
        "indicator with its status; only a 'passed' indicator may drive a checklist criterion.",
        "measured": measured or time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "synthetic_protocol": (
            None
            if not synth
            else f"{len(synth.get('datasets', []))} data sets x {cfg.get('n_runs')} runs"
            + (" (QUICK mode: does not count)" if synth.get("quick") else "")
        ),
        "real_stores": [
            {"source": st["source"], "quantizers": st["quantizers"], "runs": st["runs"]}
            for st in results.get("stores") or []
            if st.get("reported")
        ],
        "candidates": {},
    }
    for name, c in CANDIDATES.items():
        state = (results.get("status") or {}).get(name) or validation_status(name, results)
        s = (synth.get("candidates") or {}).get(name)
        real = dict(state["criteria"]["real"])
        out["candidates"][name] = {
            "status": state["status"],
            **({"rule_outcome": state["rule_outcome"]} if "rule_outcome" in state else {}),
            "version": c.version,
            "family": c.family,
            "synthetic": None
            if s is None
            else {
                "mean_spearman": s["mean_spearman"],
                "boot_sd": s["boot_sd"],
                f"stability_{STATUS_K_RUNS}": s["stability"].get(str(STATUS_K_RUNS)),
                "quick": bool(synth.get("quick")),
            },
            "real": real,
            "beyond_damage": beyond_damage(name, results),
        }
    return out


__all__ = [
    "DAMAGE_CONTROL",
    "DPI_CHAIN",
    "GROUND_TRUTH_ATTACKS",
    "PASS_P_VALUE",
    "PASS_SYNTHETIC_MEAN_SPEARMAN",
    "QUICK_OVERRIDES",
    "REAL_MODEL_RECIPES",
    "SHOWN_ATTACKS",
    "STABILITY_K_RUNS",
    "STABILITY_RESAMPLES",
    "STATUS_K_RUNS",
    "beyond_damage",
    "default_stores",
    "markdown_table",
    "registry_from_results",
    "store_validation",
    "synthetic_dataset_arrays",
    "synthetic_validation",
    "validate_indicators_command",
    "validation_status",
]
