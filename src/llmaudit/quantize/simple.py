"""The simple per-tensor quantizers of docs/science.md section 3, as pure tensor functions.

Each function maps a weight tensor ``w: [*batch, *tensor]`` to a tensor of the same shape and dtype.
The first ``batch_dims`` dimensions index independent tensors: each one gets its own threshold
(ternary) or scale alpha (uniform). ``batch_dims=0`` treats the whole input as one tensor;
``batch_dims=1`` on ``[R, out, in]`` quantizes R weight matrices at once.

Rules (docs/science.md section 3, with its corrections):

- sign:        Q(w) = sign(w)  (values -1, +1; an exact 0 stays 0, as ``torch.sign`` does).
- ternary-X:   Q(w) = 0 for the X% of weights with the SMALLEST magnitude, sign(w) for the rest.
               k = round(X/100 * n) weights are targeted (n = elements per tensor, half rounds up);
               the threshold t is the k-th smallest magnitude and every weight with |w| <= t is
               zeroed. Tie rule: weights whose magnitude equals the threshold are ALL zeroed, so the
               rule depends only on the values (never on the position of a weight) and the achieved
               sparsity is at least X% (more only when magnitudes tie at the threshold). k = 0
               zeroes nothing.
- uniform-b:   Q(w) = sign(w) * (alpha / 2^(b-1)) * floor(1 + clip(2^(b-1) * |w| / alpha, 0, 2^(b-1))),
               alpha = 2^round(log2(max |w|)) (round half to even, as ``torch.round``).
               Levels are 1 .. 2^(b-1) + 1 times alpha / 2^(b-1) in magnitude: no zero level except
               for w == 0 exactly; the extra top level is reached at the top of the clip.
               An all-zero tensor maps to zeros.

Computation runs in float32 (float64 inputs stay float64) and the result is cast back to ``w.dtype``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .base import Option, Quantizer, choice, common_options, target_modules

__all__ = ["sign_quantize", "ternary_quantize", "uniform_quantize", "SimpleQuantizer", "SIMPLE_SPECS"]


def _check_batch_dims(w: torch.Tensor, batch_dims: int) -> None:
    if not isinstance(batch_dims, int) or batch_dims < 0 or batch_dims >= max(w.dim(), 1):
        raise ValueError(
            f"batch_dims={batch_dims!r} must be an int in [0, {max(w.dim() - 1, 0)}] "
            f"for a tensor of shape {tuple(w.shape)} (at least one dimension must remain per tensor)"
        )


def _work_dtype(w: torch.Tensor) -> torch.dtype:
    return torch.float64 if w.dtype == torch.float64 else torch.float32


def sign_quantize(w: torch.Tensor, batch_dims: int = 0) -> torch.Tensor:
    """sign(w), elementwise.

    Args:
        w: the weights, ``[*batch, *tensor]``.
        batch_dims: accepted for a uniform interface; the rule is elementwise, so it changes nothing.

    Returns:
        The same shape and dtype, values in {-1, +1}.
    """
    if w.dim() > 0:
        _check_batch_dims(w, batch_dims)
    return torch.sign(w)


def ternary_quantize(w: torch.Tensor, sparsity: float, batch_dims: int = 0) -> torch.Tensor:
    """Zero the ``sparsity`` fraction of smallest-magnitude weights, sign(w) for the rest.

    Ties at the threshold are all zeroed (see the module docstring).

    Args:
        w: the weights, ``[*batch, *tensor]``.
        sparsity: the fraction zeroed, in [0, 1) (e.g. 0.33, 0.5, 0.9).
        batch_dims: the leading dimensions that index separate tensors (each gets its own threshold).

    Returns:
        The same shape and dtype, values in {-1, 0, +1}.
    """
    if not 0.0 <= float(sparsity) < 1.0:
        raise ValueError(f"sparsity={sparsity!r} must be in [0, 1) (a fraction, e.g. 0.9 for ternary-90)")
    if w.dim() == 0:
        w_flat = w.reshape(1, 1)
    else:
        _check_batch_dims(w, batch_dims)
        w_flat = w.reshape(*w.shape[:batch_dims], -1)
    n = w_flat.shape[-1]
    k = int(math.floor(float(sparsity) * n + 0.5))
    if k == 0 or n == 0:
        return torch.sign(w)
    mag = w_flat.to(_work_dtype(w)).abs()
    threshold = torch.kthvalue(mag, k, dim=-1, keepdim=True).values  # k-th smallest per tensor
    q = torch.where(mag <= threshold, torch.zeros_like(mag), torch.sign(w_flat.to(mag.dtype)))
    return q.reshape(w.shape).to(w.dtype)


def uniform_quantize(w: torch.Tensor, bits: int, batch_dims: int = 0) -> torch.Tensor:
    """Sign plus (bits - 1) bits of magnitude on a power-of-two scale (docs/science.md section 3).

    Args:
        w: the weights, ``[*batch, *tensor]``.
        bits: the code width, at least 2.
        batch_dims: the leading dimensions that index separate tensors (alpha is computed per tensor, over the
            other dimensions).

    Returns:
        The same shape and dtype.
    """
    if not isinstance(bits, int) or bits < 2:
        raise ValueError(f"bits={bits!r} must be an int >= 2 (uniform-b is defined for b in 2..5)")
    if w.dim() == 0:
        return uniform_quantize(w.reshape(1), bits).reshape(())
    _check_batch_dims(w, batch_dims)
    wf = w.to(_work_dtype(w))
    reduce_dims = tuple(range(batch_dims, w.dim()))
    max_abs = wf.abs().amax(dim=reduce_dims, keepdim=True)
    # An all-zero tensor has no scale; any finite alpha maps it to zeros (sign(0) = 0).
    max_abs = torch.where(max_abs > 0, max_abs, torch.ones_like(max_abs))
    alpha = torch.exp2(torch.round(torch.log2(max_abs)))
    half_levels = float(2 ** (bits - 1))
    step = alpha / half_levels
    level = torch.floor(1.0 + torch.clamp(half_levels * wf.abs() / alpha, 0.0, half_levels))
    return (torch.sign(wf) * step * level).to(w.dtype)


# --------------------------------------------------------------------------------------------------
# Adapter: apply the rules to the in-scope weight matrices of a model, one matrix = one tensor.

SIMPLE_SPECS: dict[str, tuple[str, float]] = {
    # name: (rule, nominal bits)
    "sign": ("sign", 1.0),
    "ternary-33": ("ternary", 1.58),
    "ternary-50": ("ternary", 1.58),
    "ternary-90": ("ternary", 1.58),
    "uniform-2": ("uniform", 2.0),
    "uniform-3": ("uniform", 3.0),
    "uniform-4": ("uniform", 4.0),
    "uniform-5": ("uniform", 5.0),
}


class SimpleQuantizer(Quantizer):
    """sign / ternary-X / uniform-b applied to each in-scope weight matrix (docs/science.md section 3).

    Option ``scale`` (sign and ternary only): ``"none"`` (default) is the published rule, values in
    {-1, 0, +1}; ``"absmean"`` multiplies each quantized matrix by the mean magnitude of the weights it
    keeps (the least-squares scale for that sign pattern), a labelled variant that keeps an LLM's
    activations at their usual size. Weights are replaced in place (fake quantization: the model
    stays an fp32 model holding quantized values; nothing faster exists for these rules).

    Bits accounting (``bits_per_weight``): log2(number of codes) per weight, i.e. sign 1,
    ternary log2(3) = 1.585, uniform-b log2(2^b + 2) (b bits plus the extra top level of the clip,
    e.g. 2.585 for b = 2), plus one 32-bit scalar per matrix for uniform's alpha and for
    ``scale="absmean"``.
    """

    family = "simple"
    install_hint = None
    tracked_libraries = ()
    gpu_seconds_per_layer = 0.01
    shares_calibration = None

    def __init__(self, name: str, **options):
        rule, bits = SIMPLE_SPECS[name]
        self.rule = rule
        self.sparsity = int(name.split("-")[1]) / 100 if rule == "ternary" else None
        self.uniform_bits = int(name.split("-")[1]) if rule == "uniform" else None
        spec: dict[str, Option] = common_options()
        if rule in ("sign", "ternary"):
            spec["scale"] = choice("none", ("none", "absmean"))
        super().__init__(name, bits, spec, options)

    def quantize_tensor(self, w: torch.Tensor, batch_dims: int = 0) -> torch.Tensor:
        """This quantizer's rule applied to a tensor.

        Args:
            w: the weights, ``[*batch, *tensor]``.
            batch_dims: the leading dimensions that index separate tensors.

        Returns:
            The same shape and dtype.
        """
        if self.rule == "sign":
            q = sign_quantize(w, batch_dims)
        elif self.rule == "ternary":
            q = ternary_quantize(w, self.sparsity, batch_dims)
        else:
            return uniform_quantize(w, self.uniform_bits, batch_dims)
        if self.options.get("scale") == "absmean":
            reduce_dims = tuple(range(batch_dims, w.dim()))
            kept = q != 0
            kept_count = kept.sum(dim=reduce_dims, keepdim=True).clamp_min(1)
            scale = (w.abs() * kept).sum(dim=reduce_dims, keepdim=True) / kept_count
            q = q * scale
        return q

    def bits_per_weight(self, in_features: int, out_features: int) -> float:
        """Bits per weight of a layer: log2 of the number of codes (sign 1, ternary log2 3, uniform-b log2(2^b + 2)) plus one 32-bit scalar per matrix for uniform's alpha and for ``scale="absmean"``, shared by its weights.

        Args:
            in_features: the layer's input width.
            out_features: the layer's output width.

        Returns:
            Bits per weight.
        """
        n = in_features * out_features
        if self.rule == "sign":
            code_bits = 1.0
        elif self.rule == "ternary":
            code_bits = math.log2(3)
        else:
            code_bits = math.log2(2**self.uniform_bits + 2)
        has_scale = self.rule == "uniform" or self.options.get("scale") == "absmean"
        return code_bits + (32.0 / n if has_scale else 0.0)

    def _quantize(self, model: nn.Module, *, tokenizer, calibration_texts) -> nn.Module:
        for _, module in target_modules(model, self.options["modules"]):
            module.weight.data = self.quantize_tensor(module.weight.data)
        return model
