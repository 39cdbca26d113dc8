import pytest
import torch

from llmaudit.common.runtime import DeviceError, pick_device, resolve_dtype
from llmaudit.config import ModelConfig
from llmaudit.models.loading import ModelError, load_base_model, load_tokenizer, resolve_model_route


def test_routes(tmp_path):
    assert resolve_model_route("builtin:tiny-qwen2") == "builtin"
    assert resolve_model_route("Qwen/Qwen2.5-0.5B-Instruct") == "hub"
    assert resolve_model_route(str(tmp_path)) == "local"
    with pytest.raises(ModelError, match="unknown built-in"):
        resolve_model_route("builtin:gpt-17")
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_route(str(tmp_path / "missing" / "model"))


def test_hub_id_goes_through_from_pretrained_without_remote_code(monkeypatch):
    import transformers

    calls = []

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Linear(2, 2)

    def fake_model(name, **kwargs):
        calls.append(("model", name, kwargs))
        return Fake()

    def fake_tok(name, **kwargs):
        calls.append(("tokenizer", name, kwargs))
        return type("T", (), {"pad_token": None, "eos_token": "<|im_end|>"})()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tok)
    cfg = ModelConfig(name="Qwen/Qwen2.5-0.5B-Instruct", revision="main")
    model = load_base_model(cfg, torch.device("cpu"))
    tok = load_tokenizer(cfg)
    assert not model.training and tok.pad_token == "<|im_end|>"
    (_, name, kw), (_, tname, tkw) = calls
    assert name == tname == "Qwen/Qwen2.5-0.5B-Instruct"
    assert (
        kw["revision"] == "main"
        and kw["trust_remote_code"] is False
        and kw["dtype"] == resolve_dtype("auto", torch.device("cpu"))
    )  # the machine's choice
    assert tkw["trust_remote_code"] is False


def test_offline_hub_load_names_the_fix(monkeypatch):
    import transformers

    def offline(*a, **k):
        raise OSError("We couldn't connect to 'https://huggingface.co'")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline)
    with pytest.raises(ModelError, match="local directory"):
        load_base_model(ModelConfig(name="Qwen/Qwen2.5-0.5B-Instruct"), torch.device("cpu"))


def test_cuda_request_without_gpu_fails_clearly():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceError, match="no CUDA GPU"):
        pick_device("cuda")
    assert pick_device("auto").type == "cpu"


def test_builtin_model_is_built_once_and_knows_the_format(tiny_cfg):
    from llmaudit.common.runtime import cache_dir
    from llmaudit.data.chem import generate_records
    from llmaudit.data.tokenize import format_record
    from llmaudit.models.builtin import builtin_key
    from llmaudit.score.engine import score_examples

    cfg = tiny_cfg.model
    model = load_base_model(cfg, torch.device("cpu"))
    root = cache_dir() / "builtin" / f"tiny-qwen2-{builtin_key(cfg)}"
    assert (root / "DONE").exists() and (root / "tokenizer.json").exists()
    stamp = (root / "DONE").stat().st_mtime_ns
    load_base_model(cfg, torch.device("cpu"))
    assert (root / "DONE").stat().st_mtime_ns == stamp  # cached, not rebuilt
    tok = load_tokenizer(cfg)
    recs = generate_records(["molecule_captioning"], 8, seed=0, stream="audit")
    ex = [tuple(format_record(tok, r)[:2]) for r in recs]
    pre = score_examples(model, ex, pad_id=tok.pad_token_id)
    fresh = type(model)(model.config)  # same architecture, untrained
    untrained = score_examples(fresh.eval(), ex, pad_id=tok.pad_token_id)
    # pre-training on disjoint records taught the response format: far below the uniform-guess loss
    assert sum(s.loss for s in pre) < 0.75 * sum(s.loss for s in untrained)
