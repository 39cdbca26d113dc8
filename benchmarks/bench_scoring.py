"""Scoring engine vs the naive loop, on a tiny Qwen2 with a realistic vocabulary (built in code).

    python benchmarks/bench_scoring.py                          # defaults: about 2 minutes on 2 CPU cores
    python benchmarks/bench_scoring.py --samples 128 --max-len 1024 --vocab 65536 --repeats 1 --no-scaling

Methods, run in this one process on the same model and the same samples:
  naive   one sample at a time, `model(input_ids, labels=...)` with full [T, V] logits, then the per-token
          losses recomputed from those logits (log_softmax + gather), as a user without the engine would.
  engine  `llmaudit.scoring.score_examples` (length-sorted padded batches, head on scored positions only,
          in chunks), once with vocab_stats off (the naive loop's workload) and once with them on
          (Min-K%++ statistics, the `llmaudit score` default).

Reported per method: wall and process CPU seconds and tokens/s (all input tokens, prompt included, per
wall second; median of --repeats rounds, the methods interleaved within each round so that a slow
stretch of a shared CPU hits all of them), peak memory, and for the engine the speed-up over naive, the
max abs per-sample and per-token loss difference from naive, and the achieved FLOP rate as a fraction
of this machine's own matmul peak.

FLOP count (needed work only):  2 * params_body * all_tokens + 2 * hidden * vocab * scored_positions,
where params_body = parameters of the decoder body without the token embedding (a lookup, no matmul).
Attention-score FLOPs (QK^T, AV) are not counted, so the fraction slightly understates the real rate.
Matmul peak: the best of a few large square torch.mm (--peak-n) in this process, fp32 on CPU, bf16 on GPU,
per wall second and per process CPU second; "CPU of peak" divides FLOPs per CPU second by the latter, a
measure that other processes on a shared CPU disturb much less than wall time (OpenMP spin-waiting
counts as CPU time, so with several threads it understates the rate).

Peak memory on CPU: each method once more in a fresh Python process (the same model and samples, built
from the same seed), so that no other method's allocations or allocator caches are counted or reused. On
Linux the kernel's high-water mark of resident memory (VmHWM) is reset just before the method
(/proc/self/clear_refs) and read after it; the figure is that peak minus the RSS before the method, i.e.
the memory the method itself needs on top of the model. Elsewhere a psutil thread samples RSS every 2 ms.
On GPU: each method once more in this process, torch.cuda.max_memory_allocated (its peak reset just
before the method) minus the allocation before, i.e. the live tensors the method needs on top of the
model; the caching allocator's reserve is not counted. Unless --no-scaling, the probes are repeated (in
fresh processes) with twice the vocabulary and with twice the maximum length, to show which method's
memory grows with length x vocabulary. --memory in-process measures CPU memory in this process too (quick,
rough: after the other methods, whose freed memory the allocator may reuse); --memory fresh, GPU memory in
fresh processes.

--json PATH writes every figure above (per method: seconds, tokens/s, ratio, share of peak, peak memory,
max loss differences) for scripts such as benchmarks/gpu_check.py. --dtype float32 runs a GPU in float32
(the tests compare the engine with the naive loop to 1e-5 that way; bf16 results differ by bf16 rounding).

Targets (issue 4): CPU ratio >= 3 and >= 50% of matmul peak; GPU ratio >= 10 and >= 40% of bf16
roofline; losses identical to 1e-5; engine peak memory independent of batch x length x vocab.
The CPU is shared: check `uptime` and rerun if the load average exceeds the core count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from llmaudit.score.engine import score_examples

if str(Path(__file__).resolve().parent) not in sys.path:  # scoring_measure.py, beside this script
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from scoring_measure import PeakMemory, matmul_peak_flops, peak_memory_here, timed_rounds  # noqa: E402

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
    if device.type == "cuda":  # random initialisation on the GPU itself: seconds, not a minute, at 0.5 B parameters
        with torch.device(device):
            return Qwen2ForCausalLM(config).to(dtype=dtype).eval()
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


def engine_scores(
    model: Any, examples: list[Example], device: torch.device, args: argparse.Namespace, vocab_stats: bool
) -> list[np.ndarray]:
    scores = score_examples(
        model,
        examples,
        pad_id=0,
        token_budget=args.token_budget,
        head_chunk=args.head_chunk,
        vocab_stats=vocab_stats,
        device=device,
        cpu_workers=args.cpu_workers,
    )
    return [s.token_losses for s in scores]


def probe_memory(method: str, args: argparse.Namespace, **changes: int) -> tuple[int, int | None, str]:
    """Peak memory of one method, run once in a fresh process (this script with --memory-probe)."""
    argv = [sys.executable, os.path.abspath(__file__), "--memory-probe", method]
    for key, value in {**vars(args), **changes}.items():
        if (
            key in ("memory_probe", "json", "no_naive", "no_scaling", "repeats", "peak_n")
            or value is None
            or value is False
        ):
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"memory probe {method} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result = json.loads(lines[-1])
    return int(result["peak_bytes"]), result["live_bytes"], str(result["how"])


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


METHODS = ("naive", "engine vocab_stats=off", "engine vocab_stats=on")


def method_fn(
    name: str, model: Any, examples: list[Example], device: torch.device, args: argparse.Namespace
) -> Callable[[], list[np.ndarray]]:
    if name == "naive":
        return lambda: naive_scores(model, examples, device)
    vocab_stats = name.endswith("=on")
    return lambda: engine_scores(model, examples, device, args, vocab_stats)


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype, Any, list[Example]]:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    if args.token_budget is None:
        args.token_budget = 16384 if device.type == "cuda" else 2048
    if args.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = getattr(torch, args.dtype)
    return device, dtype, build_model(args, device, dtype), make_examples(args)


def memory_probe(args: argparse.Namespace) -> None:
    """Child process: run one method on a fresh heap and print its peak memory as a JSON line."""
    device, _, model, examples = setup(args)
    fn = method_fn(args.memory_probe, model, examples, device, args)
    with PeakMemory(device) as mem:
        fn()
    print(
        json.dumps(
            {"method": args.memory_probe, "peak_bytes": mem.peak_bytes, "live_bytes": mem.live_bytes, "how": mem.how}
        )
    )


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="padded tokens per batch; default: what `llmaudit score` uses (2048 on CPU, 16384 on GPU)",
    )
    parser.add_argument("--head-chunk", type=int, default=1024)
    parser.add_argument(
        "--cpu-workers",
        type=int,
        default=None,
        help="engine threads scoring batches concurrently on CPU (default: what `llmaudit score` uses, one per core)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument(
        "--peak-n", type=int, default=None, help="matmul size for the peak (default 2048 CPU, 8192 GPU)"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _model_options(parser)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="model dtype (auto: bfloat16 on GPU, float32 on CPU)",
    )
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument(
        "--memory",
        default="auto",
        choices=["auto", "fresh", "in-process"],
        help="peak memory per method: in fresh processes (auto on CPU) or in this process (auto on GPU)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--no-naive", action="store_true", help="skip the naive loop (engine numbers only)")
    parser.add_argument(
        "--no-scaling", action="store_true", help="skip the memory probes at 2x vocabulary and 2x length"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--memory-probe", choices=METHODS, default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


@dataclass
class Bench:
    """The model and samples of one run, the work they need and this machine's matmul peak (measured here)."""

    args: argparse.Namespace
    device: torch.device
    dtype: torch.dtype
    model: Any
    examples: list[Example]
    all_tokens: int = field(init=False)
    scored: int = field(init=False)
    params_body: int = field(init=False)
    flops: int = field(init=False)
    peak_n: int = field(init=False)
    peak_flops: float = field(init=False)
    peak_flops_cpu: float = field(init=False)

    def __post_init__(self) -> None:
        args, examples = self.args, self.examples
        self.all_tokens = sum(len(ids) for ids, _ in examples)
        self.scored = sum(sum(m[1:]) for _, m in examples)
        body = self.model.get_decoder()
        self.params_body = sum(p.numel() for p in body.parameters()) - body.embed_tokens.weight.numel()
        self.flops = 2 * self.params_body * self.all_tokens + 2 * args.hidden * args.vocab * self.scored
        self.peak_n = args.peak_n or (8192 if self.device.type == "cuda" else 2048)
        self.peak_flops, self.peak_flops_cpu = matmul_peak_flops(self.device, self.dtype, self.peak_n)


def print_setting(b: Bench) -> None:
    args, device, dtype = b.args, b.device, b.dtype
    load = os.getloadavg()[0]
    print(
        f"device {device} ({torch.get_num_threads()} threads, load average {load:.1f} on {os.cpu_count()} cores), torch {torch.__version__}, dtype {dtype}"
    )
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(device)}")
    print(
        f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; body params {b.params_body / 1e6:.2f} M"
    )
    print(
        f"data: {len(b.examples)} samples, lengths {args.min_len}-{args.max_len}, {b.all_tokens} tokens, {b.scored} scored (half prompt)"
    )
    print(
        f"needed work: 2*{b.params_body}*{b.all_tokens} + 2*{args.hidden}*{args.vocab}*{b.scored} = {b.flops / 1e9:.1f} GFLOP"
    )
    print(
        f"matmul peak ({dtype}, {b.peak_n}^2 torch.mm): {b.peak_flops / 1e9:.1f} GFLOP/s per wall s, {b.peak_flops_cpu / 1e9:.1f} per CPU s"
    )
    print(
        f"engine: token_budget {args.token_budget}, head_chunk {args.head_chunk}, cpu_workers {args.cpu_workers or 'auto'}"
        f"; {args.repeats} timed round(s), median"
    )


Memory = dict[str, tuple[int, int | None, str]]


def measure(b: Bench, names: list[str]) -> tuple[dict[str, tuple[list[np.ndarray], float, float]], Memory]:
    """Each method's timed rounds (after a warm-up), then its peak memory."""
    args = b.args
    methods = {name: method_fn(name, b.model, b.examples, b.device, args) for name in names}
    warm = b.examples[:2]  # thread pools, allocator, kernels
    for name in names:
        method_fn(name, b.model, warm, b.device, args)()
    timings = timed_rounds(methods, b.device, args.repeats)
    if args.memory == "in-process" or (args.memory == "auto" and b.device.type == "cuda"):
        memory = {name: peak_memory_here(methods[name], b.device) for name in names}
    else:
        memory = {name: probe_memory(name, args) for name in names}
    return timings, memory


def _differences(result: list[np.ndarray], naive: list[np.ndarray]) -> tuple[float, float]:
    """max |per-sample loss difference| and max |per-token loss difference| against the naive loop."""
    max_dloss = max(
        (
            abs(float(a.astype(np.float64).mean()) - float(b.astype(np.float64).mean()))
            for a, b in zip(result, naive)
            if len(b)
        ),
        default=0.0,
    )
    max_dtoken = max((float(np.abs(a - b).max(initial=0.0)) for a, b in zip(result, naive)), default=0.0)
    return max_dloss, max_dtoken


def method_rows(b: Bench, timings: dict[str, tuple[list[np.ndarray], float, float]], memory: Memory) -> dict:
    naive = timings["naive"][0] if "naive" in timings else None
    t_ref, c_ref = (timings["naive"][1], timings["naive"][2]) if naive is not None else (None, None)
    rows: dict[str, dict[str, Any]] = {}
    for name, (result, t, c) in timings.items():
        rows[name] = {
            "wall_s": t,
            "cpu_s": c,
            "tokens_per_s": b.all_tokens / t,
            "ratio": t_ref / t if t_ref else None,
            "cpu_ratio": c_ref / c if c_ref else None,
            "of_peak": b.flops / t / b.peak_flops,
            "cpu_of_peak": b.flops / c / b.peak_flops_cpu,
            "peak_bytes": memory[name][0],
            "live_bytes": memory[name][1],
            "max_dloss": None,
            "max_dtoken": None,
        }
        if naive is not None and name != "naive":
            rows[name]["max_dloss"], rows[name]["max_dtoken"] = _differences(result, naive)
    return rows


def print_rows(rows: dict[str, dict[str, Any]], device: torch.device, memory_how: str) -> None:
    print()
    print(
        f"{'method':<24} {'wall s':>7} {'CPU s':>7} {'tokens/s':>9} {'ratio':>6} {'CPU ratio':>9} {'live MiB':>8} {'RSS MiB':>7} "
        f"{'of peak':>7} {'CPU of peak':>11} {'max |dloss|':>11} {'max |dtoken|':>12}"
    )
    for name, r in rows.items():
        sd = "-" if r["max_dloss"] is None else f"{r['max_dloss']:.1e}"
        td = "-" if r["max_dtoken"] is None else f"{r['max_dtoken']:.1e}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        c_ratio = "-" if r["cpu_ratio"] is None else f"{r['cpu_ratio']:.2f}"
        print(
            f"{name:<24} {r['wall_s']:7.2f} {r['cpu_s']:7.2f} {r['tokens_per_s']:9.0f} {ratio:>6} {c_ratio:>9} "
            f"{_mib(r['live_bytes']):>8} {_mib(r['peak_bytes']):>7} {r['of_peak']:7.0%} {r['cpu_of_peak']:11.0%} {sd:>11} {td:>12}"
        )
    print("(ratio, of peak: wall time; CPU ratio, CPU of peak: process CPU time, less sensitive to other load)")
    if device.type == "cuda":
        print(
            "(live MiB = RSS MiB: torch.cuda.max_memory_allocated, reset before each method, above the allocation before it)"
        )
    elif memory_how.endswith("in process"):
        print("(memory measured in this process after the timed rounds (--memory in-process): a rough look only)")
    else:
        print(
            f"(each method in a fresh process, above the memory in use before it; live MiB: peak of the C heap in use"
            f" (glibc mallinfo2, sampled every 0.5 ms, all threads); RSS MiB: {memory_how}, which also counts"
            " the allocator's caches and fragmentation)"
        )


def scaling_table(args: argparse.Namespace, names: list[str], memory: Memory) -> dict[str, dict[str, list]]:
    """Peak memory per method at the run's size, at twice the vocabulary and at twice the length (printed)."""
    scaling: dict[str, dict[str, list[int | None]]] = {}
    if args.no_scaling:
        return scaling
    print("\npeak live MiB / RSS MiB as the workload grows (fresh process per cell):")
    cells = {
        "as above": {},
        f"vocab {2 * args.vocab}": {"vocab": 2 * args.vocab},
        f"max length {2 * args.max_len}": {"max_len": 2 * args.max_len},
    }
    print(f"{'method':<24} " + " ".join(f"{label:>18}" for label in cells))
    for name in names:
        row = [memory[name] if not change else probe_memory(name, args, **change) for change in cells.values()]
        print(f"{name:<24} " + " ".join(f"{f'{_mib(live)} / {_mib(rss)}':>18}" for rss, live, _ in row))
        scaling[name] = {label: [rss, live] for label, (rss, live, _) in zip(cells, row)}
    return scaling


def print_targets(device: torch.device) -> dict[str, float]:
    target_ratio, target_frac = (10, 0.40) if device.type == "cuda" else (3, 0.50)
    print(
        f"\ntargets on {device.type}: ratio >= {target_ratio}, >= {target_frac:.0%} of matmul peak, max |dloss| <= 1e-5"
        f"; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    return {"ratio": target_ratio, "of_peak": target_frac}


def write_json(path: str, b: Bench, rows: dict, memory_how: str, scaling: dict, targets: dict) -> None:
    args, device = b.args, b.device
    report = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": str(b.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "model": {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "params_body": b.params_body},
        "samples": len(b.examples),
        "tokens": b.all_tokens,
        "scored_tokens": b.scored,
        "flops": b.flops,
        "matmul_peak_flops": b.peak_flops,
        "matmul_peak_flops_cpu": b.peak_flops_cpu,
        "token_budget": args.token_budget,
        "head_chunk": args.head_chunk,
        "repeats": args.repeats,
        "memory_how": memory_how,
        "methods": rows,
        "scaling": scaling,
        "targets": targets,
    }
    with open(path, "w") as f:
        json.dump(report, f, indent=1)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.memory_probe:
        memory_probe(args)
        return
    b = Bench(args, *setup(args))
    print_setting(b)
    names = [m for m in METHODS if not (args.no_naive and m == "naive")]
    timings, memory = measure(b, names)
    rows = method_rows(b, timings, memory)
    memory_how = memory[names[0]][2]
    print_rows(rows, b.device, memory_how)
    scaling = scaling_table(args, names, memory)
    targets = print_targets(b.device)
    if args.json:
        write_json(args.json, b, rows, memory_how, scaling, targets)


if __name__ == "__main__":
    main()
