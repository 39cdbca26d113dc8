"""Scoring engine vs the naive loop, on a tiny Qwen2 with a realistic vocabulary (built in code).

    python benchmarks/bench_scoring.py                          # defaults: about 1-2 minutes on 2 CPU cores
    python benchmarks/bench_scoring.py --samples 128 --max-len 1024 --vocab 65536 --repeats 1

Methods, run in this one process on the same model and the same samples:
  naive   one sample at a time, `model(input_ids, labels=...)` with full [T, V] logits, then the per-token
          losses recomputed from those logits (log_softmax + gather), as a user without the engine would.
  engine  `llmaudit.scoring.score_examples` (length-sorted padded batches, head on scored positions only,
          in chunks), once with vocab_stats off (the naive loop's workload) and once with them on
          (Min-K%++ statistics, the `llmaudit score` default).

Reported per method: wall and process CPU seconds and tokens/s (all input tokens, prompt included, per
wall second; median of --repeats),
peak memory, and for the engine the speed-up over naive, the max abs per-sample and per-token loss
difference from naive, and the achieved FLOP rate as a fraction of this machine's own matmul peak.

FLOP count (needed work only):  2 * params_body * all_tokens + 2 * hidden * vocab * scored_positions,
where params_body = parameters of the decoder body without the token embedding (a lookup, no matmul).
Attention-score FLOPs (QK^T, AV) are not counted, so the fraction slightly understates the real rate.
Matmul peak: the best of a few large square torch.mm (--peak-n) in this process, fp32 on CPU, bf16 on GPU,
per wall second and per process CPU second; "CPU of peak" divides FLOPs per CPU second by the latter, a
measure that other processes on a shared CPU disturb much less than wall time (OpenMP spin-waiting
counts as CPU time, so with several threads it understates the rate).

Peak memory: on CPU, the process RSS sampled every 2 ms by a psutil thread, minus the RSS just before
the method starts (allocations shorter than the interval can be missed; freed memory that the allocator
keeps counts until reused). On GPU, torch.cuda.max_memory_allocated minus the allocation before.

Targets (issue 4): CPU ratio >= 3 and >= 50% of matmul peak; GPU ratio >= 10 and >= 40% of bf16
roofline; losses identical to 1e-5; engine peak memory independent of batch x length x vocab.
The CPU is shared: check `uptime` and rerun if the load average exceeds the core count.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from typing import Any, Callable

import numpy as np
import psutil
import torch

from llmaudit.scoring import score_examples

Example = tuple[list[int], list[bool]]


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    config = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or 4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        max_position_embeddings=max(2048, args.max_len),
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def make_examples(args: argparse.Namespace) -> list[Example]:
    """Lengths uniform in [min_len, max_len]; the first half of each sample is prompt (not scored)."""
    rng = np.random.default_rng(args.seed)
    out = []
    for length in rng.integers(args.min_len, args.max_len + 1, size=args.samples):
        ids = rng.integers(1, args.vocab, size=int(length)).tolist()
        n_prompt = int(length) // 2
        out.append((ids, [False] * n_prompt + [True] * (int(length) - n_prompt)))
    return out


@torch.inference_mode()
def naive_scores(model: Any, examples: list[Example], device: torch.device) -> list[np.ndarray]:
    out = []
    for ids, mask in examples:
        input_ids = torch.tensor([ids], device=device)
        scored = torch.tensor(mask, device=device)
        scored[0] = False  # nothing predicts the first token
        labels = input_ids.masked_fill(~scored[None], -100)
        logits = model(input_ids=input_ids, labels=labels).logits[0]  # [T, V]
        logp = torch.log_softmax(logits.float(), dim=-1)
        token_nll = -logp[:-1].gather(1, input_ids[0, 1:, None]).squeeze(1)
        out.append(token_nll[scored[1:]].cpu().numpy())
    return out


def engine_scores(model: Any, examples: list[Example], device: torch.device, args: argparse.Namespace, vocab_stats: bool) -> list[np.ndarray]:
    scores = score_examples(
        model, examples, pad_id=0, token_budget=args.token_budget, head_chunk=args.head_chunk, vocab_stats=vocab_stats, device=device
    )
    return [s.token_losses for s in scores]


class PeakMemory:
    """Peak memory of a block above what was in use when it started (see the module docstring)."""

    def __init__(self, device: torch.device, interval_s: float = 0.002):
        self.device, self.interval_s = device, interval_s
        self.peak_bytes = 0

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        self._proc = psutil.Process()
        self._base = self._proc.memory_info().rss
        self._peak = self._base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(self.interval_s)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            return
        self._stop.set()
        self._thread.join()
        self._peak = max(self._peak, self._proc.memory_info().rss)
        self.peak_bytes = self._peak - self._base


def timed(fn: Callable[[], list[np.ndarray]], device: torch.device, repeats: int) -> tuple[list[np.ndarray], float, float, int]:
    """Result, median wall seconds and median process CPU seconds over `repeats`, largest peak memory."""
    seconds, cpu_seconds, peak, result = [], [], 0, None
    for _ in range(repeats):
        with PeakMemory(device) as mem:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            result = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(time.process_time() - c0)
        peak = max(peak, mem.peak_bytes)
    return result, statistics.median(seconds), statistics.median(cpu_seconds), peak  # type: ignore[return-value]


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, n: int, tries: int = 5) -> tuple[float, float]:
    """Best FLOP/s of a square torch.mm over `tries`, per wall second and per process CPU second."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best, best_cpu = 0.0, 0.0
    for _ in range(tries):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        best_cpu = max(best_cpu, 2 * n**3 / max(time.process_time() - c0, 1e-9))
    return best, best_cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--token-budget", type=int, default=None,
                        help="padded tokens per batch; default: what `llmaudit score` uses (2048 on CPU, 16384 on GPU)")
    parser.add_argument("--head-chunk", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=1, help="timed repeats per method (median reported)")
    parser.add_argument("--peak-n", type=int, default=None, help="matmul size for the peak (default 2048 CPU, 8192 GPU)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive loop (engine numbers only)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu")
    if args.token_budget is None:
        args.token_budget = 16384 if device.type == "cuda" else 2048
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = build_model(args, device, dtype)
    examples = make_examples(args)

    all_tokens = sum(len(ids) for ids, _ in examples)
    scored = sum(sum(m[1:]) for _, m in examples)
    body = model.get_decoder()
    params_body = sum(p.numel() for p in body.parameters()) - body.embed_tokens.weight.numel()
    flops = 2 * params_body * all_tokens + 2 * args.hidden * args.vocab * scored
    peak_flops, peak_flops_cpu = matmul_peak_flops(device, dtype, args.peak_n or (8192 if device.type == "cuda" else 2048))

    load = os.getloadavg()[0]
    print(f"device {device} ({torch.get_num_threads()} threads, load average {load:.1f} on {os.cpu_count()} cores), torch {torch.__version__}, dtype {dtype}")
    print(f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; body params {params_body / 1e6:.2f} M")
    print(f"data: {len(examples)} samples, lengths {args.min_len}-{args.max_len}, {all_tokens} tokens, {scored} scored (half prompt)")
    print(f"needed work: 2*{params_body}*{all_tokens} + 2*{args.hidden}*{args.vocab}*{scored} = {flops / 1e9:.1f} GFLOP")
    print(f"matmul peak ({dtype}, {args.peak_n or (8192 if device.type == 'cuda' else 2048)}^2 torch.mm): {peak_flops / 1e9:.1f} GFLOP/s per wall s, {peak_flops_cpu / 1e9:.1f} per CPU s")
    print(f"engine: token_budget {args.token_budget}, head_chunk {args.head_chunk}; {args.repeats} timed repeat(s) per method, median")

    warm = examples[:2]  # thread pools, allocator, kernels
    naive_scores(model, warm, device)
    engine_scores(model, warm, device, args, vocab_stats=True)

    rows = []
    naive = None
    if not args.no_naive:
        naive, t_naive, c_naive, mem_naive = timed(lambda: naive_scores(model, examples, device), device, args.repeats)
        rows.append(("naive", t_naive, c_naive, mem_naive, None, None))
    for vocab_stats in (False, True):
        eng, t_eng, c_eng, mem_eng = timed(lambda: engine_scores(model, examples, device, args, vocab_stats), device, args.repeats)
        if naive is not None:
            sample_diff = max(abs(float(a.astype(np.float64).mean()) - float(b.astype(np.float64).mean())) for a, b in zip(eng, naive))
            token_diff = max(float(np.abs(a - b).max()) for a, b in zip(eng, naive))
        else:
            sample_diff = token_diff = None
        rows.append((f"engine vocab_stats={'on' if vocab_stats else 'off'}", t_eng, c_eng, mem_eng, sample_diff, token_diff))

    print()
    print(f"{'method':<24} {'wall s':>7} {'CPU s':>7} {'tokens/s':>9} {'ratio':>6} {'CPU ratio':>9} {'peak MiB':>8} "
          f"{'of peak':>7} {'CPU of peak':>11} {'max |dloss|':>11} {'max |dtoken|':>12}")
    t_ref, c_ref = (rows[0][1], rows[0][2]) if naive is not None else (None, None)
    for name, t, c, mem, sample_diff, token_diff in rows:
        ratio = f"{t_ref / t:.2f}" if t_ref else "-"
        c_ratio = f"{c_ref / c:.2f}" if c_ref else "-"
        sd = "-" if sample_diff is None else f"{sample_diff:.1e}"
        td = "-" if token_diff is None else f"{token_diff:.1e}"
        print(f"{name:<24} {t:7.2f} {c:7.2f} {all_tokens / t:9.0f} {ratio:>6} {c_ratio:>9} {mem / 2**20:8.0f} "
              f"{flops / t / peak_flops:7.0%} {flops / c / peak_flops_cpu:11.0%} {sd:>11} {td:>12}")
    print("(ratio, of peak: wall time; CPU ratio, CPU of peak: process CPU time, less sensitive to other load)")
    target_ratio, target_frac = (10, 0.40) if device.type == "cuda" else (3, 0.50)
    print(f"\ntargets on {device.type}: ratio >= {target_ratio}, >= {target_frac:.0%} of matmul peak, max |dloss| <= 1e-5"
          f"; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
