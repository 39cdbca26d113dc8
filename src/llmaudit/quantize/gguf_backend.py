"""llama.cpp's GGUF quantizations (Q8_0, the k-quant mixes Q6_K ... Q2_K, the i-quants), each also with an importance
matrix: ``gguf-q4_k_m``, ``gguf-q4_k_m-imatrix``, ...

The checkpoint is written as the float32 GGUF llama.cpp's quantizer reads (``gguf_layout``), quantized by llama.cpp's
own ``llama_model_quantize`` (``llama_cpp_lib``; the tool ``llama-quantize`` calls it), and read back: every tensor
llama.cpp quantized (the embeddings and the output head included, as in every GGUF file) is replaced by its blocks
dequantized with ggml's own ``to_float``, which is what an inference engine reads. The type of each tensor is
llama.cpp's choice, never llmaudit's: the k-quant mixes (e.g. Q4_K_M: Q6_K for half of the attn_v and ffn_down
tensors and for the output head, Q4_K elsewhere) and the fallbacks where a row's width is not a multiple of the block
size (256 for the k- and i-quants: Q4_K -> Q5_0, Q6_K -> Q8_0, Q5_K -> Q5_1, Q2_K/Q3_K -> Q4_0, IQ4_XS -> IQ4_NL; a
model with hidden size 576 gets them on most tensors). tests/quantize/test_gguf_exact.py proves, on a tiny Llama and a
tiny Qwen2, that the types and bytes equal those of llama.cpp's converter + quantizer tensor by tensor.

What is not llama.cpp: scoring computes with the dequantized weights and full-precision activations, where llama.cpp's
CPU kernels also round the activations to 8 bits inside each product (Q8_K / Q8_0 dot products); the GPU kernels of
other engines differ again. The weights are the exact ones; the arithmetic is the scoring engine's.

The ``-imatrix`` variants compute llama.cpp's importance matrix (``imatrix``) on the calibration text first and hand it
to the quantizer as ``llama-quantize --imatrix`` does. Types that llama.cpp refuses to make without one (IQ1_*, IQ2_*,
IQ3_XXS, IQ3_XS, Q2_K_S) exist only with it.

Accounting: ``effective_bits`` = 8 x the bytes llama.cpp wrote for the in-block weights / their count (mixes and
fallbacks included); ``model_size_bytes`` = every quantized tensor's bytes + every other parameter at its element size.
Both are measured on the file, so they are known once a checkpoint has been quantized.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from . import base, llama_cpp_lib
from .base import DEVICES, QuantizationError, Quantizer, choice
from .calibration import calibration_options, calibration_token_ids
from .gguf_layout import (
    GGUFTensor,
    architecture,
    dequantized_weight,
    quantized_modules,
    read_quantized,
    write_source_gguf,
)
from .gguf_runnable import check_runnable, write_runnable_gguf
from .imatrix import collect_importance

ENGINES = ("torch", "llama.cpp")
"""What computes a GGUF quantizer's losses: torch on the dequantized weights, or llama.cpp on the quantized file."""


@dataclass(frozen=True)
class GGUFType:
    ftype: int
    """llama.h's LLAMA_FTYPE_MOSTLY_* of the file type."""
    bits: float
    """Bits per weight of the file type's default tensor type (its nominal width)."""
    needs_imatrix: bool = False


GGUF_TYPES: dict[str, GGUFType] = {
    "q8_0": GGUFType(7, 8.5),
    "q6_k": GGUFType(18, 6.5625),
    "q5_k_m": GGUFType(17, 5.5),
    "q5_k_s": GGUFType(16, 5.5),
    "q5_1": GGUFType(9, 6.0),
    "q5_0": GGUFType(8, 5.5),
    "q4_k_m": GGUFType(15, 4.5),
    "q4_k_s": GGUFType(14, 4.5),
    "q4_1": GGUFType(3, 5.0),
    "q4_0": GGUFType(2, 4.5),
    "iq4_xs": GGUFType(30, 4.25),
    "iq4_nl": GGUFType(25, 4.5),
    "q3_k_l": GGUFType(13, 3.4375),
    "q3_k_m": GGUFType(12, 3.4375),
    "q3_k_s": GGUFType(11, 3.4375),
    "iq3_m": GGUFType(27, 3.4375),
    "iq3_s": GGUFType(26, 3.4375),
    "iq3_xs": GGUFType(22, 3.4375, needs_imatrix=True),
    "iq3_xxs": GGUFType(23, 3.0625, needs_imatrix=True),
    "q2_k": GGUFType(10, 2.625),
    "q2_k_s": GGUFType(21, 2.625, needs_imatrix=True),
    "iq2_m": GGUFType(29, 2.5625, needs_imatrix=True),
    "iq2_s": GGUFType(28, 2.3125, needs_imatrix=True),
    "iq2_xs": GGUFType(20, 2.3125, needs_imatrix=True),
    "iq2_xxs": GGUFType(19, 2.0625, needs_imatrix=True),
    "iq1_m": GGUFType(31, 1.75, needs_imatrix=True),
    "iq1_s": GGUFType(24, 1.5625, needs_imatrix=True),
}
"""The file types of ``llama-quantize`` that llmaudit offers (not BF16/F16, the ternary TQ1_0/TQ2_0 of BitNet models,
or MXFP4_MOE of mixtures of experts). Q8_0 ignores an importance matrix, so it has no -imatrix variant."""


def _names() -> dict[str, tuple[str, bool]]:
    names: dict[str, tuple[str, bool]] = {}
    for kind, spec in GGUF_TYPES.items():
        if not spec.needs_imatrix:
            names[f"gguf-{kind}"] = (kind, False)
        if kind != "q8_0":
            names[f"gguf-{kind}-imatrix"] = (kind, True)
    return names


GGUF_NAMES = _names()


@dataclass(frozen=True)
class TensorRecord:
    name: str
    """The GGUF tensor name (blk.0.attn_q.weight)."""
    type_name: str
    values: int
    n_bytes: int


class GGUFQuantizer(Quantizer):
    family = "gguf"
    install_hint = llama_cpp_lib.INSTALL_HINT
    tracked_libraries = ("gguf", "llama-cpp-python")
    gpu_seconds_per_layer = 0.5
    shares_calibration = None
    legacy_options = {"engine": "torch"}  # a recorded unit without the option was scored by torch

    def __init__(self, name: str, **options):
        self.kind, self.with_imatrix = GGUF_NAMES[name]
        self.spec = GGUF_TYPES[self.kind]
        spec = {"device": choice("auto", DEVICES), "engine": choice("torch", ENGINES)}
        if self.with_imatrix:
            spec.update(calibration_options())
        super().__init__(name, self.spec.bits, spec, options)
        self.tensors: dict[str, TensorRecord] = {}
        """{module name: what llama.cpp made of its weight} of the last checkpoint quantized (for the accounting)."""

    @property
    def calibrated(self) -> bool:
        """Whether this quantizer calibrates on text: the -imatrix types do (their importance matrix)."""
        return self.with_imatrix

    def availability(self) -> str | None:
        """Whether this quantizer can run here: gguf-py and llama.cpp's libraries at the version llmaudit's bindings are
        written for.

        Returns:
            None when it can, else the reason with the fix.
        """
        if not base.library_available("gguf"):
            return f"{self.name}: the Python package 'gguf' is not installed; fix: {self.install_hint}"
        reason = llama_cpp_lib.availability()
        if reason:
            return f"{self.name}: {reason}"
        return super().availability()

    @property
    def engine(self) -> str:
        """``torch`` or ``llama.cpp``: what scores this quantizer's units."""
        return str(self.options["engine"])

    def check(self, model: nn.Module | None = None) -> None:
        """Refuse, before any work, a request that cannot be carried out.

        Args:
            model: the model to quantize (its architecture is checked, and with the llama.cpp engine whether llmaudit can
                write it as a runnable GGUF); None checks availability alone.

        Raises:
            QuantizationError: the quantizer cannot run here, or the model cannot be written.
        """
        reason = self.availability()
        if reason:
            raise QuantizationError(reason)
        if model is not None:
            try:
                architecture(model)
                if self.engine == "llama.cpp":
                    check_runnable(model)
            except QuantizationError as exc:
                raise QuantizationError(f"{self.name}: {exc}") from None

    def importance_matrix(self, model: nn.Module, *, tokenizer, calibration_texts) -> dict[str, np.ndarray] | None:
        """llama.cpp's importance matrix of ``model`` on the calibration text.

        Args:
            model: the unquantized model (unchanged).
            tokenizer: its tokenizer.
            calibration_texts: the texts to calibrate on.

        Returns:
            {GGUF name: I [in_features]}, or None for a quantizer without one.

        Raises:
            QuantizationError: the calibration texts or the tokenizer are missing or give no token.
        """
        if not self.with_imatrix:
            return None
        samples = calibration_token_ids(self.name, self.options, tokenizer, calibration_texts)
        modules = {name: module_name for name, (module_name, _) in quantized_modules(model).items()}
        return {name: values.numpy() for name, values in collect_importance(model, modules, samples).items()}

    def quantize_blocks(self, model: nn.Module, imatrix: dict[str, np.ndarray] | None = None) -> list[GGUFTensor]:
        """Every tensor llama.cpp quantizes, as llama_model_quantize writes it (type and bytes).

        Args:
            model: the model (unchanged).
            imatrix: an importance matrix (``importance_matrix``'s) for an -imatrix quantizer.

        Returns:
            The quantized tensors.

        Raises:
            QuantizationError: an architecture llmaudit cannot write, or llama.cpp's quantizer failing.
        """
        self.check(model)
        with tempfile.TemporaryDirectory(prefix="llmaudit-gguf-") as tmp:
            source, target = Path(tmp) / "source-f32.gguf", Path(tmp) / f"{self.kind}.gguf"
            modules = write_source_gguf(model, source)
            threads = max(1, torch.get_num_threads() or os.cpu_count() or 1)
            llama_cpp_lib.quantize_file(source, target, ftype=self.spec.ftype, imatrix=imatrix, threads=threads)
            return list(read_quantized(target, modules))

    def quantize_to_file(
        self, model: nn.Module, target: str | Path, imatrix: dict[str, np.ndarray] | None = None
    ) -> Path:
        """The quantized GGUF file a llama.cpp user runs: ``model`` written whole (``write_runnable_gguf``, in a temporary
        directory beside ``target``) and quantized to this type by ``llama_model_quantize``. The file's tensors are recorded
        for the accounting (``effective_bits``, ``model_size_bytes``).

        Args:
            model: the model (unchanged).
            target: the file written.
            imatrix: an importance matrix (``importance_matrix``'s) for an -imatrix quantizer.

        Returns:
            ``target``.

        Raises:
            QuantizationError: an architecture llmaudit cannot write, or llama.cpp's quantizer failing.
        """
        self.check(model)
        check_runnable(model)
        target = Path(target)
        with tempfile.TemporaryDirectory(prefix="llmaudit-gguf-", dir=target.parent) as tmp:
            source = write_runnable_gguf(model, Path(tmp) / "source-f32.gguf")
            threads = max(1, torch.get_num_threads() or os.cpu_count() or 1)
            llama_cpp_lib.quantize_file(source, target, ftype=self.spec.ftype, imatrix=imatrix, threads=threads)
        self._record_file(model, target)
        return target

    def _record_file(self, model: nn.Module, path: Path) -> None:
        import gguf

        modules = {name: module_name for name, (module_name, _) in quantized_modules(model).items()}
        self.tensors = {}
        for tensor in gguf.GGUFReader(str(path)).tensors:
            if tensor.name in modules:
                type_name = gguf.GGMLQuantizationType(int(tensor.tensor_type)).name
                record = TensorRecord(tensor.name, type_name, int(tensor.n_elements), int(tensor.n_bytes))
                self.tensors[modules[tensor.name]] = record

    def quantize_model(
        self, model: nn.Module, *, tokenizer=None, calibration_texts=None, imatrix: dict[str, np.ndarray] | None = None
    ) -> nn.Module:
        """The model with every tensor llama.cpp quantizes replaced by its dequantized blocks (in place).

        Args:
            model: the model to quantize.
            tokenizer: its tokenizer (an -imatrix quantizer without ``imatrix`` needs it).
            calibration_texts: the texts of the importance matrix (likewise).
            imatrix: an importance matrix to use instead of computing one (-imatrix quantizers only).

        Returns:
            The quantized model.

        Raises:
            QuantizationError: the request is refused by `check`, or llama.cpp's quantizer fails.
        """
        self.check(model)
        if imatrix is not None and not self.with_imatrix:
            raise QuantizationError(f"{self.name} takes no importance matrix; fix: use {self.name}-imatrix")
        model.eval()
        if imatrix is None:
            imatrix = self.importance_matrix(model, tokenizer=tokenizer, calibration_texts=calibration_texts)
        tensors = self.quantize_blocks(model, imatrix)
        self.tensors = {}
        for tensor in tensors:
            self._load(model, tensor)
        model.to(self.device)
        return model.eval()

    def _load(self, model: nn.Module, tensor: GGUFTensor) -> None:
        module = model.get_submodule(tensor.module)
        weight = dequantized_weight(tensor)
        if tuple(module.weight.shape) != tuple(weight.shape):
            raise QuantizationError(
                f"{self.name}: llama.cpp returned {tensor.name} as {tuple(weight.shape)}, the model holds "
                f"{tuple(module.weight.shape)}"
            )
        # in place: a tied output head (the same Parameter) reads the embeddings' blocks, as llama.cpp does
        module.weight.data = weight.to(dtype=module.weight.dtype, device=module.weight.device)
        self.tensors[tensor.module] = TensorRecord(
            tensor.name, tensor.type_name, math.prod(tensor.shape), tensor.n_bytes
        )

    def tensor_types(self) -> dict[str, str]:
        """The GGUF type of each tensor of the last checkpoint quantized.

        Returns:
            {module name: GGUF type name}.
        """
        return {name: t.type_name for name, t in self.tensors.items()}

    def _require_quantized(self) -> None:
        if not self.tensors:
            raise QuantizationError(f"{self.name}: the accounting is measured on a quantized file; quantize first")

    def effective_bits(self, model: nn.Module) -> float:
        """Bits per weight of the blocks' tensors as llama.cpp wrote them for the last checkpoint quantized.

        Args:
            model: accepted for the common interface (the recorded tensors are read).

        Returns:
            Bits per weight.

        Raises:
            QuantizationError: no checkpoint was quantized yet.
        """
        self._require_quantized()
        blocks = [t for name, t in self.tensors.items() if ".layers." in f".{name}"]
        return 8.0 * sum(t.n_bytes for t in blocks) / sum(t.values for t in blocks)

    def model_size_bytes(self, model: nn.Module) -> int:
        """The size of the last quantized checkpoint: llama.cpp's bytes of every quantized tensor plus every other parameter
        of ``model`` at its element size (a tied parameter once).

        Args:
            model: the quantized model.

        Returns:
            Bytes.

        Raises:
            QuantizationError: no checkpoint was quantized yet.
        """
        self._require_quantized()
        quantized = {f"{name}.weight" for name in self.tensors}
        # named_parameters yields a tied parameter once (under the embeddings' name, which is quantized)
        other = sum(p.numel() * p.element_size() for n, p in model.named_parameters() if n not in quantized)
        return sum(t.n_bytes for t in self.tensors.values()) + other
