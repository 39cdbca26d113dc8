"""The built-in tiny model (`model.name: builtin:tiny-qwen2` or `builtin:tiny-llama`).

The built-in model is what the CPU demo and the tests use: a byte-level BPE tokenizer trained in code on
the offline SMolInstruct stand-in, with a ChatML chat template like Qwen2.5-Instruct's, and a 2-layer
Qwen2 model pre-trained on records disjoint from every audited sample, so that fine-tuning starts from a
base that knows the format (as a real instruct model does). It is built once and cached under
$LLMAUDIT_CACHE (default ~/.cache/llmaudit), a reusable built asset.

The CPU demo's base comes with llmaudit (models/assets/: this module's build of the demo recipe's
`model.builtin`, on one thread, with its files' SHA-256 digests): the demo fine-tunes from it at once rather than
pre-training it first, as a real audit starts from a downloaded base. Any other `model.builtin`, or
$LLMAUDIT_BUILD_BUILTIN=1, builds here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from llmaudit.common.io import atomic_dir, atomic_write_text
from llmaudit.common.runtime import cache_dir
from llmaudit.config import BuiltinModelConfig, ModelConfig
from llmaudit.data.chem import GENERATOR_VERSION, SUPPORTED_TASKS, generate_records
from llmaudit.data.tokenize import format_record
from llmaudit.models.training import TrainSettings, train_epochs

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"

BUILTIN_NAMES = ("tiny-qwen2", "tiny-llama")


def is_builtin(cfg: ModelConfig) -> bool:
    """Whether the model is a built-in tiny one (``builtin:NAME``): built here, and trained and scored on one thread
    (`configure_threads`) so that its numbers are the same on every machine.

    Args:
        cfg: the model section.

    Returns:
        True for ``builtin:NAME``.
    """
    return cfg.name.startswith(BUILTIN_PREFIX)


BUILTIN_VERSION = "1"

ASSETS = Path(__file__).resolve().parent / "assets"
"""Built-in bases that come with llmaudit, one directory per cache name (`tiny-qwen2-<builtin_key>`)."""

BUILD_ENV = "LLMAUDIT_BUILD_BUILTIN"
"""Set to 1: build a built-in base here even where llmaudit ships it (to check the shipped one, or on purpose)."""

DIGESTS = "SHA256SUMS"

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def builtin_key(cfg: ModelConfig) -> str:

    blob = json.dumps([BUILTIN_VERSION, GENERATOR_VERSION, cfg.name, cfg.builtin.model_dump()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def builtin_dir(cfg: ModelConfig, *, pretrain: bool) -> tuple[Path, Any]:
    """Directory of the cached built-in model (building it if needed) and its tokenizer."""
    from transformers import PreTrainedTokenizerFast

    root = cache_dir() / "builtin" / f"{cfg.name[len(BUILTIN_PREFIX) :]}-{builtin_key(cfg)}"
    if not (root / "DONE").exists():
        _build_once(cfg, root)
    tok = PreTrainedTokenizerFast.from_pretrained(str(root))
    return root, tok


def _build_once(cfg: ModelConfig, root: Path) -> None:
    """Build the model at `root` under a file lock: processes that need it at once build it once (the others wait
    and use it), and the temporary directories of a build that was killed are removed before the next one."""
    from filelock import FileLock

    root.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root.parent / f"{root.name}.lock"), timeout=6 * 3600):
        if (root / "DONE").exists():  # built by another process while this one waited
            return
        for stale in root.parent.glob(f".{root.name}.*.tmp"):  # atomic_dir's directory of a killed build
            shutil.rmtree(stale, ignore_errors=True)
        if os.environ.get(BUILD_ENV, "").strip() in ("", "0") and install_shipped(cfg, root):
            return
        build_builtin_model(cfg, root)


def shipped_files(name: str) -> dict[str, Path] | None:
    """The files of the shipped base `name` (a cache directory's name), each checked against its SHA-256 digest;
    None when llmaudit ships no such base or a file fails its digest (the base is then built).

    Args:
        name: the cache directory's name, `tiny-qwen2-<builtin_key>`.

    Returns:
        {file name: path}, or None.
    """
    asset = ASSETS / name
    if not (asset / DIGESTS).is_file():
        return None
    files = {}
    for line in (asset / DIGESTS).read_text().splitlines():
        digest, file = line.split(maxsplit=1)
        path = asset / file
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            log.warning("the shipped built-in base %s fails its digest at %s; building it instead", name, file)
            return None
        files[file] = path
    return files


def install_shipped(cfg: ModelConfig, root: Path) -> bool:
    """Copy the shipped base of `cfg` into the cache at `root`, when llmaudit ships one that passes its digests.

    Args:
        cfg: the model's config (a built-in model).
        root: its cache directory.

    Returns:
        True when it was installed; False when it must be built.
    """
    files = shipped_files(root.name)
    if files is None:
        return False
    with atomic_dir(root) as tmp:
        for file, path in files.items():
            shutil.copyfile(path, tmp / file)
    print(
        f"[model] the built-in base model {cfg.name} comes with llmaudit (pre-trained by it, digests checked); "
        f"cached in {root} ({BUILD_ENV}=1 builds it here)",
        file=sys.stderr,
        flush=True,
    )
    return True


def _pretrain_corpus(b: BuiltinModelConfig) -> tuple[list[dict], list[str]]:
    records = generate_records(SUPPORTED_TASKS, b.pretrain_samples, seed=b.seed, stream="pretrain")
    return records, [r["input"] + "\n" + r["output"] for r in records]


def builtin_tokenizer(cfg: ModelConfig) -> Any:
    """The built-in model's tokenizer without building the model or writing anything: read from the cache when
    the model is built, else trained in memory on the same corpus (seconds; what `llmaudit plan` counts with)."""
    from transformers import PreTrainedTokenizerFast

    root = cache_dir() / "builtin" / f"{cfg.name[len(BUILTIN_PREFIX) :]}-{builtin_key(cfg)}"
    if (root / "DONE").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(root))
    return build_tokenizer(_pretrain_corpus(cfg.builtin)[1], cfg.builtin.vocab_size)


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

    b = cfg.builtin
    short = cfg.name[len(BUILTIN_PREFIX) :]
    records, corpus = _pretrain_corpus(b)
    t0 = time.time()
    print(
        f"[model] building the built-in base model {cfg.name} once (tokenizer + pre-training); cached in {root}",
        file=sys.stderr,
        flush=True,
    )
    with atomic_dir(root) as tmp:
        tok = build_tokenizer(corpus, b.vocab_size)
        model = build_tiny_model(short, b, len(tok), tok.pad_token_id, tok.eos_token_id)
        if b.pretrain_epochs:
            # Full sequence loss: the base learns both the instructions and the answers' format.
            examples = [format_record(tok, r, include_prompt=True)[:2] for r in records]
            settings = TrainSettings(
                epochs=b.pretrain_epochs,
                batch_size=32,
                lr=b.pretrain_lr,
                seed=b.seed,
                pad_id=tok.pad_token_id,
                desc=f"pre-training {cfg.name}",
                schedule="cosine",
                progress=sys.stderr.isatty(),
            )
            train_epochs(model, examples, settings)
        model.eval()
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_text(tmp / "DONE", json.dumps({"config": cfg.model_dump(), "version": BUILTIN_VERSION}))
    print(f"[model] built in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return root
