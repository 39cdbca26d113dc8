"""`llmaudit plan` of a hub recipe offline downloads nothing and writes nothing: no cache entry (no built-in model
pre-trained for a stand-in tokenizer, no GGUF converted), no output directory."""

from __future__ import annotations

from tests.conftest import run_cli


def files_under(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_an_offline_plan_of_a_hub_recipe_downloads_and_writes_nothing(monkeypatch, tmp_path):
    cache, work = tmp_path / "cache", tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    code, out, err = run_cli(
        ["plan", "qwen2.5-0.5b-smolinstruct", "data.pool_size=64", "data.val_size=16", "--device", "h100"],
        env={"HF_HUB_OFFLINE": "1", "LLMAUDIT_CACHE": str(cache)},
    )
    assert code == 0, err
    assert "published shape" in out and "builtin:tiny-qwen2" in out
    assert files_under(cache) == [] and files_under(work) == []
