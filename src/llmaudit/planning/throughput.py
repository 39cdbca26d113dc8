"""Throughput of the stages on one device, for `llmaudit plan` (planning/plan.py): measured here on a model of the
recipe's shape (random weights, its real vocabulary), or, for a named GPU, its published bf16 peak times an
assumed efficiency; every figure says where it comes from (`Throughput.source`)."""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.common.memory import frozen_survivors, release_memory
from llmaudit.common.runtime import available_cores, dtype_name, threads_per_process, torch_threads
from llmaudit.config import ExperimentConfig, ModelConfig
from llmaudit.data.chem import SUPPORTED_TASKS
from llmaudit.data.records import record_text
from llmaudit.data.tokenize import collate, tokenize_records
from llmaudit.finetune.experiment import Draw, draw_experiment
from llmaudit.finetune.runs import autocast_dtype, weights_dtype
from llmaudit.models.builtin import builtin_tokenizer, is_builtin
from llmaudit.models.layers import cast_parameters
from llmaudit.models.loading import import_gptqmodel_quietly
from llmaudit.models.sources import ModelSource
from llmaudit.models.training import autocast_to, batch_mean_nll
from llmaudit.planning.arguments import GPU_BF16_PEAK
from llmaudit.quantize import get_quantizer, quantizer_class
from llmaudit.score.divergence import divergence_scores
from llmaudit.score.engine import ScoringOptions, TokenScores, score_examples
from llmaudit.score.generate import greedy_generate
from llmaudit.score.unit_scoring import unit_rows
from llmaudit.store.locks import claim
from llmaudit.store.losstable import write_loss_table
from llmaudit.store.markers import running_marker
from llmaudit.store.units import Unit
from llmaudit.store.worklog import append_work

GPU_EFFICIENCY = {"score": 0.40, "train": 0.30}
"""Share of the peak assumed: scoring = the goal of benchmarks/gpu_check.py (unmeasured), training = typical LoRA MFU."""
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
    unit_overhead_s: float = 0.0
    """Seconds of one unit's bookkeeping beside its arithmetic (`unit_overhead_s`), measured on this CPU."""


def model_config(cfg: ExperimentConfig, draw: Draw) -> Any:
    """The transformers config of the recipe's model: its published shape for a stand-in draw, else the model's own.

    Args:
        cfg: the experiment's config.
        draw: the draw (a stand-in when the model could not be reached).

    Returns:
        A transformers `PretrainedConfig`.
    """
    from transformers import AutoConfig

    if draw.source.kind == "standin":
        shape = dict(KNOWN_SHAPES[cfg.model.name])
        return AutoConfig.for_model(shape.pop("model_type"), **shape)
    return AutoConfig.from_pretrained(draw.source.path or cfg.model.name, trust_remote_code=cfg.model.trust_remote_code)


def standin_draw(cfg: ExperimentConfig, why: Exception, echo) -> tuple[Draw, list[str]]:
    """A draw for pricing only, when the recipe's model or data cannot be reached (offline).

    It holds the offline SMolInstruct-format records, a stand-in tokenizer, and the model's published shape
    (KNOWN_SHAPES).

    Args:
        cfg: the experiment's config.
        why: the error that kept the model or the data out of reach.
        echo: where progress lines go.

    Returns:
        (the draw, the assumptions the plan states because of it).

    Raises:
        UserError: `why` itself, when the model's shape is not known here.
    """
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


def count_params(config: Any) -> tuple[int, int]:
    """The parameters and decoder layers of a model config, built on the meta device (no memory).

    Args:
        config: a transformers config.

    Returns:
        (parameters, decoder layers).
    """
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


def with_lora(model: Any, cfg: ExperimentConfig) -> Any:
    """The model with the recipe's LoRA adapters (peft), as finetune trains it.

    Args:
        model: a causal language model.
        cfg: the experiment's config (its lora section).

    Returns:
        The peft model.
    """
    from peft import LoraConfig, get_peft_model

    import_gptqmodel_quietly()  # peft's LoRA dispatch imports it

    lora = LoraConfig(
        r=cfg.lora.r, lora_alpha=cfg.lora.alpha, target_modules=list(cfg.lora.target_modules), task_type="CAUSAL_LM"
    )
    return get_peft_model(model, lora)


def measure_throughput(
    cfg: ExperimentConfig,
    draw: Draw,
    *,
    device: torch.device,
    budget: int,
    dtype: torch.dtype = torch.float32,
    threads: dict[str, int | None] | None = None,
) -> Throughput:
    """A few-second calibration on this machine with a random-weight model of the recipe's shape.

    It runs in the compute dtype a new store of the recipe gets here (bf16 where this CPU's bf16 matmuls are faster):
    scoring with the parameters in that dtype, training as finetune trains (float32 weights under autocast on a
    CPU).

    Args:
        cfg: the experiment's config.
        draw: its draw (the validation records give the sample).
        device: where to measure.
        budget: the scoring engine's token budget per batch.
        dtype: the compute dtype.
        threads: {"train": n, "score": n}, the torch threads each stage's measurement runs on (`stage_threads`: what
            one of the stage's local processes gets); missing or None: this process's count.

    Returns:
        The measured throughput.
    """
    threads = threads or {}
    config = model_config(cfg, draw)
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    sample = tokenize_records(draw.tokenizer, draw.val[:16] or draw.pool[:16], "val", **kw)
    examples = [(list(e.input_ids), list(e.loss_mask)) for e in sample]
    pad = draw.tokenizer.pad_token_id
    t0 = time.perf_counter()
    model = _random_model(config).to(device)
    load_s = time.perf_counter() - t0
    tokens = sum(len(ids) for ids, _ in examples)

    options = _scoring_options(cfg, device, budget)

    def run_scoring(m: Any) -> None:
        score_examples(m, examples, pad_id=pad, options=options)

    scoring_model = cast_parameters(copy.deepcopy(model), dtype) if dtype != torch.float32 else model
    with torch_threads(threads.get("score")):
        score_s = _timed(lambda: run_scoring(scoring_model))
        merge_s = _timed(lambda: copy.deepcopy(model), repeats=1)
        quantize_s, slowdown = _quantizer_costs(cfg, config, draw, device, examples, run_scoring, dtype)
        divergence_s, step_s = _utility_costs(scoring_model, examples, pad, device)
        overhead_s = unit_overhead_s(_val_sample(cfg, draw))
    with torch_threads(threads.get("train")):
        train_s, train_tokens = _train_step_cost(cfg, model, examples[: cfg.train.batch_size], pad, device, dtype)
    return Throughput(
        device=device.type,
        score_tokens_per_s=tokens / score_s,
        train_tokens_per_s=train_tokens / train_s,
        quantize_s=quantize_s,
        forward_slowdown=slowdown,
        checkpoint_s=merge_s,
        model_load_s=load_s,
        source=_sources(dtype, len(examples), len(examples[: cfg.train.batch_size])),
        divergence_s_per_position=divergence_s,
        generation_step_s=step_s,
        unit_overhead_s=overhead_s,
    )


def _sources(dtype: torch.dtype, samples: int, batch: int) -> dict[str, str]:
    """Where each measured figure of `measure_throughput` comes from."""
    return {
        "score": f"measured: scoring engine in {dtype_name(dtype)}, {samples} samples of the recipe's own lengths, random weights of its shape",
        "train": f"measured: one LoRA step (batch {batch}), fwd + bwd + AdamW, as finetune trains in {dtype_name(dtype)}",
        "quantize": "measured on a 2-layer slice of the model, scaled to the full depth",
        "utility": "measured: the KL pass on the sample's positions, 8 greedy steps of its prompts in one batch",
        "unit": "measured: a unit's claim, marker, loss table (the validation rows), work-log line and memory release",
    }


def _train_step_cost(
    cfg: ExperimentConfig, model: Any, examples: list, pad: int, device: torch.device, dtype: torch.dtype
) -> tuple[float, int]:
    """(seconds, real tokens) of one LoRA step on the batch `examples`, as finetune trains in `dtype` (float32
    weights under autocast on a CPU): forward, backward and AdamW."""
    weights = weights_dtype(dtype, device)
    trainable = with_lora(cast_parameters(copy.deepcopy(model), weights), cfg).to(device).train()
    batch = collate(examples, pad, device)
    optimizer = torch.optim.AdamW([p for p in trainable.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        with autocast_to(device, autocast_dtype(dtype, device)):
            loss = batch_mean_nll(trainable, *batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return _timed(step), int(batch[1].sum())


def unit_overhead_s(sample: list, repeats: int = 3) -> float:
    """Seconds a scoring unit spends beside its arithmetic, on the CPU whatever the device.

    That is its claim and RUNNING marker, its loss table of the sample's rows (with scores of their lengths)
    validated and written atomically (parquet, fsync), its work-log line, and the memory handed back, all as the
    score stage does them (with the process's long-lived objects out of the garbage collection's way), in a
    temporary directory removed after.

    Args:
        sample: the recipe's validation records, tokenized.
        repeats: units timed after a warm-up.

    Returns:
        Seconds per unit.
    """
    rng = np.random.default_rng(0)
    scores = [
        TokenScores(*(rng.random(e.n_scored).astype(np.float32) for _ in range(3)), rng.random(e.n_scored) < 0.5)
        for e in sample
    ]
    unit = Unit(run=0, step=1, quantizer="plan", final=False)
    with tempfile.TemporaryDirectory(prefix="llmaudit-plan-") as tmp, frozen_survivors():
        root = Path(tmp)

        def one() -> None:
            with claim(root / "unit.lock"), running_marker(root / "unit.RUNNING.json"):
                write_loss_table(unit_rows(unit, sample, scores, set(), "0" * 16), root / "unit.parquet")
                append_work(root / "worklog.jsonl", {"stage": "score", "seconds": 0.0})
            release_memory()

        return _timed(one, repeats=repeats)


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


def _scoring_options(cfg: ExperimentConfig, device: torch.device, budget: int) -> ScoringOptions:
    sc = cfg.score
    return ScoringOptions(
        token_budget=budget,
        head_chunk=sc.head_chunk,
        vocab_stats=sc.vocab_stats,
        device=device,
        cpu_workers=sc.cpu_workers,
    )


def _val_sample(cfg: ExperimentConfig, draw: Draw) -> list:
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    return tokenize_records(draw.tokenizer, draw.val or draw.pool, "val", **kw)


def named_gpu_throughput(cfg: ExperimentConfig, draw: Draw, gpu: str) -> Throughput:
    """Throughput on a named GPU from its published bf16 peak and the efficiencies above (assumptions)."""
    config = model_config(cfg, draw)
    params, layers = count_params(config)
    peak = GPU_BF16_PEAK[gpu]
    flops_per_token = 2 * params
    head_params = int(getattr(config, "vocab_size", 0)) * int(getattr(config, "hidden_size", 0))
    scale = params / layers / 20e6  # the per-layer quantization assumptions are for ~20M-parameter layers
    quantize_s = {}
    for name in cfg.score.quantizers:
        quantize_s[name] = quantizer_class(name).gpu_seconds_per_layer * layers * max(scale, 0.05)
    return Throughput(
        device=gpu,
        score_tokens_per_s=peak * GPU_EFFICIENCY["score"] / flops_per_token,
        train_tokens_per_s=peak * GPU_EFFICIENCY["train"] / (3 * flops_per_token),
        quantize_s=quantize_s,
        forward_slowdown=dict.fromkeys(cfg.score.quantizers, 1.0),
        checkpoint_s=params * 2 / 20e9,  # a bf16 copy at an assumed memory bandwidth
        model_load_s=params * 2 / 1e9 + 5,  # read from disk at an assumed rate, plus start-up
        source={
            "score": f"assumed: {GPU_EFFICIENCY['score']:.0%} of the published {peak / 1e12:.0f} TFLOP/s bf16 peak, 2 FLOP per parameter per token",
            "train": f"assumed: {GPU_EFFICIENCY['train']:.0%} of the peak, 6 FLOP per parameter per token (forward and backward)",
            "quantize": "assumed: each quantizer's gpu_seconds_per_layer, scaled by layer size",
            "utility": f"assumed: the KL pass at the scoring efficiency (4 FLOP per head parameter per position); a decoding "
            f"step reads the bf16 weights once at {GPU_DECODE_BYTES_PER_S / 1e12:.0f} TB/s, or takes "
            f"{1e3 * GPU_DECODE_S_PER_LAYER:.0f} ms per layer of kernel launches if that is longer",
            "unit": "measured on this CPU: a unit's claim, marker, loss table, work-log line and memory release",
        },
        divergence_s_per_position=4 * head_params / (peak * GPU_EFFICIENCY["score"]),
        generation_step_s=max(2 * params / GPU_DECODE_BYTES_PER_S, layers * GPU_DECODE_S_PER_LAYER),
        unit_overhead_s=unit_overhead_s(_val_sample(cfg, draw)),
    )


# ------------------------------------------------------------------------------------------ estimate


def stage_threads(cfg: ExperimentConfig, runs: int) -> dict[str, int | None]:
    """The torch threads one local process of each stage computes on, on a CPU, as `llmaudit audit` starts them
    (`jobs.local`): the cores divided among `score.processes` scoring processes, and among `train.processes`
    training processes (at most one per run); None where the stage runs in one process. A built-in model keeps its
    own count (`configure_threads`: one thread).

    Args:
        cfg: the experiment's config.
        runs: the runs to train.

    Returns:
        {"train": threads or None, "score": threads or None}.
    """
    if is_builtin(cfg.model):
        return {"train": None, "score": None}
    train, score = min(cfg.train.processes, max(runs, 1)), cfg.score.processes
    return {
        "train": threads_per_process(train) if train > 1 else None,
        "score": threads_per_process(score) if score > 1 else None,
    }


def local_parallelism(processes: int, items: int, *, on_cpu: bool) -> int:
    """How many of a stage's local processes (`train.processes`, `score.processes`) shorten its wall time: on a CPU,
    as many as there are cores and items (runs, units), each process measured on its share of the cores
    (`stage_threads`; the built-in tiny model on its one thread); on a GPU 1, since the processes share the device
    the throughput was measured on.

    Args:
        processes: the setting.
        items: the stage's runs or units.
        on_cpu: the stage computes on this machine's CPU.

    Returns:
        The divisor of the stage's seconds.
    """
    return max(1, min(processes, items, available_cores())) if on_cpu else 1


def processes_note(e: dict[str, Any]) -> str:
    """What the plan's time line says of the local processes that shorten it.

    Args:
        e: the plan's estimate.

    Returns:
        The note, or "" when no stage runs several processes at once.
    """
    parts = [f"{e.get(k, 1)} {what}" for k, what in (("train_processes", "training"), ("score_processes", "scoring"))]
    return (
        f" ({' and '.join(parts)} processes at once)"
        if e.get("train_processes", 1) * e.get("score_processes", 1) > 1
        else ""
    )
