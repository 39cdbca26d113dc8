"""`llmaudit plan`: the price of an audit before it runs.

The workload is counted exactly as the stages will do it, from the same code: the data draw
(`draw_experiment`), each run's checkpoint steps (`checkpoint_steps`) and batches (`epoch_batches`),
the scoring grid (`plan_units`: validation samples at every checkpoint, the pool at each run's final
one, the base model once) and the scorer's batches (`length_sorted_batches` under the token budget).
A test checks the unit and token counts against what `llmaudit score` then records in its work log.

Time is estimated from throughput:
- on this machine (device cpu, or cuda when one is visible): measured by a few-second calibration on a
  model of the recipe's shape (random weights, its real vocabulary): scoring tokens/s with the scoring
  engine on the recipe's own token lengths, LoRA training tokens/s, and each quantizer's time on a
  2-layer slice of the model, scaled to the full depth;
- on a named GPU (h100, h200, a100, l40s, a6000): the published dense bf16 peak times an efficiency
  (scoring 40%: the goal `benchmarks/gpu_check.py` checks, not yet measured on a GPU; LoRA training 30%:
  an assumption), with the per-layer quantization times in `GPU_QUANTIZE_S_PER_LAYER` (assumptions).
The report stage (the analysis) runs on a CPU whatever the device: its cost is measured on this machine's
CPU in seconds, on synthetic loss tables at the recipe's runs and attacks (`llmaudit.analyze.cost`), and scaled
to the recipe's pool records, quantizers and resamples.
Every assumption is printed with the plan and written to its JSON.
"""

from __future__ import annotations

import copy
import functools
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from llmaudit.analyze.cost import AnalysisCost, analysis_seconds, measure_analysis_cost
from llmaudit.common.errors import UserError, did_you_mean
from llmaudit.common.runtime import SHORT_DTYPE_NAMES, choose_compute_dtype, dtype_name, pick_device
from llmaudit.config import ExperimentConfig, ModelConfig
from llmaudit.data.chem import SUPPORTED_TASKS
from llmaudit.data.records import record_text
from llmaudit.data.tokenize import Example, collate, tokenize_records
from llmaudit.finetune.experiment import Draw, draw_experiment
from llmaudit.finetune.runs import autocast_dtype, checkpoint_steps, weights_dtype
from llmaudit.models.builtin import builtin_tokenizer
from llmaudit.models.layers import cast_parameters
from llmaudit.models.loading import import_gptqmodel_quietly
from llmaudit.models.sources import ModelSource
from llmaudit.models.training import autocast_to, batch_mean_nll, epoch_batches
from llmaudit.quantize import get_quantizer
from llmaudit.score.divergence import divergence_scores
from llmaudit.score.engine import length_sorted_batches, score_examples
from llmaudit.score.generate import GENERATION_TOKEN_BUDGET, greedy_generate, plan_generation
from llmaudit.score.stage import is_identity, token_budget
from llmaudit.store.losstable import REFERENCE_RUN
from llmaudit.store.run_store import RunStore
from llmaudit.store.units import grid_units

GPU_BF16_PEAK = {"h100": 989e12, "h200": 989e12, "a100": 312e12, "l40s": 362e12, "a6000": 155e12}
"""Published dense bf16 tensor-core peaks in FLOP/s (NVIDIA data sheets; SXM parts for H100/H200/A100)."""
GPU_EFFICIENCY = {"score": 0.40, "train": 0.30}
"""Share of the peak assumed: scoring = the goal of benchmarks/gpu_check.py (unmeasured), training = typical LoRA MFU."""
GPU_QUANTIZE_S_PER_LAYER = {"full": 0.0, "simple": 0.01, "bnb": 0.02, "hqq": 0.3, "gptq": 2.0, "awq": 2.0, "gguf": 0.5}
"""Assumed seconds per transformer layer per quantization on a GPU, at 0.5B scale (scaled by layer size)."""
KNOWN_SHAPES = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        model_type="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "meta-llama/Meta-Llama-3-8B-Instruct": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        tie_word_embeddings=False,
    ),
    "mistralai/Ministral-8B-Instruct-2410": dict(
        model_type="mistral",
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=131072,
        tie_word_embeddings=False,
    ),
}
"""Published architectures of the recipes' hub models (their config.json), used to price a plan when the hub
cannot be reached: the shape is all a plan needs from the weights."""
GPU_DECODE_BYTES_PER_S = 2e12
"""Assumed weight-read bandwidth of one greedy decoding step on a named GPU (decoding is memory-bound; the
published HBM bandwidths are 1.6-4.8 TB/s); an assumption, printed with the plan."""
GPU_DECODE_S_PER_LAYER = 1e-3
"""Assumed launch-bound floor of a decoding step with transformers' generate on a GPU, per decoder layer (small
batches launch several kernels per layer per step); an assumption, printed with the plan."""
REPORT_OVERHEAD_S = 5.0
"""Report seconds beside the attack analysis (reading the store, tables, plots): measured at 3-6 s on the demo."""


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
    """The GPTQ calibration passes the stage runs on `device`: one per GPTQ unit in GPTQ's sequential convention
    (each bit width calibrates on its own partly quantized model), one per checkpoint and calibration key for the
    quantizers whose Hessians are shared (`calibration: shared`, llmaudit's solver)."""
    quantizers: dict[str, Any] = {}
    shared, sequential = set(), 0
    for u in units:
        if not u.quantizer.startswith("gptq"):
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
    """The exact workload of `cfg` on the drawn samples (see the module docstring); dtype: the models' compute
    dtype (fp32 of a float32 model is the identity, whose own pass is the KL reference); device: where GPTQ runs
    (its convention, hence how many calibration passes, depends on the solver the device gets)."""
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


@dataclass
class Throughput:
    """Tokens per second and per-quantization seconds on one device, with where each figure comes from."""

    device: str
    score_tokens_per_s: float
    train_tokens_per_s: float
    quantize_s: dict[str, float]
    """Seconds to quantize the whole model once, per quantizer."""
    forward_slowdown: dict[str, float]
    """Scoring time relative to full precision, per quantizer (real kernels that are slower on this device)."""
    checkpoint_s: float
    """Per checkpoint: merge the adapter into a copy of the base (scoring) or save it (training)."""
    model_load_s: float
    source: dict[str, str]
    divergence_s_per_position: float = 0.0
    """KL pass: seconds per compared validation position (two vocabulary passes)."""
    generation_step_s: float = 0.0
    """Seconds per greedy decoding step of one generation batch (key/value cache)."""


def _model_config(cfg: ExperimentConfig, draw: Draw) -> Any:
    from transformers import AutoConfig

    if draw.source.kind == "standin":
        shape = dict(KNOWN_SHAPES[cfg.model.name])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    return AutoConfig.from_pretrained(draw.source.path or cfg.model.name, trust_remote_code=cfg.model.trust_remote_code)


def _standin_draw(cfg: ExperimentConfig, why: Exception, echo) -> tuple[Draw, list[str]]:
    """A draw for pricing only, when the recipe's model or data cannot be reached (offline): the offline
    SMolInstruct-format records, a stand-in tokenizer, and the model's published shape (KNOWN_SHAPES)."""
    if cfg.model.name not in KNOWN_SHAPES:
        raise why
    tokenizer_model = "builtin:tiny-qwen2"  # trained in memory in seconds: a plan builds and writes nothing
    data = cfg.data.model_copy(
        update={
            "source": "synthetic",
            "path": None,
            "tasks": [t for t in cfg.data.tasks if t in SUPPORTED_TASKS] or ["molecule_captioning"],
        }
    )
    draw = draw_experiment(
        cfg.model_copy(update={"data": data}),
        echo=echo,
        source=ModelSource(cfg.model.name, "standin"),
        tokenizer=builtin_tokenizer(ModelConfig(name=tokenizer_model)),
    )
    assumptions = [
        f"{cfg.model.name} or its data could not be reached ({' '.join(str(why).split())[:160]}): the plan uses the model's "
        "published shape, the offline SMolInstruct-format records and the tokenizer of "
        f"{tokenizer_model} to count tokens (SMolInstruct's real texts and {cfg.model.name}'s tokenizer give other counts)",
    ]
    return draw, assumptions


def _random_model(config: Any, layers: int | None = None) -> Any:
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    if layers is not None:
        config.num_hidden_layers = layers
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def _count_params(config: Any) -> tuple[int, int]:
    """(parameters, decoder layers) of a model config, built on the meta device (no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters()), int(getattr(config, "num_hidden_layers", 1))


def _timed(fn, repeats: int = 2) -> float:
    fn()  # warm-up: allocator, kernels, caches
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def _lora(model: Any, cfg: ExperimentConfig) -> Any:
    from peft import LoraConfig, get_peft_model

    import_gptqmodel_quietly()  # peft's LoRA dispatch imports it

    lora = LoraConfig(
        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lora)


def measure_throughput(
    cfg: ExperimentConfig, draw: Draw, *, device: torch.device, budget: int, dtype: torch.dtype = torch.float32
) -> Throughput:
    """A few-second calibration on this machine with a random-weight model of the recipe's shape, in the compute
    dtype a new store of the recipe gets here (`dtype`: bf16 where this CPU's bf16 matmuls are faster): scoring
    with the parameters in that dtype, training as finetune trains (float32 weights under autocast on a CPU)."""
    config = _model_config(cfg, draw)
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    sample = tokenize_records(draw.tokenizer, draw.val[:16] or draw.pool[:16], "val", **kw)
    examples = [(list(e.input_ids), list(e.loss_mask)) for e in sample]
    pad = draw.tokenizer.pad_token_id
    t0 = time.perf_counter()
    model = _random_model(config).to(device)
    load_s = time.perf_counter() - t0
    tokens = sum(len(ids) for ids, _ in examples)

    def run_scoring(m: Any) -> None:
        score_examples(
            m,
            examples,
            pad_id=pad,
            token_budget=budget,
            head_chunk=cfg.score.head_chunk,
            vocab_stats=cfg.score.vocab_stats,
            device=device,
            cpu_workers=cfg.score.cpu_workers,
        )

    scoring_model = cast_parameters(copy.deepcopy(model), dtype) if dtype != torch.float32 else model
    score_s = _timed(lambda: run_scoring(scoring_model))
    merge_s = _timed(lambda: copy.deepcopy(model), repeats=1)
    weights = weights_dtype(dtype, device)
    trainable = _lora(cast_parameters(copy.deepcopy(model), weights), cfg).to(device).train()
    batch = collate(examples[: cfg.train.batch_size], pad, device)
    optimizer = torch.optim.AdamW([p for p in trainable.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        with autocast_to(device, autocast_dtype(dtype, device)):
            loss = batch_mean_nll(trainable, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    train_s = _timed(step)
    train_tokens = int(batch[1].sum())
    quantize_s, slowdown = _quantizer_costs(cfg, config, draw, device, examples, run_scoring, dtype)
    divergence_s, step_s = _utility_costs(scoring_model, examples, pad, device)
    return Throughput(
        device=device.type,
        score_tokens_per_s=tokens / score_s,
        train_tokens_per_s=train_tokens / train_s,
        quantize_s=quantize_s,
        forward_slowdown=slowdown,
        checkpoint_s=merge_s,
        model_load_s=load_s,
        source={
            "score": f"measured: scoring engine in {dtype_name(dtype)}, {len(examples)} samples of the recipe's own lengths, random weights of its shape",
            "train": f"measured: one LoRA step (batch {len(examples[: cfg.train.batch_size])}), fwd + bwd + AdamW, as finetune trains in {dtype_name(dtype)}",
            "quantize": "measured on a 2-layer slice of the model, scaled to the full depth",
            "utility": "measured: the KL pass on the sample's positions, 8 greedy steps of its prompts in one batch",
        },
        divergence_s_per_position=divergence_s,
        generation_step_s=step_s,
    )


def _utility_costs(model: Any, examples: list, pad: int, device: torch.device) -> tuple[float, float]:
    """(seconds per KL position, seconds per decoding step of one batch) on the calibration model."""
    head = model.get_output_embeddings()
    positions = max(1, sum(sum(m[1:]) for _, m in examples))
    h = torch.randn(positions, head.weight.shape[1], device=device, dtype=head.weight.dtype)
    kl_s = _timed(lambda: divergence_scores(head, head, h, h), repeats=1) / positions
    prompts = [ids[: max(1, len(ids) // 2)] for ids, _ in examples]

    def generate(steps: int) -> None:
        greedy_generate(model, prompts, max_new_tokens=steps, stop_ids=[], pad_id=pad, device=device)

    one, nine = _timed(lambda: generate(1), repeats=1), _timed(lambda: generate(9), repeats=1)
    return kl_s, max(nine - one, 1e-6) / 8


def _quantizer_costs(
    cfg, config, draw, device, examples, run_scoring, dtype=torch.float32
) -> tuple[dict[str, float], dict[str, float]]:
    """Per quantizer: seconds to quantize the full model (from a 2-layer slice, float32 as the stage quantizes) and
    its scoring slowdown against full precision in the compute dtype (both cast to `dtype` as the stage does)."""
    layers = int(getattr(config, "num_hidden_layers", 1))
    small = _random_model(config, layers=min(2, layers)).to(device)
    texts = [record_text(r) for r in draw.pool[:16]]
    reference = cast_parameters(copy.deepcopy(small), dtype)
    base_s = _timed(lambda: run_scoring(reference), repeats=1)
    quantize_s, slowdown = {}, {}
    for name in cfg.score.quantizers:
        opts = dict(cfg.score.quantizer_options.get(name, {}))
        opts.setdefault("device", device.type)
        q = get_quantizer(name, **opts)
        kwargs = {"tokenizer": draw.tokenizer, "calibration_texts": texts} if q.calibrated else {}
        t0 = time.perf_counter()
        qmodel = cast_parameters(q.quantize_model(copy.deepcopy(small), **kwargs), dtype)
        quantize_s[name] = (time.perf_counter() - t0) * layers / max(1, min(2, layers))
        slowdown[name] = max(1.0, _timed(lambda qm=qmodel: run_scoring(qm), repeats=1) / base_s)
    return quantize_s, slowdown


def named_gpu_throughput(cfg: ExperimentConfig, draw: Draw, gpu: str) -> Throughput:
    """Throughput on a named GPU from its published bf16 peak and the efficiencies above (assumptions)."""
    config = _model_config(cfg, draw)
    params, layers = _count_params(config)
    peak = GPU_BF16_PEAK[gpu]
    flops_per_token = 2 * params
    head_params = int(getattr(config, "vocab_size", 0)) * int(getattr(config, "hidden_size", 0))
    scale = params / layers / 20e6  # the per-layer quantization assumptions are for ~20M-parameter layers
    quantize_s = {}
    for name in cfg.score.quantizers:
        family = get_quantizer(name, device="cpu").family
        quantize_s[name] = GPU_QUANTIZE_S_PER_LAYER.get(family, 0.1) * layers * max(scale, 0.05)
    return Throughput(
        device=gpu,
        score_tokens_per_s=peak * GPU_EFFICIENCY["score"] / flops_per_token,
        train_tokens_per_s=peak * GPU_EFFICIENCY["train"] / (3 * flops_per_token),
        quantize_s=quantize_s,
        forward_slowdown=dict.fromkeys(cfg.score.quantizers, 1.0),
        checkpoint_s=params * 2 / 20e9,  # a bf16 copy at ~20 GB/s
        model_load_s=params * 2 / 1e9 + 5,  # ~1 GB/s from disk plus start-up
        source={
            "score": f"assumed: {GPU_EFFICIENCY['score']:.0%} of the published {peak / 1e12:.0f} TFLOP/s bf16 peak, 2 FLOP per parameter per token",
            "train": f"assumed: {GPU_EFFICIENCY['train']:.0%} of the peak, 6 FLOP per parameter per token (forward and backward)",
            "quantize": "assumed: seconds per layer in GPU_QUANTIZE_S_PER_LAYER, scaled by layer size",
            "utility": f"assumed: the KL pass at the scoring efficiency (4 FLOP per head parameter per position); a decoding "
            f"step reads the bf16 weights once at {GPU_DECODE_BYTES_PER_S / 1e12:.0f} TB/s, or takes "
            f"{1e3 * GPU_DECODE_S_PER_LAYER:.0f} ms per layer of kernel launches if that is longer",
        },
        divergence_s_per_position=4 * head_params / (peak * GPU_EFFICIENCY["score"]),
        generation_step_s=max(2 * params / GPU_DECODE_BYTES_PER_S, layers * GPU_DECODE_S_PER_LAYER),
    )


# ------------------------------------------------------------------------------------------ estimate


def utility_seconds(work: Workload, speed: Throughput) -> float:
    """The utility columns' share of scoring: the reference passes, the KL passes, and generation at most (every
    answer running to max_new_tokens: prefill at the scoring rate, then one step per new token per batch)."""
    prefill = (work.reference_tokens + work.generation_prompt_tokens) / speed.score_tokens_per_s
    decode = work.generation_units * work.generation_batches_per_unit * work.generation_max_new_tokens
    return prefill + work.divergence_positions * speed.divergence_s_per_position + decode * speed.generation_step_s


def estimate(
    cfg: ExperimentConfig, work: Workload, speed: Throughput, analysis: AnalysisCost, *, jobs: int = 1
) -> dict[str, Any]:
    """Seconds per stage and in total, on one device, and with `jobs` devices in parallel (shards); the report
    from the analysis's cost measured on this CPU (`analyze.cost.analysis_seconds`)."""
    checkpoints = sum(len(s) for s in work.steps_per_run)
    finetune_s = (
        speed.model_load_s + work.train_padded_tokens / speed.train_tokens_per_s + checkpoints * speed.checkpoint_s
    )
    matched = cfg.score.score_base and cfg.score.matched_base
    n_base = (len(work.quantizers) if matched else 1) if cfg.score.score_base else 0
    per_q_units = {q: (work.units - n_base) // max(1, len(work.quantizers)) for q in work.quantizers}
    mean_tokens = work.score_padded_tokens / max(1, work.units)
    score_s = speed.model_load_s + checkpoints * speed.checkpoint_s
    for q in work.quantizers:
        units = per_q_units[q] + (1 if cfg.score.score_base and (matched or q == work.quantizers[0]) else 0)
        score_s += units * (
            mean_tokens / speed.score_tokens_per_s * speed.forward_slowdown.get(q, 1.0) + speed.quantize_s.get(q, 0.0)
        )
    utility_s = utility_seconds(work, speed)
    score_s += utility_s
    pool = len(work.members_per_run) and max(1, int(round(np.mean(work.members_per_run) / cfg.train.member_fraction)))
    report_s = REPORT_OVERHEAD_S + analysis_seconds(
        analysis,
        pool=pool,
        quantizers=len(work.quantizers),
        n_boot=cfg.attack.n_boot,
        decision_resamples=cfg.report.decision_resamples,
    )
    total = finetune_s + score_s + report_s
    parallel = jobs > 1
    return {
        "finetune_s": finetune_s,
        "score_s": score_s,
        "utility_s": utility_s,
        "report_s": report_s,
        "total_s": total,
        "jobs": jobs,
        "parallel_total_s": (
            finetune_s / min(jobs, work.runs)
            + score_s / min(jobs, work.units)
            + report_s
            + (speed.model_load_s if parallel else 0)
        ),
    }


def make_plan(cfg: ExperimentConfig, *, device: str = "auto", jobs: int = 1, echo=print) -> dict[str, Any]:
    """The plan of `cfg`: workload, throughput (measured here or assumed for a named GPU), times."""
    devices = ("auto", "cpu", "cuda", *GPU_BF16_PEAK)
    if device.lower() not in devices:  # before any work: the draw alone can take seconds
        raise UserError(
            f"--device {device!r} is not known{did_you_mean(device.lower(), devices)}: use auto, cpu or cuda "
            f"(measured here) or a GPU whose published peak prices the plan: {', '.join(GPU_BF16_PEAK)}"
        )
    store = RunStore(cfg.resolved_output_dir())
    assumptions: list[str] = []
    try:
        draw = draw_experiment(cfg, echo=echo)
    except UserError as exc:  # offline: the hub's model and data are out of reach
        draw, assumptions = _standin_draw(cfg, exc, echo)
    if not assumptions:
        assumptions += _existing_store(cfg, store, draw)
    gpu = device.lower() if device.lower() in GPU_BF16_PEAK else None
    target = torch.device("cuda") if gpu else pick_device(device)
    compute = torch.bfloat16 if gpu else choose_compute_dtype(cfg.model.dtype, target).dtype
    cfg = cfg.model_copy(update={"score": cfg.score.with_reference(SHORT_DTYPE_NAMES[compute])})
    budget = token_budget(cfg, target)
    work = count_workload(cfg, draw, budget=budget, dtype=compute, device="cuda" if gpu else target.type)
    config = _model_config(cfg, draw)
    work.model_parameters = _count_params(config)[0]
    work.adapter_bytes = _adapter_bytes(cfg, config) * sum(len(s) for s in work.steps_per_run)
    speed = (
        named_gpu_throughput(cfg, draw, gpu)
        if gpu
        else measure_throughput(cfg, draw, device=target, budget=budget, dtype=compute)
    )
    echo(f"[plan] timing the analysis of {len(cfg.attack.attacks)} attacks on synthetic loss tables (seconds)")
    analysis = _analysis_cost(tuple(cfg.attack.attacks), cfg.train.runs)
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
        model = _lora(AutoModelForCausalLM.from_config(config), cfg)
    return 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)


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
        f"  throughput      score {t['score_tokens_per_s']:,.0f} tok/s, train {t['train_tokens_per_s']:,.0f} tok/s",
    ]
    for q, s in t["quantize_s"].items():
        lines.append(f"    {q:>12}: {s:.1f} s per quantization, scoring x{t['forward_slowdown'].get(q, 1.0):.2f}")
    lines += [f"    ({k}: {v})" for k, v in t["source"].items()]
    if plan.get("analysis"):
        a = plan["analysis"]
        lines.append(
            f"    (report: the analysis measured on this CPU in {a['measured_in_s']:.0f} s on synthetic tables of "
            f"{a['runs']} runs x {' and '.join(str(r) for r in a['records'])} records, scaled as a + b n ln n)"
        )
    lines.append(
        f"  time            finetune {_duration(e['finetune_s'])}, score {_duration(e['score_s'])} (utility columns "
        f"{_duration(e['utility_s'])}), report {_duration(e['report_s'])}; "
        f"total {_duration(e['total_s'])}"
    )
    if e["jobs"] > 1:
        lines.append(
            f"  with {e['jobs']} parallel jobs: about {_duration(e['parallel_total_s'])} (each job loads the model once)"
        )
    lines += [f"  assumption      {a}" for a in plan.get("assumptions") or []]
    return "\n".join(lines)
