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
import ctypes
import ctypes.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psutil
import torch

from llmaudit.score.engine import score_examples

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


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _heap_in_use_reader() -> Callable[[], int] | None:
    """Bytes the C heap has handed out and not taken back (glibc mallinfo2: arenas' in-use chunks plus
    mmapped blocks, all threads), i.e. live memory without the allocator's free lists; None off glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2

    def read() -> int:
        info = mallinfo2()
        return int(info.uordblks + info.hblkhd)

    return read


class PeakMemory:
    """Peak memory of a block above what was in use when it started (see the module docstring): on CPU
    `peak_bytes` is the resident high-water mark and `live_bytes` the peak of the C heap in use (sampled);
    on GPU both are torch.cuda.max_memory_allocated."""

    def __init__(self, device: torch.device, interval_s: float = 0.0005):
        self.device, self.interval_s = device, interval_s
        self.peak_bytes = 0
        self.live_bytes: int | None = None
        self.how = ""

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            self.how = "torch.cuda.max_memory_allocated"
            return self
        self._proc = psutil.Process()
        self._heap = _heap_in_use_reader()
        self._hwm = _reset_high_water_mark()
        self._base = self._proc.memory_info().rss
        self.how = "kernel high-water mark (VmHWM)" if self._hwm else "RSS sampled every 0.5 ms"
        self._heap_base = self._heap() if self._heap else 0
        self._rss_peak, self._heap_peak = self._base, self._heap_base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            if not self._hwm:
                self._rss_peak = max(self._rss_peak, self._proc.memory_info().rss)
            if self._heap:
                self._heap_peak = max(self._heap_peak, self._heap())
            time.sleep(self.interval_s)

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
            self.live_bytes = self.peak_bytes
            return
        self._stop.set()
        self._thread.join()
        rss = _high_water_mark() if self._hwm else max(self._rss_peak, self._proc.memory_info().rss)
        self.peak_bytes = rss - self._base
        if self._heap:
            self.live_bytes = max(self._heap_peak, self._heap()) - self._heap_base


def _high_water_mark() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


def _reset_high_water_mark() -> bool:
    """Reset the kernel's peak-RSS counter of this process (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _high_water_mark()
        return True
    except OSError:
        return False


def timed_rounds(
    methods: dict[str, Callable[[], list[np.ndarray]]], device: torch.device, repeats: int
) -> dict[str, tuple[list[np.ndarray], float, float]]:
    """Each method's result and median wall and process CPU seconds over `repeats` rounds; within a round
    the methods run one after the other, so drift in the machine's speed affects all of them alike."""
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in methods}
    results: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for name, fn in methods.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0, c0 = time.perf_counter(), time.process_time()
            results[name] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - t0)
            cpu_seconds[name].append(time.process_time() - c0)
    return {
        name: (results[name], statistics.median(seconds[name]), statistics.median(cpu_seconds[name]))
        for name in methods
    }


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


def peak_memory_here(fn: Callable[[], Any], device: torch.device) -> tuple[int, int | None, str]:
    """Peak memory of one method in this process. GPU: torch.cuda.max_memory_allocated, reset just before,
    above the allocation before (the other methods' tensors are freed by then; cached blocks do not count).
    CPU (--memory in-process, a quick look only): as PeakMemory measures it, but after the other methods, whose
    freed memory the C allocator may hand back to this one."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    with PeakMemory(device) as mem:
        fn()
    return mem.peak_bytes, mem.live_bytes, mem.how + ("" if device.type == "cuda" else ", in process")


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
    args = parser.parse_args(argv)
    if args.memory_probe:
        memory_probe(args)
        return

    device, dtype, model, examples = setup(args)
    all_tokens = sum(len(ids) for ids, _ in examples)
    scored = sum(sum(m[1:]) for _, m in examples)
    body = model.get_decoder()
    params_body = sum(p.numel() for p in body.parameters()) - body.embed_tokens.weight.numel()
    flops = 2 * params_body * all_tokens + 2 * args.hidden * args.vocab * scored
    peak_n = args.peak_n or (8192 if device.type == "cuda" else 2048)
    peak_flops, peak_flops_cpu = matmul_peak_flops(device, dtype, peak_n)

    load = os.getloadavg()[0]
    print(
        f"device {device} ({torch.get_num_threads()} threads, load average {load:.1f} on {os.cpu_count()} cores), torch {torch.__version__}, dtype {dtype}"
    )
    if device.type == "cuda":
        print(f"gpu: {torch.cuda.get_device_name(device)}")
    print(
        f"model: Qwen2 hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; body params {params_body / 1e6:.2f} M"
    )
    print(
        f"data: {len(examples)} samples, lengths {args.min_len}-{args.max_len}, {all_tokens} tokens, {scored} scored (half prompt)"
    )
    print(
        f"needed work: 2*{params_body}*{all_tokens} + 2*{args.hidden}*{args.vocab}*{scored} = {flops / 1e9:.1f} GFLOP"
    )
    print(
        f"matmul peak ({dtype}, {peak_n}^2 torch.mm): {peak_flops / 1e9:.1f} GFLOP/s per wall s, {peak_flops_cpu / 1e9:.1f} per CPU s"
    )
    print(
        f"engine: token_budget {args.token_budget}, head_chunk {args.head_chunk}, cpu_workers {args.cpu_workers or 'auto'}"
        f"; {args.repeats} timed round(s), median"
    )

    names = [m for m in METHODS if not (args.no_naive and m == "naive")]
    methods = {name: method_fn(name, model, examples, device, args) for name in names}
    warm = examples[:2]  # thread pools, allocator, kernels
    for name in names:
        method_fn(name, model, warm, device, args)()
    timings = timed_rounds(methods, device, args.repeats)
    if args.memory == "in-process" or (args.memory == "auto" and device.type == "cuda"):
        memory = {name: peak_memory_here(methods[name], device) for name in names}
    else:
        memory = {name: probe_memory(name, args) for name in names}

    naive = timings["naive"][0] if "naive" in timings else None
    t_ref, c_ref = (timings["naive"][1], timings["naive"][2]) if naive is not None else (None, None)
    rows: dict[str, dict[str, Any]] = {}
    for name in names:
        result, t, c = timings[name]
        rows[name] = {
            "wall_s": t,
            "cpu_s": c,
            "tokens_per_s": all_tokens / t,
            "ratio": t_ref / t if t_ref else None,
            "cpu_ratio": c_ref / c if c_ref else None,
            "of_peak": flops / t / peak_flops,
            "cpu_of_peak": flops / c / peak_flops_cpu,
            "peak_bytes": memory[name][0],
            "live_bytes": memory[name][1],
            "max_dloss": None,
            "max_dtoken": None,
        }
        if naive is not None and name != "naive":
            rows[name]["max_dloss"] = max(
                (
                    abs(float(a.astype(np.float64).mean()) - float(b.astype(np.float64).mean()))
                    for a, b in zip(result, naive)
                    if len(b)
                ),
                default=0.0,
            )
            rows[name]["max_dtoken"] = max(
                (float(np.abs(a - b).max(initial=0.0)) for a, b in zip(result, naive)), default=0.0
            )
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
    elif memory[names[0]][2].endswith("in process"):
        print("(memory measured in this process after the timed rounds (--memory in-process): a rough look only)")
    else:
        print(
            f"(each method in a fresh process, above the memory in use before it; live MiB: peak of the C heap in use"
            f" (glibc mallinfo2, sampled every 0.5 ms, all threads); RSS MiB: {memory[names[0]][2]}, which also counts"
            " the allocator's caches and fragmentation)"
        )

    scaling: dict[str, dict[str, list[int | None]]] = {}
    if not args.no_scaling:
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

    target_ratio, target_frac = (10, 0.40) if device.type == "cuda" else (3, 0.50)
    print(
        f"\ntargets on {device.type}: ratio >= {target_ratio}, >= {target_frac:.0%} of matmul peak, max |dloss| <= 1e-5"
        f"; load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    if args.json:
        report = {
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "dtype": str(dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "model": {"hidden": args.hidden, "layers": args.layers, "vocab": args.vocab, "params_body": params_body},
            "samples": len(examples),
            "tokens": all_tokens,
            "scored_tokens": scored,
            "flops": flops,
            "matmul_peak_flops": peak_flops,
            "matmul_peak_flops_cpu": peak_flops_cpu,
            "token_budget": args.token_budget,
            "head_chunk": args.head_chunk,
            "repeats": args.repeats,
            "memory_how": memory[names[0]][2],
            "methods": rows,
            "scaling": scaling,
            "targets": {"ratio": target_ratio, "of_peak": target_frac},
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
