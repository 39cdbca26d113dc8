"""The text of a plan, as `llmaudit plan` and `llmaudit submit` print it."""

from __future__ import annotations

from typing import Any

from llmaudit.planning.throughput import processes_note


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def format_plan(plan: dict[str, Any]) -> str:
    """The plan as `llmaudit plan` prints it.

    Args:
        plan: `make_plan`'s result.

    Returns:
        The text, lines joined by newlines.
    """
    w, t, e = plan["workload"], plan["throughput"], plan["estimate"]
    steps = w["steps_per_run"]
    lines = [
        f"plan of {plan['experiment']}: {plan['model']} on {plan['device']}",
        f"  runs            {w['runs']} x {w['members_per_run'][0] if w['members_per_run'] else 0} training samples, "
        f"{len(steps[0]) if steps else 0} checkpoints per run (steps {steps[0] if steps else []})",
        f"  quantizers      {len(w['quantizers'])}: {', '.join(w['quantizers'])}",
        f"  scoring units   {w['units']} ({w['units_per_quantizer']} per quantizer{' + the base model' if w['units'] > w['units_per_quantizer'] * len(w['quantizers']) else ''}); "
        f"GPTQ calibrations {w['gptq_calibrations']}",
        f"  tokens          train {w['train_tokens']:,} ({w['train_padded_tokens']:,} padded); score {w['score_tokens']:,} "
        f"({w['score_padded_tokens']:,} padded, budget {plan['token_budget']}), losses recorded for {w['scored_tokens']:,}",
        f"  utility         KL: {w['divergence_positions']:,} positions compared, {w['reference_tokens']:,} reference-pass tokens; "
        f"generation: {w['generation_units']} units, {w['generation_prompt_tokens']:,} prompt tokens, at most "
        f"{w['generated_tokens_max']:,} new tokens ({w['generation_max_new_tokens']} per answer)",
        f"  disk            adapters {_bytes(w['adapter_bytes'])}, loss tables about {_bytes(w['loss_table_bytes'])}",
        f"  throughput      score {t['score_tokens_per_s']:,.0f} tok/s, train {t['train_tokens_per_s']:,.0f} tok/s, "
        f"{1e3 * t.get('unit_overhead_s', 0.0):.0f} ms per scoring unit beside its arithmetic",
    ]
    for q, s in t["quantize_s"].items():
        lines.append(f"    {q:>12}: {s:.1f} s per quantization, scoring x{t['forward_slowdown'].get(q, 1.0):.2f}")
    lines += [f"    ({k}: {v})" for k, v in t["source"].items()]
    if plan.get("analysis"):
        a = plan["analysis"]
        lines.append(
            f"    (report: the analysis measured on this CPU in {a['measured_in_s']:.0f} s on synthetic tables of "
            f"{a['runs']} runs x {' and '.join(str(r) for r in a['records'])} records, scaled as a + b n; "
            f"{plan['estimate'].get('report_processes', 1)} quantizer(s) at a time, report.processes)"
        )
    lines.append(
        f"  time            finetune {_duration(e['finetune_s'])}, score {_duration(e['score_s'])} (utility columns "
        f"{_duration(e['utility_s'])}), report {_duration(e['report_s'])}; "
        f"total {_duration(e['total_s'])}" + processes_note(e)
    )
    if e["jobs"] > 1:
        lines.append(
            f"  with {e['jobs']} parallel jobs: about {_duration(e['parallel_total_s'])} (each job loads the model once)"
        )
    lines += [f"  assumption      {a}" for a in plan.get("assumptions") or []]
    return "\n".join(lines)
