"""Capacity of tiny GPT-style models measured where the truth is known (docs/science.md section 6).

N sequences of S tokens drawn uniformly from a vocabulary of V hold exactly N * S * log2(V) bits and
nothing about them can be generalised, so everything a model learns about them is memorisation. The
estimator is mem_U with the uniform distribution as the reference (the optimal reference for this
data): for each sequence max(0, S * log2(V) - H(x | model)), summed over the data set (Morris et al.
2025). Train tiny models to saturation on data sets larger than their nominal capacity and the
memorised bits divided by the parameter count estimate bits per parameter (Morris et al.: about 3.6
for GPT-style models of 500K-1.5B parameters after long training; tiny models trained for a few
thousand steps on a CPU need not reach that).

`capacity_command` is `llmaudit validate capacity`; `benchmarks/bench_capacity.py` runs it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from llmaudit.analyze.memorization import LN2, mem_u_bits
from llmaudit.analyze.memorization_capacity import DEFAULT_BITS_PER_PARAM
from llmaudit.common.errors import UserError
from llmaudit.common.io import atomic_write_json, atomic_write_text
from llmaudit.common.runtime import torch_threads
from llmaudit.models.layers import count_parameters


@dataclass(frozen=True)
class TinyGPTSize:
    """Shape of a tiny GPT-2 model; written "DxL" or "DxLxH" on the command line."""

    d_model: int
    """Width (embedding size); must be divisible by n_head."""
    n_layer: int
    """Number of transformer blocks."""
    n_head: int = 2
    """Attention heads."""

    def __post_init__(self) -> None:
        if self.d_model <= 0 or self.n_layer <= 0 or self.n_head <= 0:
            raise ValueError(f"{self}: d_model, n_layer and n_head must be positive.")
        if self.d_model % self.n_head:
            raise ValueError(f"{self}: d_model={self.d_model} must be divisible by n_head={self.n_head}.")

    @property
    def label(self) -> str:
        return f"d{self.d_model}-L{self.n_layer}-H{self.n_head}"

    @classmethod
    def parse(cls, text: str | TinyGPTSize) -> TinyGPTSize:
        if isinstance(text, TinyGPTSize):
            return text
        try:
            parts = [int(p) for p in str(text).lower().split("x")]
        except ValueError:
            parts = []
        if len(parts) not in (2, 3):
            raise UserError(f"model size {text!r}: write DxL or DxLxH, e.g. 16x1 (width 16, one layer).")
        return cls(*parts)


DEFAULT_SIZES = ("8x1", "16x1")

DEFAULT_DATA_OVER_CAPACITY = (1.0, 2.0)


def true_entropy_bits(n_sequences: int, seq_len: int, vocab_size: int) -> float:
    """Information in N uniform random sequences: N * S * log2(V) bits."""
    return float(n_sequences * seq_len * math.log2(vocab_size))


def uniform_memorized_bits(h_model_bits: np.ndarray, seq_len: int, vocab_size: int) -> np.ndarray:
    """mem_U of each sequence with the uniform reference: max(0, S log2 V - H(x | model)).

    h_model_bits: [n] bits the model needs for each sequence -> [n] memorised bits, in [0, S log2 V]
    when the model's H is non-negative."""
    h_uniform = np.full_like(np.asarray(h_model_bits, dtype=np.float64), seq_len * math.log2(vocab_size))
    return mem_u_bits(h_uniform, h_model_bits)


def uniform_random_tokens(n_sequences: int, seq_len: int, vocab_size: int, *, seed: int) -> torch.Tensor:
    """[n_sequences, seq_len] token ids drawn independently and uniformly from range(vocab_size)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (n_sequences, seq_len), generator=generator)


def build_tiny_gpt(size: TinyGPTSize, *, vocab_size: int, seq_len: int, seed: int) -> torch.nn.Module:
    """A GPT-2 model built in code (no download): V data tokens plus a BOS token (id V), no dropout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    bos = vocab_size
    config = GPT2Config(
        vocab_size=vocab_size + 1,
        n_positions=seq_len,
        n_embd=size.d_model,
        n_layer=size.n_layer,
        n_head=size.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=bos,
        eos_token_id=bos,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def _data_logits(model: torch.nn.Module, tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Next-token logits [n, S, V] for every position: the input is BOS followed by x[:-1], so the first
    token is predicted too; the BOS column is dropped, the model predicts data tokens only."""
    bos = torch.full((tokens.shape[0], 1), vocab_size, dtype=tokens.dtype, device=tokens.device)
    inputs = torch.cat([bos, tokens[:, :-1]], dim=1)
    out = model(inputs)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[..., :vocab_size]


@torch.no_grad()
def model_sequence_bits(
    model: torch.nn.Module, tokens: torch.Tensor, vocab_size: int, *, batch_size: int = 1024
) -> np.ndarray:
    """H(x | model) = -log2 p(x | model) of each sequence. tokens: [n, S] -> bits [n].

    `model` maps input ids [b, S] to logits [b, S, >= V] (or an object with .logits)."""
    was_training = model.training
    model.eval()
    bits = []
    for start in range(0, tokens.shape[0], batch_size):
        batch = tokens[start : start + batch_size]
        logp = _data_logits(model, batch, vocab_size).float().log_softmax(-1)
        nats = -logp.gather(-1, batch[..., None])[..., 0].sum(-1)
        bits.append((nats / LN2).double().cpu().numpy())
    model.train(was_training)
    return np.concatenate(bits)


def _full_batch_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor, vocab_size: int
) -> float:
    """One optimizer step on the mean next-token cross-entropy of all `tokens`; returns that loss (nats/token)."""
    logits = _data_logits(model, tokens, vocab_size)
    loss = F.cross_entropy(logits.reshape(-1, vocab_size), tokens.reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def _window_gain(losses: list[float], window: int, log2v: float) -> tuple[float, float]:
    """(memorised bits per token implied by the mean loss of the last `window` steps, its relative gain over
    the window before)."""
    now = log2v - np.mean(losses[-window:]) / LN2
    before = log2v - np.mean(losses[-2 * window : -window]) / LN2
    return now, float((now - before) / max(abs(before), 1e-9))


def train_to_saturation(
    model: torch.nn.Module,
    tokens: torch.Tensor,
    vocab_size: int,
    *,
    lr: float = 1e-2,
    max_steps: int = 2500,
    window: int = 250,
    min_rel_gain: float = 0.01,
    cooldown_steps: int = 500,
) -> dict[str, Any]:
    """Full-batch AdamW (no weight decay, which would cap what the weights can hold) until saturation,
    then a linear learning-rate cooldown to 0 over `cooldown_steps` (it settles the weights into the
    minimum the constant rate hovers around: about +0.1 bit/param for the tiny models here).

    Saturation: the memorised bits per token implied by the mean training loss of the last `window`
    steps grew by less than `min_rel_gain` (relative) over the window before. The constant phase stops
    there or at `max_steps`, whichever comes first; the result says which."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    model.train()
    log2v = math.log2(vocab_size)
    losses: list[float] = []
    gain = None
    saturated = False
    for step in range(1, max_steps + 1):
        losses.append(_full_batch_step(model, optimizer, tokens, vocab_size))
        if step % window == 0 and step >= 2 * window:
            now, gain = _window_gain(losses, window, log2v)
            if now > 0 and gain < min_rel_gain:
                saturated = True
                break
    constant_steps = len(losses)
    for i in range(cooldown_steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * (cooldown_steps - i) / cooldown_steps
        losses.append(_full_batch_step(model, optimizer, tokens, vocab_size))
    return {
        "steps": len(losses),
        "constant_lr_steps": constant_steps,
        "saturated": saturated,
        "final_loss_nats_per_token": losses[-1] if losses else None,
        "last_window_relative_gain": gain,
    }


@dataclass(frozen=True)
class CapacityTraining:
    """The data and training settings of one capacity measurement (`measure_capacity`), in the order the
    results' settings record them."""

    seq_len: int = 16
    vocab_size: int = 16
    lr: float = 1e-2
    max_steps: int = 2500
    window: int = 250
    min_rel_gain: float = 0.01
    cooldown_steps: int = 500
    seed: int = 0
    device: str = "cpu"


def measure_capacity(
    size: TinyGPTSize | str, n_sequences: int, training: CapacityTraining | None = None, **options: Any
) -> dict[str, Any]:
    """Train one tiny model on N random sequences and measure what it memorised.

    training: `CapacityTraining` (default: its defaults); `options` are keyword overrides of its fields
    (`measure_capacity("8x1", 8, seq_len=8, max_steps=300)`). Returns params, true entropy, memorised bits
    (train), the same estimator on as many unseen random sequences (its false-positive floor: clipping at 0
    turns noise into positive bits), bits per parameter (memorised / params) and training facts (steps,
    saturated, wall time)."""
    t = replace(training or CapacityTraining(), **options)
    size = TinyGPTSize.parse(size)
    start = time.perf_counter()
    train = uniform_random_tokens(n_sequences, t.seq_len, t.vocab_size, seed=t.seed).to(t.device)
    heldout = uniform_random_tokens(n_sequences, t.seq_len, t.vocab_size, seed=t.seed + 1_000_003).to(t.device)
    model = build_tiny_gpt(size, vocab_size=t.vocab_size, seq_len=t.seq_len, seed=t.seed).to(t.device)
    params = count_parameters(model).total
    schedule = {k: getattr(t, k) for k in ("lr", "max_steps", "window", "min_rel_gain", "cooldown_steps")}
    training_facts = train_to_saturation(model, train, t.vocab_size, **schedule)
    memorized = float(_memorized_bits(model, train, t).sum())
    floor = float(_memorized_bits(model, heldout, t).sum())
    entropy = true_entropy_bits(n_sequences, t.seq_len, t.vocab_size)
    return {
        "model": size.label,
        **asdict(size),
        "params": params,
        "n_sequences": int(n_sequences),
        "n_tokens": int(n_sequences * t.seq_len),
        "true_entropy_bits": entropy,
        "nominal_capacity_bits": params * DEFAULT_BITS_PER_PARAM,
        "memorized_bits": memorized,
        "memorized_fraction_of_entropy": memorized / entropy,
        "heldout_bits": floor,
        "bits_per_param": memorized / params,
        "net_bits_per_param": (memorized - floor) / params,
        **training_facts,
        "wall_s": time.perf_counter() - start,
    }


def _memorized_bits(model: torch.nn.Module, tokens: torch.Tensor, t: CapacityTraining) -> np.ndarray:
    """mem_U with the uniform reference of each sequence of `tokens` [n, S] under `model` -> [n] bits."""
    return uniform_memorized_bits(model_sequence_bits(model, tokens, t.vocab_size), t.seq_len, t.vocab_size)


def _check_capacity_args(
    seq_len: int, vocab_size: int, n_sequences: Sequence[int] | None, data_over_capacity: Sequence[float]
) -> None:
    """Reject settings with no meaningful answer (a one-symbol vocabulary, empty sequences, ratios <= 0)."""
    if vocab_size < 2 or seq_len < 1:
        raise ValueError(f"vocab_size={vocab_size}, seq_len={seq_len}: need vocab_size >= 2 and seq_len >= 1.")
    if n_sequences is None and not all(r > 0 for r in data_over_capacity):
        raise ValueError(f"data_over_capacity={list(data_over_capacity)}: every ratio must be > 0.")


def _sequence_counts(
    params: int, n_sequences: Sequence[int] | None, data_over_capacity: Sequence[float], bits_per_sequence: float
) -> list[int]:
    """Data set sizes of one model: `n_sequences` when given, else each ratio x the nominal capacity
    (params x DEFAULT_BITS_PER_PARAM bits) in whole sequences, at least one."""
    if n_sequences is not None:
        return [int(n) for n in n_sequences]
    return [max(1, math.ceil(r * params * DEFAULT_BITS_PER_PARAM / bits_per_sequence)) for r in data_over_capacity]


def _print_progress(row: dict[str, Any], n: int) -> None:
    """One console line per measurement."""
    print(
        f"[capacity] {row['model']} ({row['params']} params) N={n}: "
        f"{row['memorized_bits']:.0f} of {row['true_entropy_bits']:.0f} bits, "
        f"{row['bits_per_param']:.2f} bits/param, {row['steps']} steps "
        f"({'saturated' if row['saturated'] else 'step cap'}), {row['wall_s']:.0f} s",
        flush=True,
    )


def _size_summary(size: TinyGPTSize, params: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A size's capacity estimate: its largest memorised total over the data sets."""
    best = max(rows, key=lambda r: r["memorized_bits"])
    return {
        "model": size.label,
        "params": params,
        "capacity_bits": best["memorized_bits"],
        "bits_per_param": best["bits_per_param"],
        "at_n_sequences": best["n_sequences"],
        # The model stored (nearly) all the data held: the data, not the model, was the
        # limit, and the estimate is only a lower bound on the capacity.
        "data_limited": best["memorized_bits"] >= 0.95 * best["true_entropy_bits"],
        "all_saturated": all(r["saturated"] for r in rows),
    }


def _measure_size(
    size: TinyGPTSize,
    n_sequences: Sequence[int] | None,
    data_over_capacity: Sequence[float],
    train_kw: dict[str, Any],
    progress: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All measurements of one model size (`measure_capacity` with `train_kw` per data set size) and
    the size's summary."""
    seq_len, vocab_size = train_kw["seq_len"], train_kw["vocab_size"]
    params = count_parameters(build_tiny_gpt(size, vocab_size=vocab_size, seq_len=seq_len, seed=train_kw["seed"])).total
    counts = _sequence_counts(params, n_sequences, data_over_capacity, seq_len * math.log2(vocab_size))
    rows = []
    for n in counts:
        row = measure_capacity(size, n, CapacityTraining(**train_kw))
        rows.append(row)
        if progress:
            _print_progress(row, n)
    return rows, _size_summary(size, params, rows)


def _capacity_settings(
    parsed: Sequence[TinyGPTSize],
    data_over_capacity: Sequence[float],
    n_sequences: Sequence[int] | None,
    train_kw: dict[str, Any],
    num_threads: int | None,
) -> dict[str, Any]:
    """The settings block of the capacity results (the data set sizes: ratios or explicit counts)."""
    return {
        "sizes": [s.label for s in parsed],
        "data_over_capacity": None if n_sequences is not None else list(data_over_capacity),
        "n_sequences": None if n_sequences is None else [int(n) for n in n_sequences],
        **train_kw,
        "num_threads": num_threads,
        "torch": torch.__version__,
    }


def capacity_command(
    out: str | os.PathLike = Path("llmaudit-out/capacity.json"),
    *,
    sizes: Sequence[str | TinyGPTSize] = DEFAULT_SIZES,
    data_over_capacity: Sequence[float] = DEFAULT_DATA_OVER_CAPACITY,
    n_sequences: Sequence[int] | None = None,
    num_threads: int | None = 1,
    markdown_out: str | os.PathLike | None = None,
    progress: bool = True,
    **training: Any,
) -> dict[str, Any]:
    """`llmaudit validate capacity`: bits per parameter of tiny GPT models on uniform random tokens.

    For each model size, data sets of `data_over_capacity` x the nominal capacity (params x 3.6 bits,
    rounded to whole sequences), or of exactly `n_sequences` sequences when given. A size's capacity
    estimate is its largest memorised total over the data sets (memorisation plateaus at capacity once
    the data hold more than the model can store). `training`: the fields of `CapacityTraining` (seq_len,
    vocab_size, lr, max_steps, ...). Writes JSON (and markdown if asked); returns it."""
    parsed = [TinyGPTSize.parse(s) for s in sizes]
    train_kw = asdict(CapacityTraining(**training))  # in the order the settings record them
    _check_capacity_args(train_kw["seq_len"], train_kw["vocab_size"], n_sequences, data_over_capacity)
    started = time.perf_counter()
    measurements, summary = [], []
    with torch_threads(num_threads):
        for size in parsed:
            rows, size_summary = _measure_size(size, n_sequences, data_over_capacity, train_kw, progress)
            measurements += rows
            summary.append(size_summary)
    result = {
        "experiment": "capacity on uniform random tokens (Morris et al. 2025, section 3)",
        "estimator": "sum over sequences of max(0, S*log2(V) - H(x | model)): mem_U, uniform reference",
        "settings": _capacity_settings(parsed, data_over_capacity, n_sequences, train_kw, num_threads),
        "reference_bits_per_param": DEFAULT_BITS_PER_PARAM,
        "summary": summary,
        "measurements": measurements,
        "wall_s": time.perf_counter() - started,
    }
    atomic_write_json(out, result)
    if markdown_out is not None:
        atomic_write_text(markdown_out, capacity_markdown(result))
    return result


def capacity_markdown(result: dict[str, Any]) -> str:
    """A table per measurement and the per-size capacity estimate."""
    s = result["settings"]
    lines = [
        "## Capacity on uniform random tokens",
        "",
        f"Vocabulary {s['vocab_size']}, sequences of {s['seq_len']} tokens "
        f"({s['seq_len'] * math.log2(s['vocab_size']):g} bits each); full-batch AdamW lr {s['lr']}, at most "
        f"{s['max_steps']} steps at constant rate, stopped when the memorised bits grew < "
        f"{s['min_rel_gain']:.0%} over {s['window']} steps (saturation), then {s['cooldown_steps']} steps of "
        f"linear cooldown. Estimator: {result['estimator']}. Held-out: the same estimator on as many "
        "unseen random sequences (its false-positive floor). Reference: about "
        f"{result['reference_bits_per_param']} bits/param for GPT models of 500K-1.5B parameters "
        "trained long (Morris et al.).",
        "",
        "| model | params | sequences | true entropy (bits) | memorised (bits) | held-out (bits) | "
        "bits/param | steps | saturated | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for m in result["measurements"]:
        lines.append(
            f"| {m['model']} | {m['params']} | {m['n_sequences']} | {m['true_entropy_bits']:.0f} | "
            f"{m['memorized_bits']:.0f} | {m['heldout_bits']:.0f} | {m['bits_per_param']:.2f} | "
            f"{m['steps']} | {'yes' if m['saturated'] else 'no (step cap)'} | {m['wall_s']:.0f} |"
        )
    lines += [
        "",
        "| model | params | capacity estimate (bits) | bits/param | note |",
        "|---|---:|---:|---:|---|",
    ]
    for row in result["summary"]:
        note = "data-limited: a lower bound" if row["data_limited"] else ""
        if not row["all_saturated"]:
            note = "; ".join(filter(None, [note, "not saturated at the step cap: a lower bound"]))
        lines.append(
            f"| {row['model']} | {row['params']} | {row['capacity_bits']:.0f} | {row['bits_per_param']:.2f} | {note} |"
        )
    return "\n".join(lines) + "\n"
