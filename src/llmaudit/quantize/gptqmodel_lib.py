"""gptqmodel's support around a quantization: its output kept quiet, its log files sent aside, and its quantized
layers read back as plain nn.Linear layers. gptqmodel is imported inside the functions only."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import torch
from torch import nn

from .errors import QuantizationError
from .layers import linear_from_weight, replace_module


@contextlib.contextmanager
def quiet_gptqmodel(log_path: str):
    """Send gptqmodel's progress bars and INFO lines (and accelerate's warnings about untied weights) to a file,
    and add its tail to any error; the environment variable LLMAUDIT_LOG shows them instead.

    Args:
        log_path: the file written.

    Raises:
        QuantizationError: anything raised inside, with the file's tail.
    """
    if os.environ.get("LLMAUDIT_LOG"):
        yield
        return
    noisy = [logging.getLogger(n) for n in ("accelerate", "accelerate.utils.modeling", "gptqmodel")]
    levels = [lg.level for lg in noisy]
    for lg in noisy:
        lg.setLevel(logging.ERROR)
    try:
        with (
            open(log_path, "w", encoding="utf-8") as sink,
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            try:
                yield
            except Exception as exc:
                sink.flush()
                tail = Path(log_path).read_text(encoding="utf-8", errors="replace")[-1500:]
                raise QuantizationError(
                    f"gptqmodel failed ({type(exc).__name__}: {exc}); its last output: {tail}"
                ) from exc
    finally:
        for lg, level in zip(noisy, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def gptqmodel_logs_in(directory: str):
    """Send the per-layer log files gptqmodel writes into ./logs of the current directory on every quantization
    to another directory (a temporary one, discarded with it).

    Args:
        directory: where the log files go.
    """
    try:
        from gptqmodel.looper import loop_processor
    except ImportError:  # layout changed: leave gptqmodel's default
        yield
        return
    previous = getattr(loop_processor, "_PROJECT_LOG_DIR", None)
    if previous is None:
        yield
        return
    loop_processor._PROJECT_LOG_DIR = Path(directory)
    try:
        yield
    finally:
        loop_processor._PROJECT_LOG_DIR = previous


def dequantize_gptq_layers(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Replace every gptqmodel quantized linear by an nn.Linear holding its dequantized weight (the fake-quantized
    model), and cast the model to ``dtype``; in place.

    Args:
        model: the model as gptqmodel returns it.
        dtype: the dtype of the result.

    Returns:
        The model.
    """
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear

    names = [n for n, m in model.named_modules() if isinstance(m, BaseQuantLinear)]
    for name in names:
        qlinear = model.get_submodule(name)
        weight = qlinear.dequantize_weight()[: qlinear.in_features, : qlinear.out_features].t()
        bias = qlinear.bias if isinstance(qlinear.bias, torch.Tensor) else None
        replace_module(model, name, linear_from_weight(weight.contiguous(), bias, dtype))
    return model.to(dtype)
