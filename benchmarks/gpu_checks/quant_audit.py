"""Check c of benchmarks/gpu_check.py, the mini audit: a real model with a tiny random LoRA merged, quantized on
the device by llmaudit's quantizers; per quantizer, every in-scope layer must be the real kernel on the device,
and the per-sample losses must match those of the same quantizer on CPU within FRACTION of the quantizer's
own effect plus the bf16-compute floor (the bf16 row)."""

from __future__ import annotations

import argparse
import copy
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .common import Result, _device
from .models import audit_records, load_model, merge_tiny_lora, pin_gptq_backend, sample_losses

QUANTIZERS = ("bf16", "bnb-nf4", "bnb-int8", "hqq-4", "gptq-4")  # gptq last: the slowest
REAL_MODE = {"bf16": "native", "bnb-nf4": "real", "bnb-int8": "real", "gptq-4": "real", "hqq-4": "real"}
QUANT_OPTIONS: dict[str, dict[str, Any]] = {"gptq-4": {"group_size": 64, "calibration_max_length": 256}}
FRACTION = 0.25  # real-kernel vs CPU-fake difference allowed, as a share of the quantizer's own effect
BF16_FLOOR_SHARE = 0.01  # the bf16 row: bf16 compute may change per-sample losses by under 1% of the mean loss


@dataclass
class Audit:
    """What every quantizer's row of the mini audit works on."""

    device: Any
    model: Any  # fp32 on CPU, the tiny LoRA merged
    tok: Any
    examples: list
    texts: list[str]
    scope: list[str]  # the in-scope layers
    ref: Any  # per-sample losses of `model` (fp32 on CPU)
    source: str  # where the model came from
    floor: float | None = field(default=None, init=False)  # the bf16-compute floor, from the bf16 row


def check_quant_audit(args: argparse.Namespace, result: Result) -> None:
    import torch

    audit = _prepare(args, result)
    rows: dict[str, dict[str, Any]] = {}
    for name in args.quantizers.split(","):
        row: dict[str, Any] = {"status": "running"}
        rows[name] = row
        result.detail(rows=rows)
        t1 = time.monotonic()
        try:
            _audit_row(audit, name, row)
        except Exception as exc:  # noqa: BLE001 - one quantizer failing never stops the others
            traceback.print_exc()
            row.update(status="fail", error=f"{type(exc).__name__}: {exc}"[:600])
        row["seconds"] = time.monotonic() - t1
        if audit.device.type == "cuda":
            torch.cuda.empty_cache()
        result.detail(rows=rows)
    passed = [n for n, r in rows.items() if r["status"] == "pass"]
    source = audit.source
    result.set(
        status="pass" if len(passed) == len(rows) else "fail",
        figure=f"{len(passed)}/{len(rows)} quantizers real on {audit.device.type} and within tolerance; model {source}",
        error=None if len(passed) == len(rows) else f"failed: {[n for n in rows if n not in passed]}",
    )
    if "FALLBACK" in source:
        result.detail(note="the real model was not available: built-in tiny model used")


def _prepare(args: argparse.Namespace, result: Result) -> Audit:
    """The model (LoRA merged), the records, the in-scope layers and the fp32 CPU losses."""
    import torch

    from llmaudit.quantize import DEFAULT_MODULES
    from llmaudit.quantize.base import target_modules

    device = _device(args)
    t0 = time.monotonic()
    base, tok, source = load_model(args, real=device.type == "cuda" or args.model is not None)
    pin_gptq_backend(args.gptq_backend if device.type == "cuda" else None)
    merged = merge_tiny_lora(base)
    del base
    examples, texts = audit_records(tok, args.records)
    result.detail(
        model=source, records=len(examples), tokens=sum(len(i) for i, _ in examples), load_s=time.monotonic() - t0
    )
    ref = sample_losses(merged, examples, tok.pad_token_id, torch.device("cpu"))
    scope = [n for n, _ in target_modules(merged, DEFAULT_MODULES)]
    result.detail(fp32_cpu_mean_loss=float(ref.mean()), in_scope_layers=len(scope))
    return Audit(device, merged, tok, examples, texts, scope, ref, source)


def _audit_row(audit: Audit, name: str, row: dict[str, Any]) -> None:
    """One quantizer: its real kernels on the device, and its losses there against the CPU reference."""
    import torch

    options = dict(QUANT_OPTIONS.get(name, {}))
    if name.startswith("gptq"):
        options["calibration_samples"] = len(audit.texts)
    loss_dev, model_cpu, ok_kernels = _device_losses(audit, name, options, row)
    loss_cpu = sample_losses(model_cpu, audit.examples, audit.tok.pad_token_id, torch.device("cpu"))
    del model_cpu
    _judge_row(audit, name, row, (loss_dev, loss_cpu), ok_kernels)


def _device_losses(audit: Audit, name: str, options: dict[str, Any], row: dict[str, Any]) -> tuple[Any, Any, bool]:
    """(per-sample losses of the quantized model on the device, the CPU reference model, real kernels?)."""
    import torch

    from llmaudit.quantize import get_quantizer

    cpu, pad = torch.device("cpu"), audit.tok.pad_token_id
    q_dev = get_quantizer(name, device=audit.device.type, mode=REAL_MODE[name], **options)
    model_dev = q_dev.quantize_model(copy.deepcopy(audit.model), tokenizer=audit.tok, calibration_texts=audit.texts)
    ok_kernels, row["kernels"] = kernel_check(name, model_dev, audit.scope, audit.device)
    model_cpu = _gptq_reference(model_dev, row) if name.startswith("gptq") else None
    loss_dev = sample_losses(model_dev, audit.examples, pad, audit.device)
    if name.startswith("gptq") and model_cpu is None:
        from llmaudit.quantize.gptq_backend import dequantize_gptq_layers

        model_cpu = dequantize_gptq_layers(model_dev, torch.float32).to(cpu)
    elif not name.startswith("gptq"):
        q_cpu = get_quantizer(name, device="cpu", **options)
        model_cpu = q_cpu.quantize_model(copy.deepcopy(audit.model), tokenizer=audit.tok, calibration_texts=audit.texts)
        row["cpu_reference"] = (
            f"device=cpu, mode {q_cpu.options.get('mode', 'auto')} -> {getattr(q_cpu, 'resolved_mode', '?')}"
        )
    del model_dev
    return loss_dev, model_cpu, ok_kernels


def _gptq_reference(model_dev: Any, row: dict[str, Any]) -> Any | None:
    """The CPU "fake" model of these very weights (gptq mode fake: dequantized into fp32 nn.Linear), taken
    before the first forward, which may repack the weights for the kernel (TorchAten on CPU); None when the
    model cannot be copied (then it is dequantized in place after the device forward)."""
    import torch

    from llmaudit.quantize.gptq_backend import dequantize_gptq_layers

    row["cpu_reference"] = "the same GPTQ weights dequantized into fp32 nn.Linear (gptq mode fake)"
    try:
        return dequantize_gptq_layers(copy.deepcopy(model_dev), torch.float32).to(torch.device("cpu"))
    except Exception as exc:  # noqa: BLE001 - not copyable: dequantized in place after the forward
        row["cpu_reference"] += f" (after the device forward: deepcopy failed, {type(exc).__name__})"
        return None


def _judge_row(audit: Audit, name: str, row: dict[str, Any], losses: tuple[Any, Any], ok_kernels: bool) -> None:
    """The row's figures and verdict from (device losses, CPU losses); the bf16 row sets the floor."""
    import numpy as np

    loss_dev, loss_cpu = losses
    ref, kernels = audit.ref, row["kernels"]
    finite = bool(np.isfinite(loss_dev).all() and np.isfinite(loss_cpu).all())
    effect = float(np.abs(loss_cpu - ref).mean())
    diff = float(np.abs(loss_dev - loss_cpu).mean())
    row.update(
        effect=effect,
        diff=diff,
        ratio=diff / effect if effect > 0 else None,
        mean_loss_device=float(loss_dev.mean()),
        mean_loss_cpu=float(loss_cpu.mean()),
    )
    if name == "bf16":
        floor = audit.floor = float(np.abs(loss_dev - ref).mean())
        limit = BF16_FLOOR_SHARE * float(ref.mean())
        row.update(floor=floor, limit=limit)
        ok_numbers = finite and floor <= limit
        row["figure"] = (
            f"bf16-compute floor |L_bf16 - L_fp32| {floor:.4f} (limit {limit:.4f} = 1% of mean loss); "
            f"weight-rounding effect {effect:.4f}, diff vs CPU fake {diff:.4f}; {kernels}"
        )
    else:
        floor = audit.floor
        limit = FRACTION * effect + (floor or 0.0)
        row.update(floor=floor, limit=limit)
        ok_numbers = finite and effect > 0 and diff <= limit
        row["figure"] = (
            f"diff {diff:.4f} vs effect {effect:.4f} (ratio {diff / effect if effect else float('nan'):.2f}; "
            f"limit {FRACTION:.0%} x effect + floor {floor or 0.0:.4f} = {limit:.4f}); {kernels}"
        )
    row["status"] = "pass" if ok_kernels and ok_numbers else "fail"
    if not ok_kernels:
        row["error"] = "not the real kernels"
    elif not ok_numbers:
        row["error"] = "losses not finite" if not finite else "device losses too far from the CPU reference"


def _bnb_classes(name: str, device: Any) -> tuple[type, ...]:
    """The module classes of bitsandbytes' real kernels for `name`; on a CPU, int8 is also llmaudit's `Int8Linear`
    (bitsandbytes' int8 operations in fewer passes, bit for bit: tests/quantize/test_bnb_int8.py)."""
    import bitsandbytes as bnb

    from llmaudit.quantize.bnb_int8 import Int8Linear

    if name != "bnb-int8":
        return (bnb.nn.Linear4bit,)
    return (bnb.nn.Linear8bitLt, Int8Linear) if device.type == "cpu" else (bnb.nn.Linear8bitLt,)


def kernel_check(name: str, model: Any, scope: list[str], device: Any) -> tuple[bool, str]:
    """Whether every in-scope layer of `model` is `name`'s real kernel with its tensors on `device`."""
    import torch

    if name == "bf16":

        def is_real(m: Any) -> bool:
            return type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16

    elif name.startswith("bnb-"):
        cls = _bnb_classes(name, device)

        def is_real(m: Any) -> bool:
            if name == "bnb-int8":
                return isinstance(m, cls) and m.weight.dtype == torch.int8
            return isinstance(m, cls) and getattr(m.weight, "quant_type", None) == name.split("-")[1]

    elif name.startswith("gptq-"):
        from gptqmodel.nn_modules.qlinear import BaseQuantLinear

        def is_real(m: Any) -> bool:
            return isinstance(m, BaseQuantLinear)

    elif name.startswith("hqq-"):
        from hqq.core.quantize import HQQLinear

        def is_real(m: Any) -> bool:
            return isinstance(m, HQQLinear)

    else:
        raise ValueError(name)
    layers = [model.get_submodule(n) for n in scope]
    classes = Counter(type(m).__name__ for m in layers)
    wrong = [n for n, m in zip(scope, layers) if not is_real(m)]
    elsewhere = [
        n
        for n, m in zip(scope, layers)
        if any(t.device.type != device.type for t in [*m.parameters(), *m.buffers()])
        or not any(True for _ in [*m.parameters(), *m.buffers()])
    ]
    kinds = ", ".join(f"{k} x{v}" for k, v in classes.items())
    ok = not wrong and not elsewhere
    text = f"{len(scope) - len(wrong)}/{len(scope)} real ({kinds}) on {device.type}"
    if wrong:
        text += f"; not real: {wrong[:3]}"
    if elsewhere:
        text += f"; tensors off {device.type}: {elsewhere[:3]}"
    return ok, text
