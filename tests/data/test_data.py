import json
import zipfile

import numpy as np
import pytest

from llmaudit.config import DataConfig
from llmaudit.data.chem import generate_records
from llmaudit.data.pool import draw_pool_and_val, membership_masks
from llmaudit.data.records import RECORD_FIELDS, DataError, dataset_fingerprint, read_record_file
from llmaudit.data.sources import load_records, resolve_route
from llmaudit.data.tokenize import format_record

TASKS = ["molecule_captioning", "molecule_generation"]


def test_generator_is_deterministic_and_streams_are_disjoint():
    a = generate_records(TASKS, 50, seed=3, stream="audit")
    b = generate_records(TASKS, 50, seed=3, stream="audit")
    c = generate_records(TASKS, 50, seed=3, stream="pretrain")
    assert a == b
    assert dataset_fingerprint(a) == dataset_fingerprint(b)
    assert not {r["sample_id"] for r in a} & {r["sample_id"] for r in c}
    assert generate_records(TASKS, 50, seed=4)[0] != a[0]


def test_generated_records_have_smolinstruct_fields_and_valid_smiles():
    recs = generate_records(TASKS, 200, seed=0)
    for r in recs:
        assert set(RECORD_FIELDS) <= set(r)
        assert r["task"] in TASKS
    gen = [r for r in recs if r["task"] == "molecule_generation"]
    assert all(r["output"].startswith("<SMILES> ") and r["output"].endswith(" </SMILES>") for r in gen)
    cap = [r for r in recs if r["task"] == "molecule_captioning"]
    assert all("<SMILES> " + r["raw_input"] + " </SMILES>" in r["input"] for r in cap)
    chem = pytest.importorskip("rdkit.Chem")
    smiles = [r["raw_input"] for r in cap] + [r["raw_output"] for r in gen]
    assert all(chem.MolFromSmiles(s) is not None for s in smiles)


def _write_smolinstruct_tree(root, split="train"):
    """A miniature data.zip layout, as SMolInstruct's loading script reads it."""
    (root / "raw" / split).mkdir(parents=True)
    (root / "sample" / "instruction_tuning" / split).mkdir(parents=True)
    (root / "template" / "instruction_tuning").mkdir(parents=True)
    (root / "core_tag").mkdir()
    rows = [
        {"input": "CCO", "output": "The molecule is ethanol.", "task": "molecule_captioning", "split": split},
        {"input": "c1ccccc1", "output": "The molecule is benzene.", "task": "molecule_captioning", "split": split},
    ]
    (root / "raw" / split / "molecule_captioning.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (root / "template" / "instruction_tuning" / "molecule_captioning.json").write_text(
        json.dumps(
            [
                {"input": "Describe <INPUT>", "output": "<OUTPUT>"},
                {"input": "What is <INPUT>?", "output": "It: <OUTPUT>"},
            ]
        )
    )
    (root / "sample" / "instruction_tuning" / split / "molecule_captioning.json").write_text(
        json.dumps(
            {
                "template_name": "instruction_tuning",
                "samples": [{"idx": 1, "template_id": 1, "target": "benzene"}, {"idx": 0, "template_id": 0}],
            }
        )
    )
    (root / "core_tag" / "molecule_captioning.json").write_text(
        json.dumps({"input": ["<SMILES>", "</SMILES>"], "output": ["", ""]})
    )


def test_smolinstruct_directory_and_zip_are_joined_like_the_loading_script(tmp_path):
    tree = tmp_path / "data"
    _write_smolinstruct_tree(tree)
    cfg = DataConfig(source="local", path=str(tmp_path), tasks=["molecule_captioning"])
    assert resolve_route(cfg) == "local-smolinstruct-dir"
    recs, route = load_records(cfg)
    assert route == "local-smolinstruct-dir"
    assert recs[0]["input"] == "What is <SMILES> c1ccccc1 </SMILES>?"
    assert recs[0]["output"] == "It: The molecule is benzene."
    assert recs[0]["target"] == "benzene" and recs[0]["sample_id"] == "molecule_captioning/train/1"
    assert recs[1]["input"] == "Describe <SMILES> CCO </SMILES>" and recs[1]["raw_input"] == "CCO"

    zpath = tmp_path / "data.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in tree.rglob("*"):
            if f.is_file():
                zf.write(f, f"data/{f.relative_to(tree)}")
    zcfg = DataConfig(source="local", path=str(zpath), tasks=["molecule_captioning"])
    assert resolve_route(zcfg) == "local-zip"
    assert load_records(zcfg)[0] == recs


def test_hub_route_downloads_data_zip(monkeypatch, tmp_path):
    tree = tmp_path / "data"
    _write_smolinstruct_tree(tree)
    zpath = tmp_path / "data.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in tree.rglob("*"):
            if f.is_file():
                zf.write(f, f"data/{f.relative_to(tree)}")
    calls = []

    def fake_download(**kwargs):
        calls.append(kwargs)
        return str(zpath)

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    cfg = DataConfig(source="hub", tasks=["molecule_captioning"])
    recs, route = load_records(cfg)
    assert route == "hub" and len(recs) == 2
    assert calls == [{"repo_id": "osunlp/SMolInstruct", "filename": "data.zip", "repo_type": "dataset"}]


def test_hub_route_offline_says_how_to_fix(monkeypatch):
    import huggingface_hub

    def offline(**kwargs):
        raise OSError("offline mode is enabled")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    with pytest.raises(DataError, match="data.source=local data.path"):
        load_records(DataConfig(source="hub"))


def test_local_jsonl_and_parquet_and_their_errors(tmp_path):
    good = {
        "input": "Describe <SMILES> C </SMILES>",
        "output": "Methane.",
        "task": "molecule_captioning",
        "split": "train",
    }
    f = tmp_path / "recs.jsonl"
    f.write_text(json.dumps(good) + "\n" + json.dumps({**good, "output": "Methane again."}) + "\n")
    cfg = DataConfig(source="local", path=str(f), tasks=["molecule_captioning"])
    assert resolve_route(cfg) == "local-files"
    recs, _ = load_records(cfg)
    assert len(recs) == 2 and recs[0]["sample_id"] != recs[1]["sample_id"]

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([good]), tmp_path / "recs.parquet")
    assert read_record_file(tmp_path / "recs.parquet")[0]["output"] == "Methane."

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:2: malformed JSON"):
        read_record_file(bad)
    missing = tmp_path / "missing_field.jsonl"
    missing.write_text(json.dumps({"input": "x", "task": "molecule_captioning"}) + "\n")
    with pytest.raises(DataError, match=r"missing_field\.jsonl:1: malformed record.*'output'"):
        read_record_file(missing)
    with pytest.raises(DataError, match="does not exist"):
        resolve_route(DataConfig(source="local", path=str(tmp_path / "nope.jsonl")))


def test_response_only_loss_mask_covers_exactly_the_response():
    from llmaudit.models.builtin import build_tokenizer

    recs = generate_records(TASKS, 40, seed=0)
    tok = build_tokenizer([r["input"] + "\n" + r["output"] for r in recs], 300)
    rec = recs[0]
    ids, mask, scored = format_record(tok, rec)
    scored_ids = [i for i, m in zip(ids, mask) if m]
    assert tok.decode(scored_ids) == rec["output"] + "<|im_end|>" == scored
    prompt_ids = [i for i, m in zip(ids, mask) if not m]
    assert tok.decode(prompt_ids) == f"<|im_start|>user\n{rec['input']}<|im_end|>\n<|im_start|>assistant\n"
    ids2, mask2, _ = format_record(tok, rec, include_prompt=True)
    assert ids2 == ids and mask2 == [False] + [True] * (len(ids) - 1)


def test_pool_val_draw_and_membership_masks():
    recs = generate_records(TASKS, 60, seed=0)
    pool, val = draw_pool_and_val(recs, 40, 12, seed=1)
    assert len(pool) == 40 and len(val) == 12
    assert not {r["sample_id"] for r in pool} & {r["sample_id"] for r in val}
    masks = membership_masks(40, 5, 0.5, seed=2)
    assert masks.shape == (5, 40) and (masks.sum(1) == 20).all()
    assert np.array_equal(masks, membership_masks(40, 5, 0.5, seed=2))
    assert len({m.tobytes() for m in masks}) == 5
    with pytest.raises(DataError, match="pool_size \\+ val_size"):
        draw_pool_and_val(recs, 50, 20, seed=1)
