"""A quantized model the user already produced, scored as given in place of llmaudit's quantization of the same
checkpoint (``llmaudit import --quantized NAME=PATH``).

Per quantizer family:
- ``gguf-*``: a ``.gguf`` file of the fine-tune (made by llama.cpp's converter and ``llama-quantize``, or any tool
  writing the same tensor names). Every tensor it quantized is read and dequantized by ggml's own ``to_float`` (the
  weights an inference engine reads, as for llmaudit's own GGUF quantizers), the rows of Llama's attn_q / attn_k put
  back from llama.cpp's rotary layout, and set into the checkpoint's model; its float32 tensors (norms, biases) are
  set too.
- ``gptq-*``, ``awq-4``, ``bnb-*``: a checkpoint directory with ``config.json`` whose ``quantization_config`` names
  the method (gptq, awq, bitsandbytes) and safetensors weights, loaded by transformers with the method's library (its
  own kernels): the model as the user deploys it.

Refused in one line (QuantizationError naming the file and the fix) when the format does not fit the quantizer, when
the architecture or a tensor's shape differs from the checkpoint it claims to quantize, or when its weights are not a
quantization of that checkpoint (relative distance of the in-block weights above ``MAX_RELATIVE_DISTANCE``: another
model altogether). Files are identified by their sha256 (``describe``) and checked again before they are scored.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from llmaudit.common.bounded import magic_problem
from llmaudit.common.errors import UserError
from llmaudit.common.io import file_digest, read_json
from llmaudit.common.names import is_safe_name

from .base import QuantizationError

METHODS = {"gptq": "gptq", "awq": "awq", "bnb": "bitsandbytes"}
"""Quantizer family -> the quant_method its checkpoint directory's quantization_config names."""
MAX_RELATIVE_DISTANCE = 0.5
"""||W_given - W|| / ||W|| over the in-block weights above this is not a quantization of the checkpoint: 2-bit
llama.cpp types stay near 0.3, a different model of the same shapes is near 1.4."""


@dataclass(frozen=True)
class GivenFile:
    """A user's quantized model of one run's final checkpoint, as the manifest records it."""

    run: int
    step: int
    """The run's checkpoint it quantizes: the final one."""
    quantizer: str
    path: str
    kind: str
    """gguf | checkpoint"""
    files: dict[str, str]
    """{file name: sha256} (the .gguf itself, or every .json and .safetensors file of the directory)."""

    def to_dict(self) -> dict[str, Any]:
        """The record as the manifest holds it.

        Returns:
            Its fields as a dict.
        """
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> GivenFile:
        """The record as the manifest holds it (parsed by `store.records.GivenRecord` when the manifest is read).

        Args:
            record: the manifest's record.

        Returns:
            The record.
        """
        return cls(int(record["run"]), int(record["step"]), str(record["quantizer"]), str(record["path"]),
                   str(record["kind"]), dict(record["files"]))  # fmt: skip


def _family(quantizer: str) -> str:
    return quantizer.split("-", 1)[0]


def describe(run: int, step: int, quantizer: str, path: str | Path) -> GivenFile:
    """The record of a user's quantized model of one checkpoint, its files digested.

    Args:
        run: the run.
        step: the checkpoint's step.
        quantizer: the quantizer the model stands for.
        path: the user's file (GGUF) or checkpoint directory.

    Returns:
        The record.

    Raises:
        QuantizationError: the format does not fit the quantizer, or the path cannot be read (one line).
    """
    path = Path(path).expanduser().resolve()
    family = _family(quantizer)
    if family == "gguf":
        if not (path.is_file() and path.suffix == ".gguf"):
            raise QuantizationError(f"--quantized {quantizer}={path}: a gguf-* quantizer takes a .gguf file")
        return GivenFile(run, step, quantizer, str(path), "gguf", {path.name: file_digest(path)})
    if family not in METHODS:
        raise QuantizationError(
            f"--quantized {quantizer}={path}: only gguf-*, gptq-*, awq-4 and bnb-* quantizers take a file of your own"
        )
    if not (path / "config.json").is_file():
        raise QuantizationError(f"--quantized {quantizer}={path}: not a checkpoint directory (no config.json)")
    pickled = pickled_files(path)
    if pickled or not list(path.glob("*.safetensors")):
        why = f"pickled weights {pickled}, which llmaudit never loads" if pickled else "no safetensors weights"
        raise QuantizationError(
            f"--quantized {quantizer}={path}: {why}; fix: save the quantized model with safe_serialization=True "
            "into a directory without *.bin / *.pt / *.pth files"
        )
    method = _method(path)
    if method != METHODS[family]:
        raise QuantizationError(
            f"--quantized {quantizer}={path}: its quantization_config says quant_method={method!r}, "
            f"a {family} quantizer needs {METHODS[family]!r}"
        )
    names = sorted(p.name for p in path.iterdir() if p.is_file() and p.suffix in (".json", ".safetensors"))
    return GivenFile(run, step, quantizer, str(path), "checkpoint", {n: file_digest(path / n) for n in names})


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
"""Files a loader could unpickle: never loaded, and a directory holding one is refused."""


def pickled_files(directory: Path) -> list[str]:
    """The files in a directory that a loader could unpickle (``PICKLE_SUFFIXES``).

    Args:
        directory: the directory.

    Returns:
        Their names, sorted.
    """
    return sorted(p.name for p in directory.iterdir() if p.name.lower().endswith(PICKLE_SUFFIXES))


def _method(directory: Path) -> str | None:
    """The quant_method of the directory's config.json (None when it names none); QuantizationError naming the file
    when config.json is not a readable JSON object."""
    path = directory / "config.json"
    try:
        config = read_json(path, what="quantized model's config", limit=MAX_CONFIG_BYTES)
    except UserError as exc:
        raise QuantizationError(
            f"{' '.join(str(exc).split())[:400]} Fix: pass the directory the quantizer saved."
        ) from None
    if not isinstance(config, dict):
        raise QuantizationError(
            f"{path} is not a JSON object (a model configuration); fix: pass the directory the quantizer saved"
        )
    quant = config.get("quantization_config")
    return str(quant.get("quant_method"))[:100] if isinstance(quant, dict) else None


MAX_CONFIG_BYTES = 16 * 2**20
"""A model's config.json (a few KB; 16 MiB is far above any)."""


def _check_record(given: GivenFile) -> None:
    """The record as data: a known kind, its files single file names (never a path), a .gguf named by its path."""
    names = list(given.files)
    if given.kind not in ("gguf", "checkpoint") or not names or not all(is_safe_name(n) for n in names):
        raise QuantizationError(
            f"the record of {given.quantizer} (run {given.run}) names {names[:3]} as a {given.kind!r}: not file names "
            "of a quantized model; fix: import again"
        )
    if given.kind == "gguf" and names != [Path(given.path).name]:
        raise QuantizationError(
            f"the record of {given.quantizer} (run {given.run}) names {names[:3]}, not its .gguf file"
        )


def check_digests(given: GivenFile) -> None:
    """Refuse given files that are not the ones recorded.

    Args:
        given: the record.

    Raises:
        QuantizationError: a file's sha256 differs from the record, a file was added, or a pickle lies beside them
            (a loader could read it).
    """
    _check_record(given)
    path = Path(given.path)
    directory = path if given.kind == "checkpoint" else path.parent
    for name, digest in given.files.items():
        if not (directory / name).is_file() or file_digest(directory / name) != digest:
            raise QuantizationError(
                f"{directory / name}: the quantized file given for {given.quantizer} (run {given.run}) changed or "
                "is missing since `llmaudit import` recorded it; fix: restore it, or import again"
            )
    if given.kind == "checkpoint":
        pickled = pickled_files(path)
        if pickled:
            raise QuantizationError(
                f"{path}: holds pickled {pickled[:3]}, which llmaudit never loads (it could run code); fix: remove "
                "them (the model is read from its safetensors weights)"
            )
        added = sorted(
            p.name for p in path.iterdir() if p.suffix in (".json", ".safetensors") and p.name not in given.files
        )
        if added:
            raise QuantizationError(f"{path}: {added[0]} was added after `llmaudit import` recorded the directory")


def load_given(given: GivenFile, checkpoint: nn.Module, device: torch.device) -> nn.Module:
    """The user's quantized model of a checkpoint, checked against it. A checkpoint directory is loaded from its
    safetensors weights only, without code (never a pickle).

    Args:
        given: the record (its files are checked against their digests first).
        checkpoint: the checkpoint's model, which is modified: pass a copy.
        device: where the model goes.

    Returns:
        The model holding the user's weights.

    Raises:
        QuantizationError: the files are not the recorded ones, or they do not load as a model of the checkpoint.
    """
    check_digests(given)
    if given.kind == "gguf":
        return load_gguf(Path(given.path), checkpoint, given.quantizer).to(device).eval()
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            given.path, device_map=str(device), use_safetensors=True, trust_remote_code=False
        )
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise QuantizationError(f"{given.path} does not load as a {given.quantizer} checkpoint ({first})") from None
    check_shapes(model, checkpoint, given.path)
    return model.eval()


def check_shapes(model: nn.Module, checkpoint: nn.Module, where: str) -> None:
    """Refuse a model that is not one of the checkpoint's: another architecture, or a linear layer missing or of other
    in/out features.

    Args:
        model: the user's model.
        checkpoint: the checkpoint's model.
        where: the user's file (quoted).

    Raises:
        QuantizationError: the first difference, naming the layer.
    """
    mine, theirs = type(checkpoint).__name__, type(model).__name__
    if mine != theirs:
        raise QuantizationError(
            f"{where}: a {theirs}, the checkpoint it should quantize is a {mine}; fix: pass the model of this fine-tune"
        )
    layers = {n: m for n, m in model.named_modules() if isinstance(getattr(m, "in_features", None), int)}
    for name, module in checkpoint.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        other = layers.get(name)
        if other is None or (other.in_features, other.out_features) != (module.in_features, module.out_features):
            got = None if other is None else (other.out_features, other.in_features)
            raise QuantizationError(
                f"{where}: layer {name} is {got}, the checkpoint's is {(module.out_features, module.in_features)}; "
                "fix: pass the quantized model of this fine-tune (same base model)"
            )


def load_gguf(path: Path, model: nn.Module, quantizer: str) -> nn.Module:
    """A model with every weight of a GGUF file (dequantized by ggml) in place of its own.

    Args:
        path: the GGUF file.
        model: the checkpoint's model (modified in place).
        quantizer: the quantizer the file stands for (quoted).

    Returns:
        ``model``.

    Raises:
        QuantizationError: the file does not hold the model's weights (a tensor missing, of another shape or type).
    """
    import gguf

    from . import llama_cpp_lib
    from .gguf_layout import architecture

    arch = architecture(model)
    reader = read_gguf(path)
    written = gguf_string(reader, "general.architecture", path)
    if written != gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[arch]]:
        raise QuantizationError(
            f"{path}: a GGUF of architecture {written!r}, the checkpoint is {arch.lower()!r}; fix: pass the .gguf of this fine-tune"
        )
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch], int(model.config.num_hidden_layers))
    params = dict(model.named_parameters())
    distance, norm = 0.0, 0.0
    for tensor in reader.tensors:
        target = _parameter_name(names, params, tensor.name)
        if target is None:
            continue
        param = params[target]
        shape = tuple(reversed([int(n) for n in tensor.shape]))
        if shape != tuple(param.shape):
            raise QuantizationError(
                f"{path}: tensor {tensor.name} is {shape}, the checkpoint's {target} is {tuple(param.shape)}; fix: pass the "
                "quantized model of this fine-tune (same base model)"
            )
        raw = torch.from_numpy(llama_cpp_lib.dequantize(int(tensor.tensor_type), tensor.data, math.prod(shape)))
        values = _from_rotary_layout(raw.reshape(shape), tensor.name, model.config, arch)
        if ".layers." in f".{target}" and values.dim() == 2:
            distance += float((values - param.detach().float().cpu()).pow(2).sum())
            norm += float(param.detach().float().cpu().pow(2).sum())
        param.data = values.to(dtype=param.dtype, device=param.device)
    if norm == 0 or math.sqrt(distance / norm) > MAX_RELATIVE_DISTANCE:
        raise QuantizationError(
            f"{path}: its weights are not a quantization of this checkpoint (relative distance "
            f"{math.sqrt(distance / norm) if norm else float('inf'):.2f} > {MAX_RELATIVE_DISTANCE}); fix: pass the .gguf made from this "
            f"fine-tune for {quantizer}"
        )
    return model


def read_gguf(path: Path) -> Any:
    """gguf's reader of a user's GGUF file, its header and tensor table checked.

    Args:
        path: the file.

    Returns:
        The reader.

    Raises:
        QuantizationError: a Git LFS pointer, not a GGUF file, or a header or tensor table that does not fit in the
            file (a key cut short, tensor data past its end), naming the file.
    """
    import gguf

    why = magic_problem(path, b"GGUF", "GGUF")
    if why:
        raise QuantizationError(f"{path} {why}")
    try:
        reader = gguf.GGUFReader(str(path))
        size = path.stat().st_size
        for tensor in reader.tensors:
            if int(tensor.data_offset) + int(tensor.n_bytes) > size:
                raise ValueError(f"tensor {tensor.name!r}'s data ends past the end of the file")
    except QuantizationError:
        raise
    except Exception as exc:  # gguf raises IndexError, ValueError, struct and numpy errors on a damaged header
        first = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise QuantizationError(
            f"{path} is not a readable GGUF file ({type(exc).__name__}: {first}); fix: pass the complete .gguf file "
            "that llama.cpp wrote"
        ) from None
    return reader


def gguf_string(reader: Any, key: str, path: Path) -> str | None:
    """The string value of a metadata key of a GGUF file.

    Args:
        reader: gguf's reader of the file.
        key: the metadata key.
        path: the file (quoted).

    Returns:
        The value, or None when the key is absent.

    Raises:
        QuantizationError: the value is not a string.
    """
    field = reader.fields.get(key)
    if field is None:
        return None
    try:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except (IndexError, TypeError, ValueError, UnicodeDecodeError):
        raise QuantizationError(
            f"{path}: its metadata {key} is not a string; fix: pass the .gguf llama.cpp wrote"
        ) from None


def _parameter_name(names, params: dict[str, nn.Parameter], gguf_name: str) -> str | None:
    """The Hugging Face parameter a GGUF tensor holds (None for tensors the model has no place for, e.g. rope
    frequencies)."""
    for hf_name in params:
        base, _, suffix = hf_name.rpartition(".")
        if names.get_name(base) == gguf_name.rpartition(".")[0] and gguf_name.endswith(f".{suffix}"):
            return hf_name
    return None


def rotary_rows(n_rows: int, n_head: int) -> torch.Tensor:
    """The row order of llama.cpp's converter for Llama's attn_q / attn_k: each head's rows interleaved (row 2i of a
    head is its i-th row of the first half, row 2i+1 of the second half).

    Args:
        n_rows: the weight's rows.
        n_head: the number of heads.

    Returns:
        ``order`` with ``gguf_rows = hf_rows[order]``.
    """
    half = n_rows // n_head // 2
    heads = torch.arange(n_rows).reshape(n_head, 2, half)
    return heads.transpose(1, 2).reshape(-1)


def _from_rotary_layout(values: torch.Tensor, gguf_name: str, config, arch: str) -> torch.Tensor:
    if arch != "LLAMA" or not gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        return values
    heads = config.num_attention_heads if "attn_q" in gguf_name else config.num_key_value_heads
    restored = torch.empty_like(values)
    restored[rotary_rows(values.shape[0], heads)] = values
    return restored
