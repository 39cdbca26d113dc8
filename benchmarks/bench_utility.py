"""What the utility columns cost per scoring unit, against the unit itself, measured in one process on CPU.

For one recipe (default the CPU demo; `--recipe smollm2-135m-cpu` for the real SmolLM2-135M-Instruct), on the
recipe's own drawn validation and pool records, with the base model standing in for a fine-tuned checkpoint and
one quantizer (default uniform-5 for the demo, hqq-4 for SmolLM2; its quantization is timed apart):

- baseline: a final unit as `llmaudit score` scores it without utility columns (validation + pool, one pass);
- with the columns: the same unit of the quantized model, validation and pool in separate passes, the quantized
  pass compared with the reference states through the engine's hook (the KL pass), plus the reference pass of
  the unquantized model (what one checkpoint pays once when no identity quantizer scored it first);
- generation of the recipe's subset (score.generation_samples, max_new_tokens from the data), greedy, batched,
  on the quantized model.

Every timing is the median of --repeats runs after a warm-up, in this process; the script prints each part's
seconds and its ratio to the baseline unit, and the KL's agreement with a float64 computation from the full
logits of the same hidden states (the exactness check on a real vocabulary). The base model is not a fine-tune:
its answers need not stop where a fine-tuned model's would, so the generation time is closer to its upper bound
(every answer running to max_new_tokens), which the script also prints.

    python benchmarks/bench_utility.py [--recipe smollm2-135m-cpu] [--quantizer hqq-4] [--repeats 3] [--quick]
        [--kl-quantizers bnb-int8,hqq-8,bnb-nf4,hqq-4,uniform-4]

--kl-quantizers adds a table of llama.cpp's statistics (llmaudit.analyze.fidelity) of each named quantizer of the
base model against the base model on the validation records: mean KL with its token-level error, same top p,
RMS delta p and the perplexity ratio (one model, not fine-tuned: no interval over runs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import numpy as np
import torch


def _timed(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up (allocator, kernels); its result is kept
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def _setup(args):
    from llmaudit.config import load_recipe
    from llmaudit.data.tokenize import tokenize_records
    from llmaudit.finetune.experiment import draw_experiment
    from llmaudit.models.loading import load_base_model
    from llmaudit.quantize import get_quantizer

    cfg = load_recipe(args.recipe, args.overrides)
    draw = draw_experiment(cfg, echo=lambda *a: None)
    kw = dict(include_prompt=cfg.data.include_prompt_in_loss, max_length=10**9)
    val = tokenize_records(draw.tokenizer, draw.val, "val", **kw)
    pool = tokenize_records(draw.tokenizer, draw.pool, "pool", **kw)
    if args.quick:
        val, pool = val[:4], pool[:4]
    model = load_base_model(cfg.model, torch.device("cpu")).eval()
    name = args.quantizer or ("hqq-4" if "smollm2" in args.recipe else "uniform-5")
    opts = dict(cfg.score.quantizer_options.get(name, {"group_size": 64} if name.startswith("hqq") else {}))
    quantizer = get_quantizer(name, device="cpu", **opts)
    t0 = time.perf_counter()
    qmodel = quantizer.quantize_model(copy.deepcopy(model))
    return cfg, draw, val, pool, model, qmodel, name, time.perf_counter() - t0


def _kl_exactness(model, qmodel, examples, pad) -> float:
    """Largest |KL(one pass) - KL(float64 from full logits)| / mean KL over the first examples' positions."""
    from llmaudit.score.divergence import DivergenceCollector, ReferenceStates
    from llmaudit.score.engine import score_examples

    ref = ReferenceStates(examples)
    score_examples(model, examples, pad_id=pad, hidden_hook=ref.hook)
    kl_states = []

    def keep(batch, h, targets):
        kl_states.append((batch, h.clone()))

    collector = DivergenceCollector(ref, model.lm_head, qmodel.lm_head)
    score_examples(qmodel, examples, pad_id=pad, hidden_hook=lambda b, h, t: (collector.hook(b, h, t), keep(b, h, t)))
    errors, values = [], []
    for batch, h_q in kl_states:
        h_ref = torch.cat([ref.states[i] for i in batch])
        with torch.no_grad():
            lp_ref = torch.log_softmax(model.lm_head(h_ref).double(), -1)
            lp_q = torch.log_softmax(qmodel.lm_head(h_q).double(), -1)
        want = (lp_ref.exp() * (lp_ref - lp_q)).sum(-1).numpy()
        got = np.concatenate([collector.results[i].kl for i in batch])
        errors.append(np.abs(got - want))
        values.append(want)
    return float(np.concatenate(errors).max() / np.concatenate(values).mean())


def _kl_table(cfg, draw, model, val, pad, engine, names) -> dict:
    """llama.cpp's statistics of each quantizer of `model` against `model` on the validation examples (GPTQ
    calibrated on the first 16 pool records, as a run calibrates on its own training records)."""
    from llmaudit.analyze.fidelity import divergence_statistics
    from llmaudit.data.records import record_text
    from llmaudit.quantize import get_quantizer
    from llmaudit.score.divergence import DivergenceCollector, ReferenceStates
    from llmaudit.score.engine import score_examples

    pairs = [(e.input_ids, e.loss_mask) for e in val]
    reference = ReferenceStates(pairs)
    ref_scores = score_examples(model, pairs, hidden_hook=reference.hook, **engine)
    nll_ref = np.concatenate([s.token_losses for s in ref_scores])
    table = {}
    for name in names:
        opts = dict(cfg.score.quantizer_options.get(name, {"group_size": 64} if name.startswith("hqq") else {}))
        quantizer = get_quantizer(name, device="cpu", **opts)
        kwargs = {}
        if quantizer.calibrated:
            kwargs = {"tokenizer": draw.tokenizer, "calibration_texts": [record_text(r) for r in draw.pool[:16]]}
        qmodel = quantizer.quantize_model(copy.deepcopy(model), **kwargs)
        collector = DivergenceCollector(reference, model.lm_head, qmodel.get_output_embeddings())
        scores = score_examples(qmodel, pairs, hidden_hook=collector.hook, **engine)
        s = divergence_statistics(
            np.concatenate([r.kl for r in collector.results]),
            np.concatenate([r.same_top for r in collector.results]),
            np.concatenate([t.token_losses for t in scores]),
            nll_ref,
        )
        table[name] = {k: s[k] for k in ("n_tokens", "kl_mean", "kl_se", "kl_99", "same_top", "same_top_se")} | {
            k: s[k] for k in ("delta_p_rms", "delta_p_rms_se", "ppl_ratio", "ppl_ratio_se")
        }
        print(
            f"  {name:<10} KL {s['kl_mean']:.4g} ± {s['kl_se']:.2g}  (99%: {s['kl_99']:.3g})  same top "
            f"{s['same_top']:.4f} ± {s['same_top_se']:.4f}  RMS dp {s['delta_p_rms']:.4f}  PPL ratio "
            f"{s['ppl_ratio']:.4f} ± {s['ppl_ratio_se']:.4f}  ({s['n_tokens']} tokens)",
            flush=True,
        )
        del qmodel
    return table


def _arguments(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="demo-cpu")
    parser.add_argument("--quantizer", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4 validation and pool records (the test suite)")
    parser.add_argument("--json", default=None, help="also write the figures to this JSON file")
    parser.add_argument("--kl-quantizers", default="", help="comma-separated quantizers for the KL table")
    parser.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    return parser.parse_args(argv)


def _measure(args, cfg, draw, val, pool, model, qmodel, engine) -> dict:
    """The timings of the module docstring (seconds, medians of args.repeats) and what they produced."""
    from llmaudit.score.divergence import DivergenceCollector, ReferenceStates
    from llmaudit.score.engine import score_examples
    from llmaudit.score.generate import greedy_generate, plan_generation, stop_token_ids

    pairs = lambda ex: [(e.input_ids, e.loss_mask) for e in ex]  # noqa: E731
    out = {}
    out["baseline_unit_scoring_s"], _ = _timed(
        lambda: score_examples(qmodel, pairs(val + pool), **engine), args.repeats
    )
    out["val_pass_s"], _ = _timed(lambda: score_examples(qmodel, pairs(val), **engine), args.repeats)
    pool_s, _ = _timed(lambda: score_examples(qmodel, pairs(pool), **engine), args.repeats)
    reference = ReferenceStates(pairs(val))
    out["reference_pass_s"], _ = _timed(
        lambda: score_examples(model, pairs(val), hidden_hook=reference.hook, **engine), args.repeats
    )

    def with_kl():
        collector = DivergenceCollector(reference, model.lm_head, qmodel.lm_head)
        score_examples(qmodel, pairs(val), hidden_hook=collector.hook, **engine)
        return collector

    kl_val_s, collector = _timed(with_kl, args.repeats)
    # the unit with the columns (validation with the KL hook, then the pool) minus the unit without
    out["kl_pass_extra_s"] = kl_val_s + pool_s - out["baseline_unit_scoring_s"]
    tok = draw.tokenizer
    plan = plan_generation(tok, draw.val[: len(val)], cfg.score.generation_samples, cfg.score.generation_max_new_tokens)

    def generate():
        return greedy_generate(
            qmodel,
            plan.prompts,
            max_new_tokens=plan.max_new_tokens,
            stop_ids=stop_token_ids(tok),
            pad_id=engine["pad_id"],
        )

    out["generation_s"], answers = _timed(generate, max(1, args.repeats // 2)) if plan else (0.0, [])
    out["generation_samples"] = len(plan.indices) if plan else 0
    out["generated_tokens"] = sum(len(a) for a in answers)
    out["generated_tokens_max"] = (len(plan.indices) * plan.max_new_tokens) if plan else 0
    out["mean_kl"] = float(np.concatenate([r.kl for r in collector.results]).mean())
    out["kl_max_error_vs_float64_relative_to_mean"] = _kl_exactness(model, qmodel, pairs(val[:8]), engine["pad_id"])
    return out


def _print(out: dict) -> None:
    base_s = out["baseline_unit_scoring_s"]
    unit_s = base_s + out["quantization_s"]
    print(
        f"\n{out['recipe']}, {out['quantizer']}, {out['val_records']} val + {out['pool_records']} pool records, "
        f"load {out['load_average']:.1f}"
    )
    answers = f"{out['generation_samples']} answers ({out['generated_tokens']}/{out['generated_tokens_max']} tokens)"
    for label, seconds in (
        ("final unit without utility columns (scoring)", base_s),
        ("  its quantization", out["quantization_s"]),
        ("KL pass (added to the unit)", out["kl_pass_extra_s"]),
        ("reference pass (once per checkpoint, no identity quantizer)", out["reference_pass_s"]),
        (f"generation of {answers}", out["generation_s"]),
    ):
        print(
            f"  {label:<72} {seconds:8.3f} s   x{seconds / base_s:.3f} of scoring, x{seconds / unit_s:.3f} of the unit"
        )
    added = out["kl_pass_extra_s"] + out["generation_s"]
    print(
        f"  added per quantized final unit: {added:.3f} s = {100 * added / unit_s:.1f}% of that unit (scoring + quantization)"
    )


def main(argv=None) -> dict:
    args = _arguments(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llmaudit.score.stage import token_budget

    cfg, draw, val, pool, model, qmodel, name, quantize_s = _setup(args)
    pad = draw.tokenizer.pad_token_id
    budget = token_budget(cfg, torch.device("cpu"))
    engine = dict(pad_id=pad, token_budget=budget, head_chunk=cfg.score.head_chunk, vocab_stats=cfg.score.vocab_stats)
    out = {
        "recipe": args.recipe,
        "quantizer": name,
        "threads": torch.get_num_threads(),
        "load_average": os.getloadavg()[0],
        "val_records": len(val),
        "pool_records": len(pool),
        "quantization_s": quantize_s,
    }
    out |= _measure(args, cfg, draw, val, pool, model, qmodel, engine)
    if args.kl_quantizers:
        out["kl_table"] = _kl_table(cfg, draw, model, val, pad, engine, args.kl_quantizers.split(","))
    print(json.dumps(out, indent=2))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(out, handle, indent=2)
    _print(out)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
