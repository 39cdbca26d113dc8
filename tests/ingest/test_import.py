"""`llmaudit import` of fine-tunes trained with plain transformers.Trainer (+ peft), not llmaudit's own loop:
the output directory becomes a run store that `llmaudit score` and `llmaudit report` work on unchanged;
bad inputs are refused (exit 2, one line naming the file and the fix) before anything is written, and the
pickles a trainer leaves beside its checkpoints never run.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch

from llmaudit.config import load_recipe
from llmaudit.data.chem import generate_records
from llmaudit.data.records import dataset_fingerprint
from llmaudit.store.integrity import verify_store
from llmaudit.store.run_store import RunStore, file_digest
from tests.conftest import TINY_OVERRIDES, run_cli

BASE = "builtin:tiny-qwen2"
BUILTIN = [o for o in TINY_OVERRIDES if o.startswith("model.builtin.")]
"""The tiny base's architecture: `--base builtin:tiny-qwen2` plus these overrides is the model trained below."""
TASKS = ["molecule_captioning", "molecule_generation"]
PICKLES = ("optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin")

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    """Records every pickle-like file opened while a test watches (`watch_opens`)."""
    path = args[0] if event == "open" and args else None
    if _OPENED is not None and isinstance(path, (str, os.PathLike)) and str(path).endswith((".bin", ".pt", ".pth")):
        _OPENED.append(str(path))


sys.addaudithook(_audit)


@contextlib.contextmanager
def watch_opens():
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def refused(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)


# ------------------------------------------------------------------------------------------ training


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def as_messages(records: list[dict]) -> list[dict]:
    """TRL's conversational format."""
    return [
        {
            "messages": [
                {"role": "system", "content": "You are a chemist."},
                {"role": "user", "content": r["input"]},
                {"role": "assistant", "content": r["output"]},
            ]
        }
        for r in records
    ]


def as_prompt_completion(records: list[dict]) -> list[dict]:
    """TRL's standard (non-conversational) prompt-completion format."""
    return [{"prompt": f"Question: {r['input']}\nAnswer: ", "completion": r["output"]} for r in records]


def _tokenize(tok, row: dict) -> tuple[list[int], list[int]]:
    """(input_ids, labels) as a user's own script would build them: the response tokens only."""
    if "messages" in row:
        prompt = tok.apply_chat_template(row["messages"][:-1], tokenize=False, add_generation_prompt=True)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        answer_ids = tok(row["messages"][-1]["content"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
    else:
        prompt_ids = tok(row["prompt"])["input_ids"]
        answer_ids = tok(row["completion"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids


def trainer_finetune(model_cfg, rows: list[dict], out: Path, *, lora: bool = True, steps: int = 3) -> Path:
    """Fine-tune the tiny base with plain transformers.Trainer (+ peft LoRA), a checkpoint every step and
    the final weights saved in the output directory, as most training scripts do."""
    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainingArguments

    from llmaudit.models.loading import load_base_model, load_tokenizer

    tok = load_tokenizer(model_cfg)
    model = load_base_model(model_cfg, torch.device("cpu"))
    if lora:
        model = get_peft_model(
            model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        )
    examples = [_tokenize(tok, row) for row in rows]

    def collate(batch):
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, (seq, lab) in enumerate(batch):
            ids[i, : len(seq)], labels[i, : len(seq)], attention[i, : len(seq)] = (
                torch.tensor(seq),
                torch.tensor(lab),
                1,
            )
        return {"input_ids": ids, "labels": labels, "attention_mask": attention}

    args = TrainingArguments(
        output_dir=str(out),
        max_steps=steps,
        save_steps=1,
        save_strategy="steps",
        per_device_train_batch_size=4,
        learning_rate=2e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=model, args=args, train_dataset=examples, data_collator=collate)
    trainer.train()
    trainer.save_model(str(out))
    return out


def plant_payloads(directory: Path, sentinel: Path) -> None:
    """Replace every pickle a trainer left (optimizer, scheduler, RNG state, training arguments) with a
    payload that creates `sentinel` when unpickled."""

    class Payload:
        def __reduce__(self):
            return (open, (str(sentinel), "w"))

    for path in [*directory.rglob("*.pt"), *directory.rglob("*.pth"), *directory.rglob("*.bin")]:
        path.write_bytes(pickle.dumps(Payload()))


@pytest.fixture(scope="module")
def model_cfg():
    return load_recipe("demo-cpu", TINY_OVERRIDES).model


@pytest.fixture(scope="module")
def records():
    return generate_records(TASKS, 28, seed=5)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, model_cfg, records):
    """One LoRA fine-tune (messages format, 3 steps, a checkpoint per step), its data files, and pickles
    replaced by payloads that would create `sentinel`."""
    root = tmp_path_factory.mktemp("lora")
    train = write_jsonl(root / "train.jsonl", as_messages(records[:12]))
    heldout = write_jsonl(root / "heldout.jsonl", as_messages(records[20:28]))
    out = trainer_finetune(model_cfg, as_messages(records[:12]), root / "trainer-out")
    sentinel = root / "payload-ran"
    plant_payloads(out, sentinel)
    return {"dir": out, "train": train, "heldout": heldout, "sentinel": sentinel, "root": root}


def import_args(training_dir, train, heldout, out, *extra) -> list:
    return [
        "import",
        training_dir,
        "--base",
        BASE,
        *[x for t in ([train] if not isinstance(train, list) else train) for x in ("--train", t)],
        "--heldout",
        heldout,
        "--out",
        out,
        *extra,
        *BUILTIN,
        "score.quantizers=[fp32,uniform-4]",
        "attack.n_boot=20",
    ]


# ------------------------------------------------------------------------------------------ the features


def test_lora_trainer_output_imports_scores_and_reports(lora_run, tmp_path):
    out = tmp_path / "audit"
    with watch_opens() as opened:
        code, stdout, err = run_cli(import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], out))
    assert code == 0, err
    assert "run 0: 3 lora checkpoint(s), steps [1, 2, 3]" in stdout
    assert "blind baseline, run 0: AUROC" in stdout and f"llmaudit score {out}" in stdout
    store = RunStore(out)
    manifest = store.manifest()
    assert manifest["origin"] == "import"
    run = manifest["imported"]["runs"][0]
    assert [c["step"] for c in run["checkpoints"]] == [1, 2, 3]  # the final save equals checkpoint-3: skipped
    ckpt = run["checkpoints"][-1]
    assert ckpt["format"] == "lora" and ckpt["path"] == str(lora_run["dir"].resolve() / "checkpoint-3")
    assert ckpt["files"]["adapter_model.safetensors"] == file_digest(Path(ckpt["path"]) / "adapter_model.safetensors")
    assert run["train_sha256"] == file_digest(lora_run["train"])
    assert run["trainer"]["global_step"] == 3 and run["trainer"]["adapter"]["r"] == 4
    assert not list(out.rglob("*.safetensors"))  # weights referenced, never copied
    cfg = store.config()
    assert cfg.train.runs == 1 and cfg.lora.r == 4 and cfg.lora.alpha == 8
    assert sorted(cfg.lora.target_modules) == ["q_proj", "v_proj"]
    assert cfg.model.name == BASE and cfg.data.source == "local"
    # Membership: the 12 training records are members, half the held-out file non-members, half validation.
    pool, val = store.read_records("pool"), store.read_records("val")
    assert (len(pool), len(val)) == (16, 4) and store.membership().sum() == 12
    assert all(r["format"] == "chat" and "You are a chemist." in r["prompt_messages"] for r in pool + val)
    assert manifest["data"]["fingerprint"] == dataset_fingerprint(pool + val)
    assert manifest["parameters"]["adapter_trainable"] > 0 and manifest["parameters"]["model_total"] > 0
    blind = json.loads((out / "results" / "blind_baseline.json").read_text())
    assert blind["per_run"][0]["n_in"] == 12 and blind["per_run"][0]["n_out"] == 4
    assert verify_store(store).ok

    with watch_opens() as opened_score:
        code, stdout, err = run_cli(["score", out, "--no-progress"])
    assert code == 0, err
    assert not opened and not opened_score, (opened, opened_score)
    assert not lora_run["sentinel"].exists()
    assert store.unit_path(0, 1, "uniform-4").exists() and store.unit_path(0, 3, "fp32").exists()

    code, stdout, err = run_cli(["report", out])
    assert code == 0, err
    report = json.loads((out / "report" / "report.json").read_text())
    result = json.loads((out / "results" / "result.json").read_text())
    indicator = result["indicator"]["per_quantizer"]
    assert set(indicator) == {"fp32", "uniform-4"}  # r_Q from one run's trajectory and held-out samples
    assert all(entry["r_q"]["mean"] is not None for entry in indicator.values())
    attacks = result["attacks"]["quantizers"]["fp32"]
    for name in ("loss", "min_k", "zlib", "ref"):
        assert attacks["attacks"][name]["headline"]["auroc"] is not None, name
    assert "lira_offline" in attacks["skipped"] and "lira_online" in attacks["skipped"]
    # The blind baseline computed at import is the one the report shows, beside the attacks.
    blind = json.loads((out / "results" / "blind_baseline.json").read_text())
    assert report["blind_baseline"]["highest"]["auroc"] == max(
        r["auroc"] for r in blind["per_run"] if r["auroc"] is not None
    )
    assert "Blind baseline" in (out / "report" / "report.md").read_text()
    crit = next(c for c in report["checklist"]["per_quantizer"]["fp32"]["criteria"] if c["id"] == "attack_tpr")
    # one run is judged on its held-out non-members with an empirical threshold (tests/ingest/test_single_run_verdict.py
    # has one big enough for a verdict); 4 of them are far from the 1000 a TPR at 1% FPR needs
    assert crit["status"] == "NOT MEASURED" and "non-member scores, 1000 needed" in crit["reason"], crit["reason"]


def test_full_model_trainer_output_imports_and_scores(tmp_path, model_cfg, records):
    rows = as_prompt_completion(records[:8])
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    heldout = write_jsonl(tmp_path / "heldout.jsonl", as_prompt_completion(records[20:26]))
    trained = trainer_finetune(model_cfg, rows, tmp_path / "full-out", lora=False, steps=2)
    out = tmp_path / "audit"
    code, stdout, err = run_cli(import_args(trained, train, heldout, out, "--name", "full-audit"))
    assert code == 0, err
    assert "run 0: 2 full checkpoint(s), steps [1, 2]" in stdout
    store = RunStore(out)
    manifest = store.manifest()
    ckpt = manifest["imported"]["runs"][0]["checkpoints"][0]
    assert ckpt["format"] == "full" and set(ckpt["files"]) == {"config.json", "model.safetensors"}
    assert manifest["name"] == "full-audit"
    assert all(r["format"] == "raw" for r in store.read_records("pool"))
    assert manifest["parameters"]["adapter_trainable"] == manifest["parameters"]["model_total"]
    code, _, err = run_cli(["score", out, "--no-progress", "score.quantizers=[fp32]"])
    assert code == 0, err
    assert store.unit_path(0, 2, "fp32").exists() and store.unit_path(0, 1, "fp32").exists()
    assert verify_store(store, deep=True).ok


def test_two_runs_each_with_its_training_file(tmp_path, model_cfg, records):
    files = []
    dirs = []
    for run, chunk in enumerate((records[0:12], records[6:18])):
        rows = as_messages(chunk)
        files.append(write_jsonl(tmp_path / f"train-{run}.jsonl", rows))
        dirs.append(trainer_finetune(model_cfg, rows, tmp_path / f"out-{run}", steps=2))
    heldout = write_jsonl(tmp_path / "heldout.jsonl", as_messages(records[20:28]))
    out = tmp_path / "audit"
    args = import_args(dirs[0], files, heldout, out, "--runs", dirs[1])
    code, stdout, err = run_cli(args)
    assert code == 0, err
    assert "run 1: 2 lora checkpoint(s)" in stdout
    store = RunStore(out)
    masks = store.membership()
    assert masks.shape == (2, 22) and list(masks.sum(1)) == [12, 12] and (masks[0] & masks[1]).sum() == 6
    assert [r["train_file"] for r in store.manifest()["imported"]["runs"]] == [str(f.resolve()) for f in files]
    blind = json.loads((out / "results" / "blind_baseline.json").read_text())
    assert len(blind["per_run"]) == 2 and blind["note"]
    code, _, err = run_cli(["score", out, "--no-progress", "score.quantizers=[fp32]"])
    assert code == 0, err
    code, _, err = run_cli(["report", out])
    assert code == 0, err
    result = json.loads((out / "results" / "result.json").read_text())
    attacks = result["attacks"]["quantizers"]["fp32"]
    assert attacks["n_models"] == 2 and attacks["attacks"]["loss"]["headline"]["auroc"] is not None
    assert "lira_offline" in attacks["attacks"] or attacks["skipped"]["lira_offline"]  # measured, or why not
    # The same import again is a no-op; other data into the same directory is refused.
    code, stdout, err = run_cli(args)
    assert code == 0 and "already holds this import" in stdout, err
    other = write_jsonl(tmp_path / "heldout-2.jsonl", as_messages(records[22:28]))
    refused(*run_cli(import_args(dirs[0], files, other, out, "--runs", dirs[1]))[::2], str(out))


# ------------------------------------------------------------------------------------------ bad inputs


def test_adapter_of_another_base_is_refused(tmp_path, lora_run, model_cfg):
    from peft import LoraConfig, get_peft_model

    from llmaudit.models.loading import load_tokenizer
    from tests.tiny_models import tiny_causal_lm

    tok = load_tokenizer(model_cfg)
    other = tiny_causal_lm(
        "qwen2", vocab_size=len(tok), hidden_size=48, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1
    ).train()
    adapter = get_peft_model(other, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    adapter.save_pretrained(str(tmp_path / "wrong" / "checkpoint-5"))
    out = tmp_path / "audit"
    code, _, err = run_cli(import_args(tmp_path / "wrong", lora_run["train"], lora_run["heldout"], out))
    refused(code, err, "checkpoint-5", "does not load onto the base model", "--base")
    assert not out.exists()


def test_overlapping_train_and_heldout_is_refused_naming_the_ids(tmp_path, lora_run, records):
    rows = as_messages(records[:12])
    heldout = write_jsonl(tmp_path / "heldout.jsonl", rows[3:5] + as_messages(records[20:26]))
    out = tmp_path / "audit"
    code, _, err = run_cli(import_args(lora_run["dir"], lora_run["train"], heldout, out))
    refused(code, err, str(heldout.resolve()), "2 record(s)", "a member cannot be a non-member".capitalize())
    from llmaudit.data.formats import row_to_record

    for row in rows[3:5]:
        assert row_to_record(row, "x")["sample_id"] in err
    assert not out.exists()


def test_no_checkpoints_found(tmp_path, lora_run):
    empty = tmp_path / "empty-out"
    (empty / "runs").mkdir(parents=True)
    (empty / "training_args.bin").write_bytes(b"not read")
    code, _, err = run_cli(import_args(empty, lora_run["train"], lora_run["heldout"], tmp_path / "audit"))
    refused(code, err, "no checkpoint found", str(empty.resolve()), "checkpoint-N")
    code, _, err = run_cli(import_args(tmp_path / "nowhere", lora_run["train"], lora_run["heldout"], tmp_path / "a"))
    refused(code, err, "does not exist")


@pytest.mark.slow  # an import (the base and one adapter loaded) and 7 units scored: about 20 s
def test_imported_checkpoints_are_digested_whole_and_may_live_behind_links(tmp_path, lora_run):
    """An imported checkpoint stays where the training wrote it, links and all (here its weights are links to
    blobs, as in a Hugging Face cache): the link policy applies to the store, not to the user's training output.
    Every file that changes a number is recorded (the tokenizer saved with a checkpoint too) and checked: an
    edited adapter_config.json (lora_alpha) or tokenizer is refused by status and score."""
    training = tmp_path / "trainer-out"
    shutil.copytree(lora_run["dir"], training)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        (training / "checkpoint-2" / name).rename(blobs / name)
        (training / "checkpoint-2" / name).symlink_to(blobs / name)
    (training / "checkpoint-3" / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    out = tmp_path / "audit"
    code, _, err = run_cli(
        import_args(training, lora_run["train"], lora_run["heldout"], out, "score.quantizers=[fp32]")
    )
    assert code == 0, err
    last = RunStore(out).manifest()["imported"]["runs"][0]["checkpoints"][-1]
    assert set(last["files"]) == {"adapter_model.safetensors", "adapter_config.json", "tokenizer_config.json"}
    assert last["digest_scope"] == "number-files-1"
    code, stdout, err = run_cli(["score", out, "--no-progress"])
    assert code == 0 and "scored 7 unit(s)" in stdout, err  # 3 checkpoints x 2 quantizers + the base
    config = training / "checkpoint-3" / "adapter_config.json"
    original = config.read_text()
    config.write_text(json.dumps(dict(json.loads(original), lora_alpha=64)))
    code, stdout, _ = run_cli(["status", out])
    assert code == 0 and "adapter_config.json changed since it was recorded" in stdout
    RunStore(out).unit_path(0, 3, "fp32").unlink()
    refused(*run_cli(["score", out, "--no-progress"])[::2], str(config.parent), "adapter_config.json changed")
    config.write_text(original)
    (training / "checkpoint-3" / "tokenizer_config.json").write_text('{"model_max_length": 8}')
    refused(*run_cli(["score", out, "--no-progress"])[::2], "tokenizer_config.json changed")


def test_checkpoint_missing_its_weights(tmp_path, lora_run):
    copy = tmp_path / "copy"
    shutil.copytree(lora_run["dir"], copy)
    (copy / "checkpoint-2" / "adapter_model.safetensors").unlink()
    code, _, err = run_cli(import_args(copy, lora_run["train"], lora_run["heldout"], tmp_path / "audit"))
    refused(code, err, str(copy.resolve() / "checkpoint-2"), "weights are missing")
    assert not (tmp_path / "audit").exists()


def test_pickles_never_run(tmp_path, lora_run):
    with watch_opens() as probe:  # the watcher sees opens (positive control)
        (tmp_path / "probe.pt").write_bytes(b"")
    assert probe == [str(tmp_path / "probe.pt")]
    # Trainer state pickles beside the weights (planted payloads in every checkpoint) are never opened ...
    out = tmp_path / "audit"
    with watch_opens() as opened:
        code, _, err = run_cli(import_args(lora_run["dir"], lora_run["train"], lora_run["heldout"], out))
    assert code == 0, err
    assert not opened and not lora_run["sentinel"].exists()
    # ... and a checkpoint whose weights exist only as a pickle is refused, naming it, without opening it.
    pickled = tmp_path / "pickled"
    shutil.copytree(lora_run["dir"] / "checkpoint-1", pickled / "checkpoint-1")
    (pickled / "checkpoint-1" / "adapter_model.safetensors").unlink()
    sentinel = tmp_path / "payload-ran"
    plant_payloads(pickled, sentinel)
    (pickled / "checkpoint-1" / "adapter_model.bin").write_bytes(
        (pickled / "checkpoint-1" / "optimizer.pt").read_bytes()
    )
    with watch_opens() as opened:
        code, _, err = run_cli(import_args(pickled, lora_run["train"], lora_run["heldout"], tmp_path / "audit-2"))
    refused(code, err, "only pickled ['adapter_model.bin']", "never loads")
    assert not opened and not sentinel.exists()


# ------------------------------------------------------------------------------------------ units


def test_checkpoint_discovery_rules(tmp_path):
    from llmaudit.ingest.checkpoints import ImportInputError, find_checkpoints

    def adapter(directory: Path, content: bytes) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "adapter_config.json").write_text('{"r": 2, "lora_alpha": 4, "target_modules": "all-linear"}')
        (directory / "adapter_model.safetensors").write_bytes(content)

    out = tmp_path / "out"
    adapter(out / "checkpoint-10", b"a")
    adapter(out / "checkpoint-5", b"b")
    (out / "runs").mkdir()  # tensorboard logs and the like are ignored
    found = find_checkpoints(out)
    assert [(c.step, c.kind) for c in found.checkpoints] == [(5, "lora"), (10, "lora")]  # by step, not name
    # Final weights with trainer_state.json: a new point at its global_step, or the same step (skipped).
    adapter(out, b"c")
    (out / "trainer_state.json").write_text('{"global_step": 12, "num_train_epochs": 3, "log_history": []}')
    found = find_checkpoints(out)
    assert [c.step for c in found.checkpoints] == [5, 10, 12] and found.trainer["num_train_epochs"] == 3
    assert found.trainer["adapter"]["target_modules"] == "all-linear"
    (out / "trainer_state.json").write_text('{"global_step": 10}')
    assert [c.path.name for c in find_checkpoints(out).checkpoints] == ["checkpoint-5", "checkpoint-10"]
    # Without trainer_state.json: identical bytes to a checkpoint are skipped, other weights come last.
    (out / "trainer_state.json").unlink()
    found = find_checkpoints(out)
    assert [c.step for c in found.checkpoints] == [5, 10, 11] and "step unknown" in found.notes[0]
    (out / "adapter_model.safetensors").write_bytes(b"a")
    assert [c.step for c in find_checkpoints(out).checkpoints] == [5, 10]
    # A full model needs its config, and every shard its index lists.
    full = tmp_path / "full" / "checkpoint-1"
    full.mkdir(parents=True)
    (full / "model.safetensors").write_bytes(b"w")
    with pytest.raises(ImportInputError, match="no config.json"):
        find_checkpoints(full.parent)
    (full / "config.json").write_text("{}")
    assert find_checkpoints(full.parent).checkpoints[0].files == ["config.json", "model.safetensors"]
    (full / "model.safetensors").unlink()
    (full / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})
    )
    (full / "model-00001-of-00002.safetensors").write_bytes(b"w")
    with pytest.raises(ImportInputError, match="missing weight shard"):
        find_checkpoints(full.parent)
    # Pickled final weights beside good checkpoints: skipped with a note (the checkpoints are used).
    (out / "adapter_model.safetensors").unlink()
    (out / "adapter_config.json").unlink()
    (out / "pytorch_model.bin").write_bytes(b"never read")
    found = find_checkpoints(out)
    assert [c.step for c in found.checkpoints] == [5, 10] and "only pickled" in found.notes[0]


def test_draw_is_deterministic_caps_and_splits_the_heldout(records):
    from llmaudit.data.formats import row_to_record
    from llmaudit.ingest.draw import draw_pool as _draw

    as_records = [row_to_record(r, f"f:{i}") for i, r in enumerate(as_messages(records))]
    train_sets = [as_records[:12], as_records[6:18]]
    heldout = as_records[18:28]
    pool, val, masks, notes = _draw(train_sets, heldout, None, None, seed=0)
    assert (len(pool), len(val)) == (18 + 5, 5) and not notes
    assert not {r["sample_id"] for r in val} & {r["sample_id"] for r in pool}
    assert list(masks.sum(1)) == [12, 12] and (~masks.any(0)).sum() == 5
    assert _draw(train_sets, heldout, None, None, seed=0)[0] == pool  # deterministic
    assert [r["sample_id"] for r in _draw(train_sets, heldout, None, None, seed=1)[0]] != [r["sample_id"] for r in pool]
    capped, val_c, masks_c, notes = _draw(train_sets, heldout, 8, 6, seed=0)
    assert len(capped) == 8 + 3 and len(val_c) == 3 and len(notes) == 2
    assert masks_c.any(0).sum() == 8  # members of either run among the 8 training records drawn
    from llmaudit.ingest.checkpoints import ImportInputError

    with pytest.raises(ImportInputError, match="at least 4"):
        _draw(train_sets, heldout[:3], None, None, seed=0)


def test_an_unknown_attack_in_the_overrides_is_refused_before_the_store_is_written(tmp_path, lora_run):
    out = tmp_path / "audit"
    args = import_args(
        lora_run["dir"], lora_run["train"], lora_run["heldout"], out, "attack.attacks=[loss,lira_ofline]"
    )
    code, _, err = run_cli(args)
    refused(code, err, "unknown attack 'lira_ofline' (did you mean 'lira_offline'?)", "attack.attacks")
    assert not out.exists()
