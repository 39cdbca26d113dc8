"""llama.cpp's own quantizer and dequantizer, through the shared libraries that `llama-cpp-python` builds.

- ``quantize_file``: ``llama_model_quantize`` (src/llama-quant.cpp), the function behind the ``llama-quantize`` tool:
  its per-tensor type choice (the k-quant mixes, the fallbacks for widths that a block size does not divide) and its
  per-row quantization (``ggml_quantize_chunk``), with an importance matrix passed as the tool passes one (per tensor,
  the mean of squared inputs per column).
- ``dequantize``: ggml's own ``to_float`` of the tensor's type (ggml-base's ``ggml_get_type_traits(type)->to_float``,
  the function llama.cpp itself uses to read a quantized tensor back as float32).

Only this module touches the libraries; it loads them on first use (``import llama_cpp.llama_cpp``, which loads
libllama and ggml-base), never when llmaudit is imported. llama.cpp's log lines are captured (the last ones are
attached to an error), not printed. The C structures are the pinned version's (llama-cpp-python 0.3.36): the binding
declares them, and ``check_version`` refuses another version rather than pass a mis-laid structure.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from . import base
from .base import QuantizationError

LLAMA_CPP_VERSION = "0.3.36"
"""The llama-cpp-python release whose C structures this module is written against (the `gguf-quant` extra pins it)."""
INSTALL_HINT = (
    "pip install 'llmaudit[llamacpp]' (builds llama.cpp from source, about 9 minutes on 2 cores; "
    "CMAKE_ARGS='-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF' keeps the build portable and skips the multimodal library)"
)

_LOG: deque[str] = deque(maxlen=40)
_LOCK = threading.Lock()  # llama_model_quantize is not documented as re-entrant; one at a time per process


def availability() -> str | None:
    """None when llama.cpp's libraries can be used here, else the reason with the fix. Never loads them."""
    if not base.library_available("llama_cpp"):
        return f"the Python package 'llama_cpp' (llama-cpp-python) is not installed; fix: {INSTALL_HINT}"
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None  # an editable or vendored build: trusted as it is
    if version != LLAMA_CPP_VERSION:
        return (
            f"llama-cpp-python {version} is installed, llmaudit's bindings are written for {LLAMA_CPP_VERSION} "
            f"(its C structures); fix: {INSTALL_HINT}"
        )
    return None


class _TypeTraits(ctypes.Structure):
    """ggml.h `struct ggml_type_traits` (same layout since ggml's type traits moved to ggml-base)."""

    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


@dataclass(frozen=True)
class _Libs:
    binding: object  # the llama_cpp.llama_cpp module
    ggml: ctypes.CDLL
    log_callback: object  # kept alive: llama.cpp holds the pointer


@cache
def _libs() -> _Libs:
    reason = availability()
    if reason:
        raise QuantizationError(reason)
    import llama_cpp.llama_cpp as binding

    lib_dir = Path(binding.__file__).parent / "lib"
    candidates = sorted(lib_dir.glob("libggml-base.*")) + sorted(lib_dir.glob("ggml-base.*"))
    if not candidates:
        raise QuantizationError(f"llama-cpp-python at {lib_dir.parent} has no ggml-base library; fix: {INSTALL_HINT}")
    ggml = ctypes.CDLL(str(candidates[0]))
    ggml.ggml_get_type_traits.restype = ctypes.POINTER(_TypeTraits)
    ggml.ggml_get_type_traits.argtypes = [ctypes.c_int]

    @binding.llama_log_callback
    def log_callback(level, text, user_data):  # pragma: no cover - called from C
        _LOG.append(text.decode("utf-8", errors="replace"))

    binding.llama_log_set(log_callback, ctypes.c_void_p(0))
    binding.llama_backend_init()  # what the llama-quantize tool calls first
    return _Libs(binding, ggml, log_callback)


def libraries() -> _Libs:
    """The loaded libraries: ``.binding`` (llama-cpp-python's ctypes module) and ``.ggml`` (ggml-base), loaded on first
    use with llama.cpp's log captured (``last_log``).

    Raises:
        QuantizationError: llama-cpp-python is missing or another version than the pinned one.
    """
    return _libs()


def last_log(lines: int = 12) -> str:
    """llama.cpp's last log lines (for error messages)."""
    return "".join(list(_LOG)[-lines:]).strip()


def quantize_file(
    source: Path, target: Path, *, ftype: int, imatrix: Mapping[str, np.ndarray] | None, threads: int
) -> None:
    """``llama_model_quantize(source, target)`` to llama file type ``ftype`` (llama.h's LLAMA_FTYPE_*), with
    ``imatrix``: {GGUF tensor name: float32 [in_features]} (the importance of each input column) or None."""
    libs = _libs()
    binding = libs.binding
    params = binding.llama_model_quantize_default_params()
    params.nthread = int(threads)
    params.ftype = int(ftype)
    keep = []  # the imatrix buffers must outlive the call
    if imatrix:
        entries = (binding.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            array = np.ascontiguousarray(values, dtype=np.float32)
            key = name.encode()
            keep += [array, key]
            entries[i].name = key
            entries[i].data = array.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = array.size
        entries[len(imatrix)].name = None  # the list ends with a null name
        keep.append(entries)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(binding.llama_model_imatrix_data))
    with _LOCK:
        _LOG.clear()
        status = binding.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if status != 0:
        raise QuantizationError(
            f"llama.cpp's llama_model_quantize failed (status {status}); its last output: {last_log()}"
        )


def dequantize(ggml_type: int, raw: np.ndarray, n_elements: int) -> np.ndarray:
    """float32 [n_elements] of the blocks ``raw`` (uint8) of one tensor of ``ggml_type``, by ggml's own to_float.
    F32 tensors are returned as they are."""
    if ggml_type == 0:  # GGML_TYPE_F32
        return np.ascontiguousarray(raw).view(np.float32).reshape(-1).copy()
    traits = _libs().ggml.ggml_get_type_traits(ggml_type).contents
    if not traits.to_float:
        raise QuantizationError(f"ggml has no dequantization for type {traits.type_name.decode()}")
    data = np.ascontiguousarray(raw).view(np.uint8)
    expected = n_elements // traits.blck_size * traits.type_size
    if n_elements % traits.blck_size or data.size != expected:
        raise QuantizationError(
            f"a {traits.type_name.decode()} tensor of {n_elements} values holds {data.size} bytes, expected {expected}"
        )
    out = np.empty(n_elements, dtype=np.float32)
    _TO_FLOAT(traits.to_float)(
        data.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n_elements
    )
    return out
