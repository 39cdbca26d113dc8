"""Markdown rendering of a memorization result (`llmaudit memorization`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llmaudit.common.formatting import fmt_sig


def _bits(value: Any) -> str:
    return fmt_sig(value, missing="–")


def _fmt_interval(stat: Mapping[str, Any]) -> str:
    if stat.get("mean") is None:
        return "–"
    text = _bits(stat["mean"])
    if stat.get("low") is not None:
        text += f" [{fmt_sig(stat['low'], missing='–')}, {fmt_sig(stat['high'], missing='–')}]"
    return text


def _summary_lines(result: Mapping[str, Any], h: str) -> list[str]:
    """The heading, what the numbers mean, and the table with one row per quantizer (mean over runs [interval])."""
    ref = result["reference"]
    lines = [
        f"{h} Memorization in bits",
        "",
        f"Unintended memorization: {result['definition']} Reference: "
        f"{'the base model before fine-tuning' if ref['kind'] == 'base' else 'a named model'} "
        f"(run {ref['run']}, quantizer `{ref['quantizer']}`, checkpoint {ref['checkpoint']}). Targets: "
        "the final checkpoint of every run. Members are the run's training samples; non-members are "
        "pool samples it did not train on plus validation samples. Values are means over runs; "
        f"brackets: {result['interval']}. The excess is the members' total minus what as many "
        "non-members receive, i.e. the memorization attributable to training.",
        "",
        "| quantizer | runs | members: mean mem_U (bits) | non-members: mean mem_U (bits) | "
        "difference (bits/sample) | members: total (bits) | excess over non-members (bits) | "
        "member bits / adapter param | member bits / model param |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for quantizer, q in result["per_quantizer"].items():
        lines.append(
            f"| `{quantizer}` | {len(q['runs'])} | {_fmt_interval(q['member_mean_bits'])} | "
            f"{_fmt_interval(q['nonmember_mean_bits'])} | {_fmt_interval(q['mean_difference_bits'])} | "
            f"{_fmt_interval(q['member_total_bits'])} | {_fmt_interval(q['excess_member_bits'])} | "
            f"{_fmt_interval(q['member_bits_per_adapter_param'])} | "
            f"{_fmt_interval(q['member_bits_per_model_param'])} |"
        )
    return lines


def _per_run_lines(result: Mapping[str, Any], h: str) -> list[str]:
    """One table per quantizer with a row per run."""
    lines: list[str] = []
    for quantizer in result["per_quantizer"]:
        lines += [
            "",
            f"{h}# `{quantizer}` per run",
            "",
            "| run | checkpoint | members | non-members | members: total (bits) | members: mean | "
            "non-members: mean | excess (bits) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in (r for r in result["per_run"] if r["quantizer"] == quantizer):
            lines.append(
                f"| {r['run']} | {r['checkpoint']} | {r['n_members']} | {r['n_nonmembers']} | "
                f"{fmt_sig(r['member_total_bits'], missing='–')} | {fmt_sig(r['member_mean_bits'], missing='–')} | "
                f"{fmt_sig(r['nonmember_mean_bits'], missing='–')} | {fmt_sig(r['excess_member_bits'], missing='–')} |"
            )
    return lines


def _capacity_lines(cap: Mapping[str, Any], h: str) -> list[str]:
    """The capacity view: per-run information vs capacity, the capacities, and the extrapolation if any."""
    lines = [
        "",
        f"{h}# Membership vs capacity",
        "",
        "| run | member samples | member tokens | training-set information H(x given ref) (bits) | "
        "model capacity / information | adapter capacity / information |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in cap["per_run"]:
        lines.append(
            f"| {r['run']} | {r['n_member_samples']} | {r['n_member_tokens']} | "
            f"{fmt_sig(r['member_information_bits'], missing='–')} | {fmt_sig(r['model_capacity_over_information'], missing='–')} | "
            f"{fmt_sig(r['adapter_capacity_over_information'], missing='–')} |"
        )
    lines += [
        "",
        f"Model capacity: {fmt_sig(cap['model_capacity_bits'], missing='–')} bits; adapter capacity: "
        f"{fmt_sig(cap['adapter_capacity_bits'], missing='–')} bits. {cap['note']}",
    ]
    if "extrapolation" in cap:
        ex = cap["extrapolation"]
        preds = ", ".join(f"run {p['run']}: {p['predicted_membership_f1']:.3f}" for p in ex["per_run"])
        lines += [
            "",
            f"**Extrapolation (not a measurement).** {ex['formula']} with constants {ex['constants']}, "
            f"{ex['capacity_source']} capacity, dataset size in {ex['dataset_size_unit']}: predicted "
            f"membership F1 {preds}. {ex['warning']}",
        ]
    return lines


def markdown_section(result: Mapping[str, Any], *, heading_level: int = 2) -> str:
    """The memorization command's Markdown: a summary table with one row per quantizer (mean over runs [95%
    interval]), a per-run table for each quantizer, and the capacity view.

    Args:
        result: the memorization result (`llmaudit.analyze.memorization`).
        heading_level: the level of the section's headings (2 writes "##").

    Returns:
        The Markdown text, ending in a newline.
    """
    h = "#" * heading_level
    lines = _summary_lines(result, h) + _per_run_lines(result, h) + _capacity_lines(result["capacity"], h)
    if result.get("notes"):
        lines += ["", *(f"- Note: {n}" for n in result["notes"])]
    return "\n".join(lines) + "\n"
