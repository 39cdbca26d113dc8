"""`--out` never writes a store over someone's files: a non-empty directory that is not a store of the same
experiment (or one being created for it) is refused in one line before anything is written."""

from __future__ import annotations

import pytest

from llmaudit.config import load_recipe
from llmaudit.store.run_store import RunStore, StoreError
from tests.conftest import TINY_OVERRIDES, run_cli


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["finetune", "audit"])
def test_a_directory_of_someone_elses_files_is_refused(command, tmp_path):
    out = tmp_path / "mine"
    (out / "data").mkdir(parents=True)
    (out / "config.yaml").write_text("my: settings\n")
    (out / "data" / "pool.jsonl").write_text('{"my": "data"}\n')
    before = tree(out)
    code, _, err = run_cli([command, "demo-cpu", *TINY_OVERRIDES, "--out", out, "--no-progress"])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"output directory {out} is not empty (config.yaml, data)" in err and "--out" in err
    assert tree(out) == before


def test_new_empty_or_claimed_directories_are_accepted(tmp_path):
    cfg = load_recipe("demo-cpu", TINY_OVERRIDES)
    RunStore(tmp_path / "new").check_identity(cfg)
    (tmp_path / "empty").mkdir()
    RunStore(tmp_path / "empty").check_identity(cfg)
    store = RunStore(tmp_path / "claimed")
    store.begin_create(cfg)  # then killed after writing its data files: the rerun goes on
    (store.root / "data").mkdir()
    (store.root / "data" / "pool.jsonl").write_text("{}\n")
    store.check_identity(cfg)
    other = load_recipe("demo-cpu", [*TINY_OVERRIDES, "train.seed=7"])
    with pytest.raises(StoreError, match="holds no llmaudit store of this experiment"):
        store.check_identity(other)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        RunStore(tmp_path / "file").check_identity(cfg)
