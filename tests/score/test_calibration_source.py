"""Where the calibrated quantizers (GPTQ, AWQ, the GGUF -imatrix ones) take their calibration text: a setting with a
default that touches no member, recorded with each quantizer."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from llmaudit.common.errors import UserError
from llmaudit.config import RecipeError, load_recipe
from llmaudit.quantize import get_quantizer
from llmaudit.quantize.calibration import read_calibration_file
from llmaudit.score.calibration import calibration_record, calibration_texts
from llmaudit.score.stage import check_quantizers
from llmaudit.store.run_store import RunStore

from ..conftest import TINY_OVERRIDES


def _inputs(source_file=None):
    pool = [{"input": f"member question {i}", "output": f"answer {i}"} for i in range(4)]
    val = [{"input": "held-out question", "output": "held-out answer"}]
    store = SimpleNamespace(read_records=lambda split: {"val": val}[split])
    masks = np.array([[True, False, True, False], [False, True, False, False]])
    cfg = SimpleNamespace(score=SimpleNamespace(calibration_file="corpus.txt"))
    return SimpleNamespace(pool_records=pool, masks=masks, store=store, calibration_file=source_file, cfg=cfg)


def test_each_source_gives_its_own_texts():
    inputs = _inputs((["public text one", "public text two"], "ab" * 32))
    gptq = {s: get_quantizer("gptq-4", calibration_source=s) for s in ("members", "heldout", "file")}
    assert calibration_texts(inputs, gptq["members"], 1) == ["member question 1\nanswer 1"]  # run 1's member only
    assert calibration_texts(inputs, gptq["members"], 0) == [
        "member question 0\nanswer 0",
        "member question 2\nanswer 2",
    ]
    assert calibration_texts(inputs, gptq["members"], -1) == calibration_texts(inputs, gptq["members"], 0)  # the base
    assert calibration_texts(inputs, gptq["heldout"], 0) == ["held-out question\nheld-out answer"]
    assert calibration_texts(inputs, gptq["file"], 1) == ["public text one", "public text two"]
    assert calibration_record(inputs, gptq["heldout"]) == {"source": "heldout"}
    assert calibration_record(inputs, gptq["file"]) == {"source": "file", "file": "corpus.txt", "sha256": "ab" * 32}
    assert calibration_record(inputs, get_quantizer("hqq-4")) is None


def test_the_default_touches_no_member_and_the_recipe_sets_every_calibrated_quantizer(monkeypatch):
    import torch

    from llmaudit.quantize.base import Quantizer
    from llmaudit.quantize.gguf_backend import GGUFQuantizer

    for cls in (Quantizer, GGUFQuantizer):  # this machine may lack a library: only the options are under test
        monkeypatch.setattr(cls, "check", lambda self, model=None: None)
    names = ["fp32", "hqq-4", "gptq-4", "awq-4", "gguf-q4_k_m", "gguf-q4_k_m-imatrix"]
    cfg = load_recipe("demo-cpu", [f"score.quantizers=[{','.join(names)}]"])
    assert cfg.score.calibration_source == "heldout"
    members = load_recipe("demo-cpu", [f"score.quantizers=[{','.join(names)}]", "score.calibration_source=members"])
    own = load_recipe(
        "demo-cpu",
        [
            f"score.quantizers=[{','.join(names)}]",
            "score.calibration_source=members",
            "score.quantizer_options={gptq-4: {calibration_source: heldout}}",
        ],
    )
    cpu = torch.device("cpu")
    for recipe, expected in ((cfg, "heldout"), (members, "members")):
        quantizers = check_quantizers(recipe, cpu)
        sources = {n: q.options["calibration_source"] for n, q in quantizers.items() if q.calibrated}
        assert sources == dict.fromkeys(["gptq-4", "awq-4", "gguf-q4_k_m-imatrix"], expected)
        assert "calibration_source" not in quantizers["gguf-q4_k_m"].options
    assert check_quantizers(own, cpu)["gptq-4"].options["calibration_source"] == "heldout"  # its own option wins
    assert check_quantizers(own, cpu)["awq-4"].options["calibration_source"] == "members"


def test_a_record_without_calibration_source_reads_as_calibrated_on_members():
    q = get_quantizer("gptq-4")
    recorded = {k: v for k, v in q.options.items() if k != "calibration_source"}
    why = q.recorded_options_mismatch(recorded)
    assert "calibration_source='members'" in why and "now calibration_source='heldout'" in why
    assert get_quantizer("gptq-4", calibration_source="members").recorded_options_mismatch(recorded) is None


def test_file_source_needs_a_file_and_the_file_is_read_with_its_digest(tmp_path):
    with pytest.raises(RecipeError, match="calibration_file"):
        load_recipe("demo-cpu", ["score.calibration_source=file"])
    text = tmp_path / "corpus.txt"
    text.write_text("First document,\nsecond line.\n\n\n  Second document.  \n", encoding="utf-8")
    texts, digest = read_calibration_file(text)
    assert texts == ["First document,\nsecond line.", "Second document."] and len(digest) == 64
    jsonl = tmp_path / "corpus.jsonl"
    jsonl.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"text": "two"}) + "\n", encoding="utf-8")
    assert read_calibration_file(jsonl)[0] == ["one", "two"]
    jsonl.write_text(json.dumps({"text": "one"}) + "\n" + json.dumps({"body": "two"}) + "\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"corpus.jsonl:2.*'text'"):
        read_calibration_file(jsonl)
    with pytest.raises(UserError, match="does not exist"):
        read_calibration_file(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("\n\n", encoding="utf-8")
    with pytest.raises(UserError, match="holds no text"):
        read_calibration_file(tmp_path / "empty.txt")


@pytest.mark.slow
def test_scoring_records_where_the_calibration_text_came_from(audited_tiny_store, tmp_path):
    from llmaudit.score.stage import score

    root = tmp_path / "exp"
    shutil.copytree(audited_tiny_store, root)
    overrides = TINY_OVERRIDES + [
        f"output_dir={root}",
        "score.quantizers=[fp32,uniform-4,sign,gptq-4]",
        "score.quantizer_options={gptq-4: {group_size: 32, calibration_samples: 4}}",
        "score.trajectory=final",
    ]
    cfg = load_recipe("demo-cpu", overrides)
    store = RunStore(root)
    score(cfg, store, progress=False, echo=lambda *a: None)
    record = json.loads(store.quantizer_info_path("gptq-4").read_text())
    assert record["calibration"] == {"source": "heldout"} and record["options"]["calibration_source"] == "heldout"
    assert "calibration" not in json.loads(store.quantizer_info_path("uniform-4").read_text())


def test_the_report_states_the_calibration_source_of_each_quantizer():
    from llmaudit.analyze.result import QuantizerInfo
    from llmaudit.report.grid import calibration_source

    def calibration_source_of(record):
        return calibration_source(QuantizerInfo.model_validate(record))

    assert calibration_source_of({"family": "gptq", "calibration": {"source": "heldout"}}) == "heldout"
    assert calibration_source_of({"family": "gptq", "options": {"bits": 4}}) == "members"  # no recorded source
    assert calibration_source_of({"family": "awq", "calibration": {"source": "file", "sha256": "0" * 64}}) == "file"
    assert calibration_source_of({"family": "hqq"}) is None and calibration_source_of({"family": "gguf"}) is None
