"""The compute dtype: chosen by the machine when a store is created, recorded, and honoured by every later
process; bf16 scores against float32 within a stated tolerance; the half-precision head path against float64."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import pytest
import torch

from llmaudit.models.layers import cast_parameters
from llmaudit.score.engine import head_scores, score_examples
from llmaudit.store.manifest import MANIFEST_VERSION
from llmaudit.store.run_store import RunStore, StoreError, content_digest
from tests.conftest import run_cli
from tests.score.test_engine import PAD_ID, _examples, _tiny_model

# -------------------------------------------------------------------------------------------- engine


def test_half_precision_head_equals_float64_on_the_rounded_logits():
    """A bf16 head: every statistic is the float64 log-softmax of the bf16-rounded logits (what head(h) gives),
    the target's logit read from the same rounded tile, so no NLL comes out negative."""
    gen = torch.Generator().manual_seed(5)
    head = torch.nn.Linear(16, 301, bias=False).to(torch.bfloat16)
    head.weight.data = (torch.randn(301, 16, generator=gen) * 2).to(torch.bfloat16)
    h = torch.randn(7, 16, generator=gen).to(torch.bfloat16)
    targets = torch.randint(0, 301, (7,), generator=gen)
    logits = head(h).double()  # rounded to bf16 by the matmul, then widened
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    mean = (p * logp).sum(1)
    std = (p * (logp - mean[:, None]).square()).sum(1).sqrt()
    for tile in (1, 64, 301):
        nll, m, s, top = head_scores(head, h, targets, vocab_stats=True, vocab_tile=tile)
        assert (nll.double() + logp.gather(1, targets[:, None]).squeeze(1)).abs().max() <= 1e-5
        assert torch.equal(top, logits.argmax(1))  # the top-1 of the rounded logits, first on ties
        assert (m.double() - mean).abs().max() <= 1e-5 and (s.double() - std).abs().max() <= 1e-5
        assert bool((nll >= -1e-6).all())


def test_bf16_scores_agree_with_float32_within_rounding():
    """The same tiny model scored with its parameters cast to bf16: per-token losses move by bf16 rounding only
    (stated tolerance: mean |d| per sample below 0.02 nats, every token within 0.25 nats)."""
    model = _tiny_model("llama")
    examples = _examples(seed=3, n=12)
    fp32 = score_examples(model, examples, pad_id=PAD_ID, vocab_stats=True, token_budget=256)
    bf16_model = cast_parameters(copy.deepcopy(model), torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in bf16_model.parameters())
    rotary = [b for name, b in bf16_model.named_buffers() if "inv_freq" in name]
    assert rotary and all(b.dtype == torch.float32 for b in rotary)  # buffers keep float32
    bf16 = score_examples(bf16_model, examples, pad_id=PAD_ID, vocab_stats=True, token_budget=256)
    per_sample = [abs(a.loss - b.loss) for a, b in zip(fp32, bf16, strict=True) if len(a.token_losses)]
    per_token = max(np.abs(a.token_losses - b.token_losses).max(initial=0) for a, b in zip(fp32, bf16, strict=True))
    assert 0 < np.mean(per_sample) < 0.02 and per_token < 0.25
    assert all((b.token_losses >= 0).all() for b in bf16)


# -------------------------------------------------------------------------------------------- stores


def _fake_probe(monkeypatch, speedup):
    import llmaudit.common.runtime as runtime

    record = {"bf16_speedup": speedup, "cpu": "Test CPU", "flags": "avx512_bf16", "measured": "2026-12-01"}
    monkeypatch.setattr(runtime, "matmul_probe", lambda **_: record)


@pytest.fixture
def auto_cfg(tiny_cfg):
    score = tiny_cfg.score.model_copy(update={"quantizers": ["full", "fp32", "uniform-4"]})
    model = tiny_cfg.model.model_copy(update={"dtype": "auto"})
    return tiny_cfg.model_copy(update={"model": model, "score": score})


def test_a_store_computes_in_the_dtype_chosen_when_it_was_created(auto_cfg, monkeypatch):
    from llmaudit.finetune.runs import finetune
    from llmaudit.score.stage import score

    _fake_probe(monkeypatch, 2.5)  # this machine: bf16 matmuls 2.5x faster
    store = finetune(auto_cfg, progress=False, echo=lambda *_: None)
    manifest = store.manifest()
    assert manifest["compute"]["dtype"] == "bfloat16" and "2.50x" in manifest["compute"]["reason"]
    _fake_probe(monkeypatch, 0.2)  # a later process on a machine where bf16 is slow: the store's dtype holds
    result = score(auto_cfg, store, progress=False, echo=lambda *_: None)
    assert result["dtype"] == "bfloat16"
    manifest = store.manifest()
    assert manifest["score_compute"]["dtype"] == "bfloat16"
    assert store.scored_quantizers() == ["bf16", "fp32", "uniform-4"]  # `full` named for what it is
    log = [json.loads(line) for line in store.worklog_path.read_text().splitlines()]
    dtypes = {(r["quantizer"], r["dtype"]) for r in log}
    assert dtypes == {("bf16", "bfloat16"), ("fp32", "float32"), ("uniform-4", "bfloat16")}
    assert {r["run"] for r in log if r["quantizer"] == "bf16"} == {-1, 0, 1, 2}  # the base on the reference
    # every unit says what the scoring process held once it was written, and the process's peak so far
    assert all(0 < r["rss_mib"] <= r["peak_rss_mib"] + 1 for r in log)
    peaks = [r["peak_rss_mib"] for r in log]
    assert peaks == sorted(peaks)  # one scoring process here: its peak never goes down

    # asking for another dtype on the scored store is refused with the fix (exit 2, one line)
    code, _, err = run_cli(["score", str(store.root), "score.dtype=float32", "--no-progress"])
    assert code == 2 and "is scored in bfloat16" in err and "copy the run directory" in err
    assert len(err.strip().splitlines()) == 1

    # a copy without its scores may be scored in float32; its reference is then named fp32
    copy_root = store.root.parent / "copy-fp32"
    shutil.copytree(store.root, copy_root, ignore=shutil.ignore_patterns("scores", "results", "report", "locks"))
    copied = RunStore(copy_root)
    cfg32 = auto_cfg.model_copy(
        update={
            "output_dir": str(copy_root),
            "score": auto_cfg.score.model_copy(update={"dtype": "float32", "quantizers": ["full", "uniform-4"]}),
        }
    )
    assert score(cfg32, copied, progress=False, echo=lambda *_: None)["dtype"] == "float32"
    assert copied.scored_quantizers()[:2] == ["bf16", "fp32"]  # add-only: the copy keeps the bf16 column ...
    log = [json.loads(line) for line in copied.worklog_path.read_text().splitlines()]
    assert {r["dtype"] for r in log} == {"float32"}  # ... now bf16-rounded weights computed in float32


def test_auto_on_a_cpu_with_slow_bf16_creates_a_float32_store(auto_cfg, monkeypatch):
    from llmaudit.finetune.experiment import prepare_experiment

    _fake_probe(monkeypatch, 0.17)
    store = RunStore(auto_cfg.resolved_output_dir())
    manifest = prepare_experiment(auto_cfg, store, echo=lambda *_: None)
    assert manifest["compute"]["dtype"] == "float32" and "0.17x" in manifest["compute"]["reason"]
    assert store.train_dtype("auto", torch.device("cpu")) is torch.float32
    assert store.reference_name() == "fp32"


def test_a_manifest_without_compute_records_keeps_the_cpu_float32_rule(tiny_cfg):
    """A version-2 manifest (no compute records, digest over its own keys) still reads, trains and scores in the
    rule it was made under: float32 on a CPU."""
    from llmaudit.finetune.experiment import prepare_experiment

    store = RunStore(tiny_cfg.resolved_output_dir())
    manifest = prepare_experiment(tiny_cfg, store, echo=lambda *_: None)
    for key in ("compute", "score_compute"):
        manifest.pop(key)
    manifest["manifest_version"] = 2
    manifest["content_digest"] = content_digest(manifest)  # digested over the version-2 keys
    store.manifest_path.write_text(json.dumps(manifest))
    assert store.manifest()["manifest_version"] == 2  # the digest of a v2 manifest covers its own keys
    assert store.train_dtype("auto", torch.device("cpu")) is torch.float32
    choice = store.scoring_choice("auto", torch.device("cpu"))
    assert choice.dtype is torch.float32 and "before llmaudit 0.3" in choice.reason
    upgraded = store.manifest()
    assert upgraded["manifest_version"] == MANIFEST_VERSION and upgraded["score_compute"]["dtype"] == "float32"


def test_an_edited_compute_record_is_caught_by_the_digest(tiny_cfg):
    from llmaudit.finetune.experiment import prepare_experiment

    store = RunStore(tiny_cfg.resolved_output_dir())
    manifest = prepare_experiment(tiny_cfg, store, echo=lambda *_: None)
    manifest["compute"]["dtype"] = "bfloat16"
    store.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match="modified after llmaudit wrote it"):
        store.manifest()
