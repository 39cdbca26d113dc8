"""Tiny models, tokenizer and a per-sample loss built in code (nothing is downloaded)."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from tests.tiny_models import tiny_causal_lm

VOCAB = 512
INIT_RANGE = 0.1  # peakier next-token distributions than the default 0.02, so quantization visibly moves the losses
TEXT_WORDS = 500  # word ids w0..w499; 500 = [UNK], 501 = [PAD]


def build_tiny(arch: str, seed: int = 0) -> transformers.PreTrainedModel:
    return tiny_causal_lm(arch, seed=seed, vocab_size=VOCAB, initializer_range=INIT_RANGE)


def build_lora_merged(seed: int = 0) -> transformers.PreTrainedModel:
    """A Qwen2 with a rank-8 LoRA whose B is random (so the merge changes the weights), merged."""
    from peft import LoraConfig, get_peft_model

    base = build_tiny("qwen2", seed)
    peft_model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(seed + 1)
    for name, param in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return peft_model.merge_and_unload().eval()


@pytest.fixture(scope="session")
def tokenizer():
    vocab = {f"w{i}": i for i in range(TEXT_WORDS)}
    vocab["[UNK]"] = TEXT_WORDS
    vocab["[PAD]"] = TEXT_WORDS + 1
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]")


@pytest.fixture(scope="session")
def texts():
    g = torch.Generator().manual_seed(123)
    return [" ".join(f"w{int(i)}" for i in torch.randint(0, TEXT_WORDS, (32,), generator=g)) for _ in range(24)]


@pytest.fixture(scope="session")
def batch(tokenizer, texts):
    enc = tokenizer(texts[:16], return_tensors="pt", padding=True)
    return enc["input_ids"], enc["attention_mask"]


_MODELS: dict = {}


@pytest.fixture
def fresh_model():
    """fresh_model(kind) -> a disposable copy of a cached tiny model ('qwen2', 'llama', 'lora')."""

    def make(kind: str = "qwen2"):
        if kind not in _MODELS:
            _MODELS[kind] = build_lora_merged() if kind == "lora" else build_tiny(kind)
        return copy.deepcopy(_MODELS[kind])

    return make


@torch.no_grad()
def per_sample_loss(model, input_ids, attention_mask) -> torch.Tensor:
    """Mean next-token NLL per sample, the way the scoring engine calls a model:
    the decoder body, then the output head on the positions that are scored. -> [batch]"""
    device = model.get_output_embeddings().weight.device
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    target_mask = attention_mask[:, 1:].bool()
    h = hidden[:, :-1][target_mask]
    logits = model.get_output_embeddings()(h).float()
    nll = torch.nn.functional.cross_entropy(logits, input_ids[:, 1:][target_mask], reduction="none")
    rows = torch.arange(input_ids.shape[0], device=device)[:, None].expand(-1, input_ids.shape[1] - 1)[target_mask]
    sums = torch.zeros(input_ids.shape[0], device=device).index_add_(0, rows, nll)
    return (sums / target_mask.sum(1)).cpu()
