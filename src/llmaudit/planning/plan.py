"""`llmaudit plan`: the price of an audit before it runs.

The workload is counted exactly as the stages will do it, from the same code: the data draw
(`draw_experiment`), each run's checkpoint steps (`checkpoint_steps`) and batches (`epoch_batches`),
the scoring grid (`plan_units`: validation samples at every checkpoint, the pool at each run's final
one, the base model once) and the scorer's batches (`length_sorted_batches` under the token budget).
A test checks the unit and token counts against what `llmaudit score` then records in its work log.

Time is estimated from throughput (`planning/throughput.py`):
- on this machine (device cpu, or cuda when one is visible): measured by a few-second calibration on a
  model of the recipe's shape (random weights, its real vocabulary): scoring tokens/s with the scoring
  engine on the recipe's own token lengths, LoRA training tokens/s, each quantizer's time on a 2-layer
  slice of the model, scaled to the full depth, and a unit's bookkeeping (its claim, marker, loss table, work-log
  line and memory release: `throughput.unit_overhead_s`, paid by every unit);
- on a named GPU (h100, h200, a100, l40s, a6000): the published dense bf16 peak times an efficiency
  (scoring 40%: the goal `benchmarks/gpu_check.py` checks, not yet measured on a GPU; LoRA training 30%:
  an assumption), with the per-layer quantization times in each quantizer class's `gpu_seconds_per_layer` (assumptions).
The report stage (the analysis) runs on a CPU whatever the device: its cost is measured on this machine's
CPU in seconds, on synthetic loss tables at the recipe's runs and attacks (`llmaudit.analyze.cost`), and scaled
to the recipe's pool records, quantizers and resamples.
Every assumption is printed with the plan and written to its JSON.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from llmaudit.analyze.attacks.registry import resolve_attacks
from llmaudit.analyze.cost import AnalysisCost, analysis_seconds, measure_analysis_cost, report_rest_seconds
from llmaudit.common.errors import UserError
from llmaudit.common.runtime import SHORT_DTYPE_NAMES, available_cores, choose_compute_dtype, pick_device
from llmaudit.config import ExperimentConfig
from llmaudit.data.tokenize import Example, tokenize_records
from llmaudit.finetune.experiment import Draw, draw_experiment
from llmaudit.finetune.runs import checkpoint_steps
from llmaudit.models.training import epoch_batches
from llmaudit.planning.arguments import GPU_BF16_PEAK, check_device
from llmaudit.planning.plan_text import format_plan as format_plan
from llmaudit.planning.throughput import (
    Throughput,
    count_params,
    local_parallelism,
    measure_throughput,
    model_config,
    named_gpu_throughput,
    stage_threads,
    standin_draw,
    with_lora,
)
from llmaudit.quantize import get_quantizer, quantizer_class
from llmaudit.score.engine import length_sorted_batches
from llmaudit.score.generate import GENERATION_TOKEN_BUDGET, plan_generation
from llmaudit.score.stage import is_identity, token_budget
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import grid_units

REPORT_OVERHEAD_S = 11.0
"""Report seconds that the measured terms do not price (the report command's imports, the store's verification, the
r_Q indicator, extraction and epsilon blocks, the plots and the report files): a constant of the estimate,
calibrated on the CPU demo's report on 2 cores (docs/science.md, "What the report stage costs")."""


@functools.lru_cache(maxsize=8)
def _analysis_cost(attacks: tuple[str, ...], runs: int) -> AnalysisCost:
    """The analysis's cost on this CPU for these attacks at this number of runs (`analyze.cost`), once per
    process: `submit` and `plan` price the same recipe alike."""
    return measure_analysis_cost(attacks, runs=runs)


@dataclass
class Workload:
    """What the audit will do, counted exactly."""

    runs: int
    members_per_run: list[int]
    steps_per_run: list[list[int]]
    quantizers: list[str]
    units: int
    units_per_quantizer: int
    gptq_calibrations: int
    train_tokens: int
    """Real (unpadded) tokens processed by training, all runs and epochs."""
    train_padded_tokens: int
    score_tokens: int
    """Tokens run through the model by the scorer (prompt and response), all units."""
    score_padded_tokens: int
    scored_tokens: int
    """Tokens whose loss is recorded (responses by default), all units."""
    unit_tokens: dict[str, int] = field(default_factory=dict)
    """{"val": tokens of one validation pass, "pool": tokens of one pool pass}."""
    reference_tokens: int = 0
    """Extra forward tokens of the KL reference: one validation pass of the unquantized checkpoint per final
    checkpoint when the first quantizer is not the identity (one scoring process; each further process that
    scores a checkpoint's units may repeat it once)."""
    divergence_positions: int = 0
    """Validation positions compared with the reference (two vocabulary passes each), all final units."""
    generation_units: int = 0
    generation_prompt_tokens: int = 0
    """Prompt tokens the generation prefills, all final units."""
    generation_max_new_tokens: int = 0
    generated_tokens_max: int = 0
    """At most this many generated tokens (every answer running to max_new_tokens)."""
    generation_batches_per_unit: int = 0
    adapter_bytes: int = 0
    loss_table_bytes: int = 0
    model_parameters: int = 0


def _lengths(examples: list[Example]) -> list[int]:
    return [len(e.input_ids) for e in examples]


def _padded(lengths: list[int], budget: int) -> int:
    return sum(len(b) * max(lengths[i] for i in b) for b in length_sorted_batches(lengths, budget))


def _train_counts(cfg: ExperimentConfig, members: list[Example], run: int) -> tuple[int, int]:
    """(real, padded) tokens of one run's training, batch by batch in the run's own order."""
    seed = int(np.random.default_rng([cfg.train.seed, run, 9]).integers(2**31))
    lengths = _lengths(members)
    real = padded = 0
    for epoch in range(cfg.train.epochs):
        for batch in epoch_batches(len(members), cfg.train.batch_size, seed, epoch):
            widths = [lengths[i] for i in batch]
            real += sum(widths)
            padded += len(widths) * max(widths)
    return real, padded


def gptq_calibrations(cfg: ExperimentConfig, units: list, *, device: str = "cpu") -> int:
    """The GPTQ calibration passes the score stage runs on a device.

    One per GPTQ unit in GPTQ's sequential convention (each bit width calibrates on its own partly quantized model);
    one per checkpoint and calibration key for the quantizers whose Hessians are shared (`calibration: shared`,
    llmaudit's solver).

    Args:
        cfg: the experiment's config (its quantizer options).
        units: the scoring grid.
        device: where GPTQ runs (the solver, hence the convention, depends on it).

    Returns:
        The number of calibration passes.
    """
    quantizers: dict[str, Any] = {}
    shared, sequential = set(), 0
    for u in units:
        if quantizer_class(u.quantizer).shares_calibration is None:
            continue
        if u.quantizer not in quantizers:
            opts = {**cfg.score.quantizer_options.get(u.quantizer, {}), "device": device}
            quantizers[u.quantizer] = get_quantizer(u.quantizer, **opts)
        key = quantizers[u.quantizer].calibration_key()
        if key is None:
            sequential += 1
        else:
            shared.add((u.run, u.step, json.dumps(key, sort_keys=True)))
    return sequential + len(shared)


def count_workload(
    cfg: ExperimentConfig, draw: Draw, *, budget: int, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> Workload:
    """The exact workload of a config on the drawn samples (see the module docstring).

    Args:
        cfg: the experiment's config.
        draw: its drawn pool, validation set and membership masks.
        budget: the scoring engine's token budget per batch.
        dtype: the models' compute dtype (fp32 of a float32 model is the identity, whose own pass is the KL
            reference).
        device: where GPTQ runs (its convention, hence how many calibration passes, depends on the solver the device
            gets).

    Returns:
        The workload: runs, steps, units, tokens to train and to score, calibrations, loss-table bytes, utility work.
    """
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    pool = tokenize_records(draw.tokenizer, draw.pool, "pool", **kw)
    val = tokenize_records(draw.tokenizer, draw.val, "val", **kw)
    quantizers = list(cfg.score.quantizers)
    val_len, pool_len = _lengths(val), _lengths(pool)
    members, steps, train_real, train_padded = [], [], 0, 0
    for run in range(cfg.train.runs):
        mine = [pool[i] for i in np.flatnonzero(draw.masks[run])]
        members.append(len(mine))
        steps.append(
            checkpoint_steps(len(mine), cfg.train.batch_size, cfg.train.epochs, cfg.train.checkpoints_per_epoch)
        )
        real, padded = _train_counts(cfg, mine, run)
        train_real, train_padded = train_real + real, train_padded + padded
    units = grid_units(cfg, dict(enumerate(steps)))
    finals = sum(1 for u in units if u.final)
    score_tokens = len(units) * sum(val_len) + finals * sum(pool_len)
    score_padded = len(units) * _padded(val_len, budget) + finals * _padded(pool_len, budget)
    scored = len(units) * sum(e.n_scored for e in val) + finals * sum(e.n_scored for e in pool)
    per_token_bytes = 4 * (3 if cfg.score.vocab_stats else 1)
    utility = _utility_counts(cfg, draw, units, val, dtype)
    return Workload(
        runs=cfg.train.runs,
        members_per_run=members,
        steps_per_run=steps,
        quantizers=quantizers,
        units=len(units),
        units_per_quantizer=sum(1 for u in units if u.quantizer == quantizers[-1] and u.run != REFERENCE_RUN),
        gptq_calibrations=gptq_calibrations(cfg, units, device=device),
        train_tokens=train_real,
        train_padded_tokens=train_padded,
        score_tokens=score_tokens,
        score_padded_tokens=score_padded,
        scored_tokens=scored,
        unit_tokens={"val": sum(val_len), "pool": sum(pool_len)},
        loss_table_bytes=int(
            scored * per_token_bytes + len(units) * (len(val) * 120 + 8192) + finals * len(pool) * 120
        ),
        **utility,
    )


def _utility_counts(cfg: ExperimentConfig, draw: Draw, units: list, val: list[Example], dtype: torch.dtype) -> dict:
    """The extra work of the utility columns (llmaudit.score.utility), counted as the stage does it: per run's
    last checkpoint, units in recipe order, the reference captured by an identity quantizer or computed once."""
    last = {}
    for u in units:
        if u.run != REFERENCE_RUN:
            last[u.run] = max(last.get(u.run, u.step), u.step)
    finals = [u for u in units if u.run != REFERENCE_RUN and u.step == last[u.run]]
    identity = {q: is_identity(get_quantizer(q, device="cpu"), dtype) for q in cfg.score.quantizers}
    out = dict.fromkeys(("reference_tokens", "divergence_positions", "generation_units", "generation_prompt_tokens"), 0)
    out |= {"generation_max_new_tokens": 0, "generated_tokens_max": 0, "generation_batches_per_unit": 0}
    if cfg.score.divergence and finals:
        first = cfg.score.quantizers[0]
        checkpoints = len(last)
        out["reference_tokens"] = 0 if identity[first] else checkpoints * sum(len(e.input_ids) for e in val)
        positions = sum(max(0, sum(e.loss_mask[1:])) for e in val)
        out["divergence_positions"] = sum(positions for u in finals if not identity[u.quantizer])
    plan = plan_generation(draw.tokenizer, draw.val, cfg.score.generation_samples, cfg.score.generation_max_new_tokens)
    if plan is not None and finals:
        out["generation_units"] = len(finals)
        out["generation_prompt_tokens"] = len(finals) * plan.prompt_tokens
        out["generation_max_new_tokens"] = plan.max_new_tokens
        out["generated_tokens_max"] = len(finals) * len(plan.indices) * plan.max_new_tokens
        widths = [len(p) + plan.max_new_tokens for p in plan.prompts]
        out["generation_batches_per_unit"] = len(length_sorted_batches(widths, GENERATION_TOKEN_BUDGET))
    return out


# ------------------------------------------------------------------------------------------ throughput


def utility_seconds(work: Workload, speed: Throughput) -> float:
    """The utility columns' share of scoring.

    The reference passes, the KL passes, and generation at most (every answer running to max_new_tokens: prefill at
    the scoring rate, then one step per new token per batch).

    Args:
        work: the workload.
        speed: the throughput.

    Returns:
        Seconds.
    """
    prefill = (work.reference_tokens + work.generation_prompt_tokens) / speed.score_tokens_per_s
    decode = work.generation_units * work.generation_batches_per_unit * work.generation_max_new_tokens
    return prefill + work.divergence_positions * speed.divergence_s_per_position + decode * speed.generation_step_s


def _unit_seconds(cfg: ExperimentConfig, work: Workload, speed: Throughput) -> float:
    """The scoring stage's model load, checkpoint merges, quantizations and forward passes, in one process."""
    matched = cfg.score.score_base and cfg.score.matched_base
    n_base = (len(work.quantizers) if matched else 1) if cfg.score.score_base else 0
    per_q_units = {q: (work.units - n_base) // max(1, len(work.quantizers)) for q in work.quantizers}
    mean_tokens = work.score_padded_tokens / max(1, work.units)
    seconds = speed.model_load_s + sum(len(s) for s in work.steps_per_run) * speed.checkpoint_s
    for q in work.quantizers:
        units = per_q_units[q] + (1 if cfg.score.score_base and (matched or q == work.quantizers[0]) else 0)
        seconds += units * (
            mean_tokens / speed.score_tokens_per_s * speed.forward_slowdown.get(q, 1.0) + speed.quantize_s.get(q, 0.0)
        )
    return seconds


def estimate(
    cfg: ExperimentConfig, work: Workload, speed: Throughput, analysis: AnalysisCost, *, jobs: int = 1
) -> dict[str, Any]:
    """Seconds per stage and in total, on one device and with several devices in parallel (shards).

    The report's time comes from the analysis's cost measured on this CPU: the attacks (`analyze.cost.analysis_seconds`),
    reading the loss tables and the release sets' decisions (`analyze.cost.report_rest_seconds`), plus
    REPORT_OVERHEAD_S.

    Args:
        cfg: the experiment's config.
        work: the workload.
        speed: the throughput.
        analysis: the analysis's measured cost.
        jobs: devices in parallel.

    Returns:
        {"finetune_s", "score_s", "utility_s", "report_s", "report_processes", "train_processes", "score_processes",
        "total_s", "jobs", "parallel_total_s"}.
    """
    checkpoints = sum(len(s) for s in work.steps_per_run)
    on_cpu = speed.device == "cpu"
    train_at_once = local_parallelism(cfg.train.processes, work.runs, on_cpu=on_cpu)
    score_at_once = local_parallelism(cfg.score.processes, work.units, on_cpu=on_cpu)
    finetune_s = (
        speed.model_load_s
        + (work.train_padded_tokens / speed.train_tokens_per_s + checkpoints * speed.checkpoint_s) / train_at_once
    )
    utility_s = utility_seconds(work, speed)
    score_s = (_unit_seconds(cfg, work, speed) + utility_s + work.units * speed.unit_overhead_s) / score_at_once
    pool = len(work.members_per_run) and max(1, int(round(np.mean(work.members_per_run) / cfg.train.member_fraction)))
    processes = cfg.report.processes or available_cores()
    report_s = _report_seconds(cfg, work, analysis, pool, processes)
    total = finetune_s + score_s + report_s
    parallel = jobs > 1
    return {
        "finetune_s": finetune_s,
        "score_s": score_s,
        "utility_s": utility_s,
        "report_s": report_s,
        "report_processes": min(processes, max(1, len(work.quantizers))),
        "train_processes": train_at_once,
        "score_processes": score_at_once,
        "total_s": total,
        "jobs": jobs,
        "parallel_total_s": (
            finetune_s / min(jobs, work.runs)
            + score_s / min(jobs, work.units)
            + report_s
            + (speed.model_load_s if parallel else 0)
        ),
    }


def _report_seconds(cfg: ExperimentConfig, work: Workload, analysis: AnalysisCost, pool: int, processes: int) -> float:
    """The report stage: REPORT_OVERHEAD_S, the attacks P quantizers at a time, reading the tables and the release
    sets' decisions, each from the cost measured on this CPU."""
    attacks = analysis_seconds(
        analysis,
        pool=pool,
        quantizers=len(work.quantizers),
        n_boot=cfg.attack.n_boot,
        decision_resamples=cfg.report.decision_resamples,
        processes=processes,
    )
    rest = report_rest_seconds(
        analysis,
        pool=pool,
        files=work.units,
        table_bytes=work.loss_table_bytes,
        set_sizes=[len(files) for files in cfg.report.release_sets],
        resamples=cfg.report.decision_resamples,
    )
    return REPORT_OVERHEAD_S + attacks + rest


def make_plan(cfg: ExperimentConfig, *, device: str = "auto", jobs: int = 1, echo=print) -> dict[str, Any]:
    """The plan of a config: its workload, the throughput (measured here or assumed for a named GPU), the times.

    Nothing is written.

    Args:
        cfg: the experiment's config.
        device: auto, cpu or cuda (measured here), or a GPU of `throughput.GPU_BF16_PEAK` (priced from its peak).
        jobs: devices in parallel.
        echo: where progress lines go.

    Returns:
        {"experiment", "model", "device", "token_budget", "workload", "throughput", "analysis", "estimate",
        "assumptions"}.

    Raises:
        UserError: an unknown device (with the closest name).
        DataError: the experiment's data cannot be drawn again (an imported store).
    """
    check_device(device)  # before any work: the draw alone can take seconds
    store = RunStore(cfg.resolved_output_dir())
    assumptions: list[str] = []
    try:
        draw = draw_experiment(cfg, echo=echo)
    except UserError as exc:  # offline: the hub's model and data are out of reach
        draw, assumptions = standin_draw(cfg, exc, echo)
    if not assumptions:
        assumptions += _existing_store(cfg, store, draw)
    gpu = device.lower() if device.lower() in GPU_BF16_PEAK else None
    target = torch.device("cuda") if gpu else pick_device(device)
    compute = torch.bfloat16 if gpu else choose_compute_dtype(cfg.model.dtype, target).dtype
    cfg = cfg.model_copy(update={"score": cfg.score.with_reference(SHORT_DTYPE_NAMES[compute])})
    budget = token_budget(cfg, target)
    work = count_workload(cfg, draw, budget=budget, dtype=compute, device="cuda" if gpu else target.type)
    config = model_config(cfg, draw)
    work.model_parameters = count_params(config)[0]
    work.adapter_bytes = _adapter_bytes(cfg, config) * sum(len(s) for s in work.steps_per_run)
    speed = (
        named_gpu_throughput(cfg, draw, gpu)
        if gpu
        else measure_throughput(
            cfg, draw, device=target, budget=budget, dtype=compute, threads=stage_threads(cfg, work.runs)
        )
    )
    attacks = resolve_attacks(cfg.attack.attacks)
    echo(f"[plan] timing the analysis of {len(attacks)} attacks on synthetic loss tables (seconds)")
    analysis = _analysis_cost(attacks, cfg.train.runs)
    if gpu:
        assumptions.append(
            "the report stage runs on a CPU whatever the device: it is priced on this machine's CPU "
            f"({analysis.measured_in_s:.0f} s of measurement); the cluster's CPUs may differ"
        )
    return {
        "experiment": cfg.name,
        "model": draw.source.describe(),
        "device": speed.device,
        "token_budget": budget,
        "workload": asdict(work),
        "throughput": asdict(speed),
        "analysis": analysis.as_dict(),
        "estimate": estimate(cfg, work, speed, analysis, jobs=jobs),
        "assumptions": assumptions,
    }


def _existing_store(cfg: ExperimentConfig, store: RunStore, draw: Draw) -> list[str]:
    """A store already at the recipe's output directory: its membership masks when it holds this experiment
    (what `finetune` resumes); otherwise the recipe is priced as a new experiment, and the one line returned
    says why (`finetune` would refuse that directory: the message names what differs and the fix)."""
    if not store.exists():
        return []
    try:
        store.check_identity(cfg)
        masks = store.membership()
    except UserError as exc:
        return [f"{' '.join(str(exc).split())} The plan prices {cfg.name} as a new experiment in a new output_dir."]
    if masks.shape != draw.masks.shape:  # a store of this identity always holds the recipe's masks
        return [
            f"{store.manifest_path} holds {masks.shape[0]} x {masks.shape[1]} membership masks where the recipe "
            f"draws {draw.masks.shape[0]} x {draw.masks.shape[1]}: the plan prices the recipe's own draw."
        ]
    draw.masks = masks
    return []


def _adapter_bytes(cfg: ExperimentConfig, config: Any) -> int:
    """Bytes of one LoRA checkpoint (fp32 A and B matrices of every targeted linear layer)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = with_lora(AutoModelForCausalLM.from_config(config), cfg)
    return 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
