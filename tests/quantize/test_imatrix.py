"""llama.cpp's importance matrix computed in torch: I_j = sum over token rows of x_j^2 / the number of rows, per block
weight, from the input each matrix product sees (tools/imatrix/imatrix.cpp)."""

from __future__ import annotations

import pytest
import torch

from llmaudit.quantize.imatrix import collect_importance, importance

from .conftest import build_tiny


def test_importance_is_the_mean_square_and_ones_without_tokens():
    sums = torch.tensor([4.0, 9.0, 0.0], dtype=torch.float64)
    assert torch.equal(importance(sums, 2), torch.tensor([2.0, 4.5, 0.0]))
    assert torch.equal(importance(sums, 0), torch.ones(3))  # load_imatrix's rule for a zero count
    assert importance(sums, 2).dtype == torch.float32


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_collected_importance_equals_the_inputs_mean_square(arch, tokenizer, texts):
    model = build_tiny(arch)
    modules = {
        "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj",
        "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj",
        "blk.1.ffn_down.weight": "model.layers.1.mlp.down_proj",
        "token_embd.weight": "model.embed_tokens",  # a lookup, not a product: never collected
    }
    samples = [tokenizer(t)["input_ids"] for t in texts[:5]]
    before = {n: p.clone() for n, p in model.named_parameters()}
    got = collect_importance(model, modules, samples)
    assert set(got) == {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight"}
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the model is not changed

    # independent: the attention's input is the first block's normed embeddings, over every token of every sample
    with torch.no_grad():
        attn = torch.cat([model.model.layers[0].input_layernorm(model.model.embed_tokens(torch.tensor([ids])))[0]
                          for ids in samples]).double()  # fmt: skip
    assert torch.allclose(got["blk.0.attn_q.weight"].double(), (attn**2).sum(0) / attn.shape[0], rtol=1e-5)
    assert torch.equal(got["blk.0.attn_q.weight"], got["blk.0.attn_v.weight"])  # the same input
    assert got["blk.1.ffn_down.weight"].shape == (model.config.intermediate_size,)

    # a mean over all token rows (the tool's S / n), not a mean of per-text means
    first, rest = collect_importance(model, modules, samples[:1]), collect_importance(model, modules, samples[1:])
    n_first, n_rest = len(samples[0]), sum(len(s) for s in samples[1:])
    for name, values in got.items():
        pooled = (first[name].double() * n_first + rest[name].double() * n_rest) / (n_first + n_rest)
        assert torch.allclose(values.double(), pooled, rtol=1e-5), name
