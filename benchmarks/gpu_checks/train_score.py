"""Check e of benchmarks/gpu_check.py: bf16 LoRA training speed (tokens/s, steps/s) and scoring speed at a 16k
token budget with the Min-K%++ statistics, on the real model. Figures, no goal: it passes when the losses are
finite."""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from .common import Result, _device, _sync
from .models import audit_records, load_model


def check_train_score(args: argparse.Namespace, result: Result) -> None:
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model

    device = _device(args)
    gpu = device.type == "cuda"
    base, tok, source = load_model(args, real=gpu or args.model is not None)
    dtype = torch.bfloat16 if gpu else torch.float32
    n_train, n_score, batch, budget = (256, 1024, 16, 16384) if gpu else (32, 64, 8, 2048)
    train, _ = audit_records(tok, n_train, stream="gpu-check-train")
    scored, _ = audit_records(tok, n_score, stream="gpu-check-score")
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(base.to(device=device, dtype=dtype), lora)
    pad = tok.pad_token_id
    state, train_s = _timed_training(model, train, batch, pad, device)
    tokens = sum(len(i) for i, _ in train)
    steps = math.ceil(len(train) / batch)
    result.detail(model=source, dtype=str(dtype), train_records=len(train), train_tokens=tokens, train_s=train_s)
    merged = model.merge_and_unload().eval()
    scores, score_s = _timed_scoring(merged, scored, pad, device, budget)
    score_tokens = sum(len(i) for i, _ in scored)
    losses = np.array([s.loss for s in scores])
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if gpu else None
    result.detail(
        score_records=len(scored), score_tokens=score_tokens, score_s=score_s, token_budget=budget, peak_mib=peak
    )
    figure = (
        f"{source}, {str(dtype).removeprefix('torch.')} LoRA r16: train {tokens / train_s:.0f} tok/s ({steps / train_s:.1f} steps/s "
        f"of {batch}), last loss {state.last_loss:.3f}; score (vocab stats, budget {budget}) {score_tokens / score_s:.0f} tok/s"
        + (f"; peak {peak:.0f} MiB" if peak else "")
    )
    ok = math.isfinite(state.last_loss) and bool(np.isfinite(losses).all())
    result.set(status="pass" if ok else "fail", figure=figure, error=None if ok else "non-finite loss")


def _timed_training(model: Any, train: list, batch: int, pad: int, device: Any) -> tuple[Any, float]:
    """One epoch over `train` after a one-batch warm-up (kernels, allocator): its state and seconds."""
    from llmaudit.models.training import TrainSettings, train_epochs

    kw = TrainSettings(epochs=1, batch_size=batch, lr=1e-3, seed=0, pad_id=pad, device=device, progress=False)
    train_epochs(model, train[:batch], kw)  # warm-up: kernels, allocator
    _sync(device)
    t0 = time.monotonic()
    state = train_epochs(model, train, kw)
    _sync(device)
    return state, time.monotonic() - t0


def _timed_scoring(model: Any, scored: list, pad: int, device: Any, budget: int) -> tuple[list, float]:
    """`scored` through the scoring engine with the vocabulary statistics after a warm-up: scores, seconds."""
    from llmaudit.score.engine import score_examples

    score_examples(model, scored[:8], pad_id=pad, device=device, token_budget=budget, vocab_stats=True)  # warm-up
    _sync(device)
    t0 = time.monotonic()
    scores = score_examples(model, scored, pad_id=pad, device=device, token_budget=budget, vocab_stats=True)
    _sync(device)
    return scores, time.monotonic() - t0
