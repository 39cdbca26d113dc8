"""The llama.cpp scoring engine: its losses and every column the attacks read equal a direct llama-cpp-python
evaluation of the same quantized file and tokens; the file is llmaudit's GGUF quantization (the same types and
bytes); `llmaudit score ... score.engine=llama.cpp` scores a store's GGUF units through llama.cpp and records it.

Without llama-cpp-python these tests are skipped with the reason, unless LLMAUDIT_LLAMA_CPP_REQUIRED=1 (CI).
"""

from __future__ import annotations

import copy
import json
import os
import shutil

import numpy as np
import pytest
import torch

from llmaudit.quantize import llama_cpp_lib

REQUIRED = os.environ.get("LLMAUDIT_LLAMA_CPP_REQUIRED") == "1"
if llama_cpp_lib.availability():
    if REQUIRED:
        raise RuntimeError(f"LLMAUDIT_LLAMA_CPP_REQUIRED=1 but {llama_cpp_lib.availability()}")
    pytest.skip(llama_cpp_lib.availability(), allow_module_level=True)

from llmaudit.config import load_recipe  # noqa: E402
from llmaudit.finetune.runs import finetune  # noqa: E402
from llmaudit.quantize import get_quantizer  # noqa: E402
from llmaudit.quantize.gguf_runtime import LlamaCppModel  # noqa: E402
from llmaudit.quantize.given import rotary_rows  # noqa: E402
from llmaudit.score.llama_cpp_engine import ENGINE_METADATA_KEY, EngineModel  # noqa: E402
from llmaudit.store.losstable import read_loss_table, unit_metadata  # noqa: E402
from llmaudit.store.run_store import RunStore  # noqa: E402
from llmaudit.store.worklog import read_work  # noqa: E402
from tests.conftest import TINY_OVERRIDES, run_cli  # noqa: E402
from tests.tiny_models import tiny_causal_lm  # noqa: E402

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    """A Llama whose widths take the k-quants (multiples of 256), peaky next-token distributions."""
    return tiny_causal_lm("llama", seed=3, hidden_size=256, intermediate_size=256, num_attention_heads=4,
                          num_key_value_heads=1, initializer_range=0.1)  # fmt: skip


@pytest.fixture(scope="module")
def q4(model, tmp_path_factory):
    quantizer = get_quantizer("gguf-q4_k_m", device="cpu", engine="llama.cpp")
    path = quantizer.quantize_to_file(model, tmp_path_factory.mktemp("gguf") / "q4_k_m.gguf")
    return quantizer, path


def _examples(seed=0):
    """Token sequences of several lengths, the first third of each masked out (a prompt)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in (9, 40, 23, 57, 2, 31):
        ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        out.append((ids, [i >= n // 3 for i in range(n)]))
    return out


def _direct_logits(path, tokens):
    """llama-cpp-python's own Llama class on the file: one sequence, logits of every position (flash attention
    on, as llama.cpp's default `auto` chooses on a CPU)."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, flash_attn=True, n_threads=1,
                          verbose=False)  # fmt: skip
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


def test_losses_and_attack_columns_equal_a_direct_llama_cpp_python_evaluation(q4):
    _, path = q4
    examples = _examples()
    with LlamaCppModel(path, threads=1) as runtime:
        scores = EngineModel(runtime, vocab_stats=True, budget=2048, device=torch.device("cpu")).score(examples)
    for (ids, mask), s in zip(examples, scores, strict=True):
        logits = _direct_logits(path, ids)[:-1][np.asarray(mask[1:])]
        targets = np.asarray(ids[1:])[np.asarray(mask[1:])]
        log_p = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        nll = -log_p[np.arange(len(targets)), targets]
        p = np.exp(log_p)
        mean = (p * log_p).sum(1)
        std = np.sqrt((p * (log_p - mean[:, None]) ** 2).sum(1))
        assert len(s.token_losses) == len(targets)
        np.testing.assert_allclose(s.token_losses, nll, rtol=2e-6, atol=2e-6)  # float32 rounding
        np.testing.assert_allclose(s.vocab_mean, mean, rtol=2e-6, atol=2e-6)
        np.testing.assert_allclose(s.vocab_std, std, rtol=2e-5, atol=2e-6)
        assert (s.top1 == (logits.argmax(1) == targets)).all()
    assert np.concatenate([s.token_losses for s in scores]).std() > 0.5  # peaky: the comparison is not vacuous


def test_scores_do_not_depend_on_how_samples_share_a_decode_call(q4):
    _, path = q4
    examples = _examples(1)
    with LlamaCppModel(path, threads=1) as runtime:
        together = EngineModel(runtime, vocab_stats=True, budget=4096, device=torch.device("cpu")).score(examples)
        alone = EngineModel(runtime, vocab_stats=True, budget=1, device=torch.device("cpu")).score(examples)
    for a, b in zip(together, alone, strict=True):
        assert np.array_equal(a.token_losses, b.token_losses) and np.array_equal(a.vocab_std, b.vocab_std)


def test_the_file_scored_is_llmaudits_gguf_quantization(model, q4):
    """Every tensor of the runnable file has the type and bytes of the quantizer's own blocks (attn_q / attn_k
    rows in llama.cpp's rotary order, as the converter writes them); norms stay float32."""
    import gguf

    quantizer, path = q4
    blocks = {t.name: t for t in get_quantizer("gguf-q4_k_m", device="cpu").quantize_blocks(copy.deepcopy(model))}
    tensors = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    assert set(blocks) < set(tensors)
    assert {gguf.GGMLQuantizationType(int(tensors[n].tensor_type)).name for n in set(tensors) - set(blocks)} == {"F32"}
    for name, block in blocks.items():
        raw = np.array(tensors[name].data).view(np.uint8).reshape(block.shape[0], -1)
        mine = block.raw.reshape(block.shape[0], -1)
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            mine = mine[rotary_rows(block.shape[0], 4 if "attn_q" in name else 1)]
        assert gguf.GGMLQuantizationType(int(tensors[name].tensor_type)).name == block.type_name, name
        assert np.array_equal(raw, mine), name
    assert set(quantizer.tensor_types().values()) == {"Q4_K", "Q6_K"}


def test_greedy_answers_are_an_argmax_loop_of_the_direct_evaluation(q4):
    _, path = q4
    prompts = [ids[:7] for ids, _ in _examples(2)[:3]]
    with LlamaCppModel(path, threads=1) as runtime:
        answers = runtime.greedy(prompts, max_new_tokens=6, stop_ids=[])
    for prompt, answer in zip(prompts, answers, strict=True):
        tokens = list(prompt)
        for _ in range(6):
            tokens.append(int(_direct_logits(path, tokens)[-1].argmax()))
        assert answer == tokens[len(prompt) :]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama-engine") / "exp"
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES + [f"output_dir={root}", "train.runs=2"])
    finetune(cfg, progress=False, echo=lambda *a: None)
    return root


def _copy(trained, tmp_path, name):
    root = tmp_path / name
    shutil.copytree(trained, root)
    return root


QUANTIZERS = "score.quantizers=[fp32,gguf-q4_k_m]"


def test_score_through_llama_cpp_records_the_engine_and_keeps_torch_as_reference(trained, tmp_path):
    root = _copy(trained, tmp_path, "llama")
    code, _, err = run_cli(["score", root, QUANTIZERS, "score.engine=llama.cpp", "train.runs=2", "--no-progress"])
    assert code == 0, err
    store = RunStore(root)
    final = store.checkpoints(0)[-1]
    engines = {q: unit_metadata(store.unit_path(0, final, q)).get(ENGINE_METADATA_KEY) for q in ("fp32", "gguf-q4_k_m")}
    assert engines == {"fp32": b"torch", "gguf-q4_k_m": b"llama.cpp"}
    record = json.loads(store.quantizer_info_path("gguf-q4_k_m").read_text())
    assert record["options"]["engine"] == "llama.cpp" and record["effective_bits"] > 4
    assert {w["engine"] for w in read_work(store.worklog_path) if w["quantizer"] == "gguf-q4_k_m"} == {"llama.cpp"}
    df = read_loss_table(store.scores_dir)
    gguf_final = df[(df["quantizer"] == "gguf-q4_k_m") & (df["run"] == 0) & (df["checkpoint"] == final)]
    kl = np.concatenate([v for v in gguf_final["token_kl"] if isinstance(v, np.ndarray)])
    assert np.isfinite(kl).all() and kl.mean() > 0  # llama.cpp's logits against torch's full precision
    assert gguf_final["generated"].map(lambda v: isinstance(v, str)).sum() == 2

    torch_root = _copy(trained, tmp_path, "torch")
    code, _, err = run_cli(["score", torch_root, QUANTIZERS, "score.engine=torch", "train.runs=2", "--no-progress"])
    assert code == 0, err
    other = read_loss_table(RunStore(torch_root).scores_dir)
    a = df[df["quantizer"] == "gguf-q4_k_m"].sort_values(["run", "checkpoint", "sample_id"])
    b = other[other["quantizer"] == "gguf-q4_k_m"].sort_values(["run", "checkpoint", "sample_id"])
    dloss = np.abs(np.concatenate(list(a["token_losses"])) - np.concatenate(list(b["token_losses"])))
    assert 0 < dloss.mean() < 0.05  # the same quantized weights, another arithmetic
    # one quantizer name means one engine in a store
    code, _, err = run_cli(["score", root, QUANTIZERS, "score.engine=torch", "train.runs=2", "--no-progress"])
    assert code == 2 and "engine='llama.cpp'" in err, err
