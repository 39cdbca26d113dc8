"""Base model and tokenizer: hub ids and local paths through `from_pretrained`, or the built-in tiny Qwen2.

The built-in model is what the CPU demo and the tests use: a byte-level BPE tokenizer trained in code on
the offline SMolInstruct stand-in, with a ChatML chat template like Qwen2.5-Instruct's, and a 2-layer
Qwen2 model pre-trained on records disjoint from every audited sample, so that fine-tuning starts from a
base that knows the format (as a real instruct model does). It is built once and cached under
$LLMAUDIT_CACHE (default ~/.cache/llmaudit), a reusable built asset.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

import torch

from llmaudit.config import BuiltinModelConfig, ModelConfig

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
BUILTIN_NAMES = ("tiny-qwen2", "tiny-llama")
BUILTIN_VERSION = "1"
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ModelRoute = Literal["builtin", "local", "hub"]


class ModelError(ValueError):
    """The model cannot be loaded; the message names the fix."""


def resolve_model_route(name: str) -> ModelRoute:
    """builtin:NAME, an existing local directory, or a hub id (`org/name`)."""
    if name.startswith(BUILTIN_PREFIX):
        short = name[len(BUILTIN_PREFIX):]
        if short not in BUILTIN_NAMES:
            raise ModelError(f"unknown built-in model {name!r}; available: {[BUILTIN_PREFIX + n for n in BUILTIN_NAMES]}")
        return "builtin"
    if Path(name).expanduser().is_dir():
        return "local"
    if name.startswith((".", "/", "~")) or os.sep in name.strip("/").replace("/", "", 1):
        raise ModelError(f"model path {name!r} does not exist (a local model is a directory with config.json).")
    return "hub"


def import_gptqmodel_quietly() -> None:
    """Import gptqmodel (when installed) with its start-up banner, environment notices and ASCII art
    captured instead of printed. peft imports it whenever it wraps a model in LoRA layers, so without this
    every fine-tuning and scoring job opens with a screen of text about GPU kernels. LLMAUDIT_LOG set: the
    banner is shown. An import that fails still raises, with its output attached."""
    import contextlib
    import importlib.util
    import io
    import sys

    if "gptqmodel" in sys.modules or os.environ.get("LLMAUDIT_LOG") or importlib.util.find_spec("gptqmodel") is None:
        return
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            import gptqmodel  # noqa: F401
    except Exception as exc:
        raise ImportError(f"importing gptqmodel failed ({exc}); its output:\n{captured.getvalue()[-2000:]}") from exc
    log.debug("gptqmodel import output:\n%s", captured.getvalue())


def configure_threads(cfg: ModelConfig) -> int:
    """CPU threads for torch: $LLMAUDIT_THREADS if set; 1 for the built-in tiny model, whose matrices are
    too small for intra-op parallelism to pay (measured 3x faster on 1 thread than on 2 on a loaded
    2-core machine); otherwise torch's default."""
    env = os.environ.get("LLMAUDIT_THREADS")
    if env:
        torch.set_num_threads(int(env))
    elif cfg.name.startswith(BUILTIN_PREFIX):
        torch.set_num_threads(1)
    return torch.get_num_threads()


def pick_device(requested: str = "auto") -> torch.device:
    if requested == "cuda" and not torch.cuda.is_available():
        raise ModelError("device=cuda was requested but no CUDA GPU is visible; use device=auto or cpu.")
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_dtype(cfg: ModelConfig, device: torch.device) -> torch.dtype:
    if cfg.dtype == "auto":
        # bf16 matmuls are ~6x slower than fp32 on CPUs without AMX: compute in fp32 there.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, cfg.dtype)


def cache_dir() -> Path:
    return Path(os.environ.get("LLMAUDIT_CACHE", Path.home() / ".cache" / "llmaudit"))


def load_tokenizer(cfg: ModelConfig) -> Any:
    route = resolve_model_route(cfg.name)
    if route == "builtin":
        return _builtin_dir(cfg, pretrain=False)[1]
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(cfg.name, revision=cfg.revision, trust_remote_code=cfg.trust_remote_code)
    except OSError as exc:
        raise _hub_error(cfg.name, exc) from exc
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_base_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """The base model before fine-tuning, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

    dtype = dtype or resolve_dtype(cfg, device)
    route = resolve_model_route(cfg.name)
    source = str(_builtin_dir(cfg, pretrain=True)[0]) if route == "builtin" else cfg.name
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            revision=None if route == "builtin" else cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            dtype=dtype,
        )
    except OSError as exc:
        raise _hub_error(cfg.name, exc) from exc
    return model.to(device).eval()


def _hub_error(name: str, exc: Exception) -> ModelError:
    return ModelError(
        f"could not load {name!r} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
        "If the machine is offline, download the model once elsewhere and set model.name to its local "
        "directory; or use model.name=builtin:tiny-qwen2 for the CPU demo."
    )


# ------------------------------------------------------------------------------------------ built-in


def builtin_key(cfg: ModelConfig) -> str:
    from llmaudit.chem_synthetic import GENERATOR_VERSION

    blob = json.dumps([BUILTIN_VERSION, GENERATOR_VERSION, cfg.name, cfg.builtin.model_dump()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _builtin_dir(cfg: ModelConfig, *, pretrain: bool) -> tuple[Path, Any]:
    """Directory of the cached built-in model (building it if needed) and its tokenizer."""
    from transformers import PreTrainedTokenizerFast

    root = cache_dir() / "builtin" / f"{cfg.name[len(BUILTIN_PREFIX):]}-{builtin_key(cfg)}"
    done = root / "DONE"
    if not done.exists():
        build_builtin_model(cfg, root)
    tok = PreTrainedTokenizerFast.from_pretrained(str(root))
    return root, tok


def build_tokenizer(corpus: list[str], vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(name: str, b: BuiltinModelConfig, vocab_size: int, pad_id: int, eos_id: int) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=b.hidden_size,
        intermediate_size=b.intermediate_size,
        num_hidden_layers=b.num_hidden_layers,
        num_attention_heads=b.num_attention_heads,
        num_key_value_heads=b.num_key_value_heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    config = Qwen2Config(**common) if name == "tiny-qwen2" else LlamaConfig(**common)
    torch.manual_seed(b.seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def build_builtin_model(cfg: ModelConfig, root: Path) -> Path:
    """Train the tokenizer, then pre-train the tiny model on records disjoint from every audited sample."""
    from llmaudit.chem_synthetic import SUPPORTED_TASKS, generate_records
    from llmaudit.data import format_record
    from llmaudit.io import atomic_dir, atomic_write_text
    from llmaudit.train_loop import train_epochs

    b = cfg.builtin
    short = cfg.name[len(BUILTIN_PREFIX):]
    records = generate_records(SUPPORTED_TASKS, b.pretrain_samples, seed=b.seed, stream="pretrain")
    corpus = [r["input"] + "\n" + r["output"] for r in records]
    import sys
    import time

    t0 = time.time()
    print(f"[model] building the built-in base model {cfg.name} once (tokenizer + pre-training); cached in {root}", file=sys.stderr, flush=True)
    with atomic_dir(root) as tmp:
        tok = build_tokenizer(corpus, b.vocab_size)
        model = build_tiny_model(short, b, len(tok), tok.pad_token_id, tok.eos_token_id)
        if b.pretrain_epochs:
            # Full sequence loss: the base learns both the instructions and the answers' format.
            examples = [format_record(tok, r, include_prompt=True)[:2] for r in records]
            train_epochs(
                model,
                examples,
                epochs=b.pretrain_epochs,
                batch_size=32,
                lr=b.pretrain_lr,
                seed=b.seed,
                pad_id=tok.pad_token_id,
                desc=f"pre-training {cfg.name}",
                schedule="cosine",
                progress=sys.stderr.isatty(),
            )
        model.eval()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_text(tmp / "DONE", json.dumps({"config": cfg.model_dump(), "version": BUILTIN_VERSION}))
    print(f"[model] built in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return root


def count_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameter counts."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total
