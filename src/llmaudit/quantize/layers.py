"""The layers a quantizer works on: which modules are in scope, the device and dtype it computes in, the checks of
a layer, and the replacement of layers by their quantized form."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch
from torch import nn

from .errors import QuantizationError


def _is_linear_like(module: nn.Module) -> bool:
    """nn.Linear and the backends' quantized linear modules (all expose in/out_features)."""
    if isinstance(module, nn.Linear):
        return True
    return isinstance(getattr(module, "in_features", None), int) and isinstance(
        getattr(module, "out_features", None), int
    )


def target_modules(model: nn.Module, patterns: Iterable[str]) -> list[tuple[str, nn.Module]]:
    """The linear(-like) modules whose qualified name matches one of ``patterns`` (``re.search``).

    Args:
        model: the model searched.
        patterns: regular expressions.

    Returns:
        (qualified name, module) pairs in module order; a match inside another match is kept once, at the top.
    """
    compiled = [re.compile(p) for p in patterns]
    found = []
    for name, module in model.named_modules():
        if not name or not _is_linear_like(module):
            continue
        if any(p.search(name) for p in compiled):
            found.append((name, module))
    # A matched module inside another matched module (e.g. a wrapper) is counted once, at the top.
    tops = []
    for name, module in found:
        if not any(name.startswith(other + ".") for other, _ in tops):
            tops.append((name, module))
    return tops


def resolve_device(device: str) -> torch.device:
    """The device a quantizer's ``device`` option names.

    Args:
        device: ``"auto"`` (a GPU when one is visible, else the CPU), ``"cpu"`` or ``"cuda"``.

    Returns:
        The torch device.
    """
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def compute_dtype_for(device: torch.device) -> torch.dtype:
    """The dtype the quantizers compute in on a device.

    Args:
        device: where the quantizer runs.

    Returns:
        float32 on a CPU (where bf16 matmuls are slower without native support), bfloat16 on a GPU.
    """
    return torch.float32 if device.type == "cpu" else torch.bfloat16


def require_linear(quantizer_name: str, layer_name: str, module: nn.Module) -> None:
    """Refuse an in-scope layer that is not an ``nn.Linear`` (for a backend that quantizes those only).

    Args:
        quantizer_name: the quantizer's name (quoted).
        layer_name: the layer's qualified name (quoted).
        module: the layer.

    Raises:
        QuantizationError: the layer is another kind of module.
    """
    if not isinstance(module, nn.Linear):
        raise QuantizationError(f"{quantizer_name}: layer '{layer_name}' is {type(module).__name__}, not nn.Linear")


def check_group_size(quantizer_name: str, layer_name: str, in_features: int, group_size: int) -> None:
    """Refuse a group size that does not divide a layer's input width.

    Args:
        quantizer_name: the quantizer's name (quoted).
        layer_name: the layer's qualified name (quoted).
        in_features: the layer's input width.
        group_size: the group size (-1 or 0: one group per row, always allowed).

    Raises:
        QuantizationError: it does not divide (the message lists group sizes that do).
    """
    if group_size > 0 and in_features % group_size != 0:
        divisors = [g for g in (8, 16, 32, 64, 128, 256) if in_features % g == 0]
        raise QuantizationError(
            f"{quantizer_name}: group_size={group_size} does not divide the input width {in_features} "
            f"of layer '{layer_name}'; fix: pass a group_size that divides every in-scope layer's "
            f"input width (here e.g. {divisors}) or restrict modules="
        )


def replace_module(model: nn.Module, name: str, new: nn.Module) -> None:
    """Put ``new`` in the place of the module called ``name``.

    Args:
        model: the model holding it.
        name: the module's qualified name.
        new: the replacement.
    """
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def replace_each(model: nn.Module, targets: list[tuple[str, nn.Module]], make: Callable) -> None:
    """Replace each target layer by ``make(name, module)``, in order, releasing each original as soon as its
    replacement is in place (iterating over the list would keep every original alive until the last replacement:
    a second copy of the decoder's weights at the peak; docs/results.md).

    Args:
        model: the model holding the layers.
        targets: (qualified name, module) pairs; emptied as the layers are replaced.
        make: builds the replacement of one layer from its name and module.
    """
    targets.reverse()
    while targets:
        name, module = targets.pop()
        replace_module(model, name, make(name, module))
        del module


def linear_from_weight(weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> nn.Linear:
    """A plain ``nn.Linear`` holding a given (fake-quantized or dequantized) weight, without gradients.

    Args:
        weight: the weight, [out, in].
        bias: the bias, or None.
        dtype: the parameters' dtype.

    Returns:
        The layer, on the weight's device.
    """
    out_features, in_features = weight.shape
    linear = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight.detach().to(dtype), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.detach().to(device=weight.device, dtype=dtype), requires_grad=False)
    return linear
