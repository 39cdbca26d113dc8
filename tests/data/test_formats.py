"""A user's own data files: every common SFT row format maps to a record, tokenised as the trainer did."""

from __future__ import annotations

import json

import pytest

from llmaudit.data.chem import generate_records
from llmaudit.data.formats import read_user_records, row_to_record
from llmaudit.data.records import (
    DataError,
    dataset_fingerprint,
    read_record_file,
    record_fingerprint,
    record_text,
    records_to_jsonl,
    validate_record,
)
from llmaudit.data.tokenize import format_record


class ToyTokenizer:
    """Characters as tokens (ids = code points), an eos token, an optional ChatML template."""

    eos_token = "<eos>"
    eos_token_id = 0

    def __init__(self, chat: bool = True, bos: bool = False):
        self.chat_template = "chatml <|im_end|>" if chat else None
        self.bos = bos

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = []
        while text:
            for special, sid in (("<eos>", 0), ("<|im_end|>", 1)):
                if text.startswith(special):
                    ids.append(sid)
                    text = text[len(special) :]
                    break
            else:
                ids.append(ord(text[0]))
                text = text[1:]
        return {"input_ids": ([2] if self.bos and add_special_tokens else []) + ids}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}<|im_end|>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_each_row_format_maps_to_its_record():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    chat = row_to_record({"messages": msgs}, "f:1")
    assert chat["format"] == "chat" and chat["output"] == "4" and chat["input"] == "What is 2+2?"
    assert json.loads(chat["prompt_messages"]) == msgs[:2]
    assert chat["task"] == "messages" and chat["sample_id"].startswith("messages/import/")

    conv = row_to_record({"prompt": msgs[:2], "completion": msgs[2:]}, "f:2")
    assert conv["prompt_messages"] == chat["prompt_messages"] and conv["output"] == "4"

    raw = row_to_record({"prompt": "2+2=", "completion": "4"}, "f:3")
    assert raw["format"] == "raw" and (raw["input"], raw["output"]) == ("2+2=", "4")

    text = row_to_record({"text": "Once upon a time."}, "f:4")
    assert text["format"] == "text" and text["input"] == "" and text["output"] == "Once upon a time."

    smol = generate_records(["molecule_captioning"], 1, seed=0)[0]
    assert row_to_record(smol, "f:5") == validate_record(smol, "x")  # SMolInstruct rows: as today
    plain = row_to_record({"input": "Q", "output": "A"}, "f:6")
    assert "format" not in plain and plain["task"] == "input-output"


def test_format_override_forces_chat_raw_or_text():
    row = {"prompt": "2+2=", "completion": "4"}
    assert "format" not in row_to_record(row, "f:1", record_format="chat")
    assert row_to_record(row, "f:1", record_format="raw")["format"] == "raw"
    as_text = row_to_record(row, "f:1", record_format="text")
    assert as_text["format"] == "text" and as_text["output"] == "2+2=4"
    assert row_to_record({"input": "Q", "output": "A"}, "f:2", record_format="raw")["format"] == "raw"
    with pytest.raises(DataError, match="f:3.*chat template"):
        row_to_record(
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "f:3",
            record_format="raw",
        )
    with pytest.raises(DataError, match="f:4.*text"):
        row_to_record({"text": "abc"}, "f:4", record_format="chat")


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "at least two"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "x"}]}, "assistant"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 3}]}, "content"),
        ({"prompt": "a", "completion": ["b"]}, "both be strings"),
        ({"prompt": "a", "completion": ""}, "completion"),
        ({"text": ""}, "non-empty"),
        ({"question": "a", "answer": "b"}, "unrecognised"),
        ([1, 2], "JSON object"),
    ],
)
def test_malformed_rows_name_the_file_and_line(tmp_path, row, message):
    path = write_jsonl(tmp_path / "train.jsonl", [{"text": "fine"}, row])
    with pytest.raises(DataError, match=message) as info:
        read_user_records(path)
    assert f"{path}:2" in str(info.value)


def test_files_jsonl_json_parquet_dedupe_and_errors(tmp_path):
    rows = [{"text": "a b"}, {"prompt": "p", "completion": "c"}, {"text": "a b"}]
    records, duplicates = read_user_records(write_jsonl(tmp_path / "t.jsonl", rows))
    assert len(records) == 2 and duplicates == 1
    (tmp_path / "t.json").write_text(json.dumps(rows))
    assert read_user_records(tmp_path / "t.json")[0] == records
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist([{"text": "a b"}, {"text": "c d"}]), tmp_path / "t.parquet")
    assert [r["output"] for r in read_user_records(tmp_path / "t.parquet")[0]] == ["a b", "c d"]
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: malformed JSON"):
        read_user_records(tmp_path / "bad.jsonl")
    with pytest.raises(DataError, match="does not exist"):
        read_user_records(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no records"):
        read_user_records(tmp_path / "empty.jsonl")


def test_same_content_same_id_across_files_and_formats_differ():
    a = row_to_record({"prompt": "p", "completion": "c"}, "train:1")
    b = row_to_record({"prompt": "p", "completion": "c"}, "heldout:7")
    assert a["sample_id"] == b["sample_id"] and record_fingerprint(a) == record_fingerprint(b)
    chat = row_to_record({"prompt": "p", "completion": "c"}, "x", record_format="chat")
    assert record_fingerprint(chat) != record_fingerprint(a)  # tokenised differently: another sample


def test_plain_records_keep_their_fingerprint_and_fields():
    recs = generate_records(["molecule_captioning", "molecule_generation"], 20, seed=0)
    validated = [validate_record(r, "x") for r in recs]
    assert all("format" not in r and "prompt_messages" not in r for r in validated)
    # Unchanged hash for plain chat records (existing stores keep their fingerprints).
    import hashlib

    for r in validated:
        blob = json.dumps([r["task"], r["input"], r["output"]], ensure_ascii=False)
        assert record_fingerprint(r) == hashlib.sha256(blob.encode()).hexdigest()
    assert record_fingerprint({**validated[0], "format": "chat"}) == record_fingerprint(validated[0])


def test_validate_record_keeps_the_new_fields_and_checks_them(tmp_path):
    text = validate_record({"input": "", "output": "hello", "task": "text", "format": "text"}, "x")
    assert text["format"] == "text" and text["input"] == ""
    with pytest.raises(DataError, match="input"):
        validate_record({"input": "", "output": "hello", "task": "t"}, "x")  # chat needs a prompt
    with pytest.raises(DataError, match="format"):
        validate_record({"input": "a", "output": "b", "task": "t", "format": "yaml"}, "x")
    with pytest.raises(DataError, match="prompt_messages"):
        validate_record({"input": "a", "output": "b", "task": "t", "prompt_messages": "[1]"}, "x")
    with pytest.raises(DataError, match="only goes with format 'chat'"):
        validate_record(
            {
                "input": "a",
                "output": "b",
                "task": "t",
                "format": "raw",
                "prompt_messages": '[{"role":"user","content":"a"}]',
            },
            "x",
        )
    # A store's data file round-trips (read_record_file keeps the fields and the ids).
    recs = [
        row_to_record(
            {
                "messages": [
                    {"role": "system", "content": "s"},
                    {"role": "user", "content": "u"},
                    {"role": "assistant", "content": "a"},
                ]
            },
            "f",
        ),
        row_to_record({"prompt": "p", "completion": "c"}, "f"),
        row_to_record({"text": "t t"}, "f"),
    ]
    path = tmp_path / "pool.jsonl"
    path.write_text(records_to_jsonl(recs))
    back = read_record_file(path)
    assert back == recs and dataset_fingerprint(back) == dataset_fingerprint(recs)


def test_format_record_tokenises_each_format_as_the_trainer_did():
    tok = ToyTokenizer()
    raw = row_to_record({"prompt": "ab", "completion": "cd"}, "f")
    ids, mask, scored = format_record(tok, raw)
    assert ids == [ord("a"), ord("b"), ord("c"), ord("d"), 0]
    assert mask == [False, False, True, True, True] and scored == "cd<eos>"
    ids_p, mask_p, _ = format_record(tok, raw, include_prompt=True)
    assert ids_p == ids and mask_p == [False, True, True, True, True]
    bos = ToyTokenizer(bos=True)
    assert format_record(bos, raw)[0][:1] == [2]  # tok(prompt) adds the tokenizer's BOS, as a trainer's call does

    text = row_to_record({"text": "xyz"}, "f")
    ids, mask, scored = format_record(tok, text)
    assert ids == [ord("x"), ord("y"), ord("z"), 0] and mask == [False, True, True, True] and scored == "xyz<eos>"

    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A"},
    ]
    chat = row_to_record({"messages": msgs}, "f")
    ids, mask, scored = format_record(tok, chat)
    prompt = "<system>S<|im_end|><user>U<|im_end|><assistant>"
    assert ids == tok(prompt)["input_ids"] + [ord("A"), 1] and scored == "A<|im_end|>"
    assert mask == [False] * len(tok(prompt)["input_ids"]) + [True, True]
    plain = validate_record({"input": "U", "output": "A", "task": "t"}, "x")
    ids, _, _ = format_record(tok, plain)  # the single-user-message prompt of today
    assert ids == tok("<user>U<|im_end|><assistant>")["input_ids"] + [ord("A"), 1]
    nochat = ToyTokenizer(chat=False)
    assert format_record(nochat, chat)[2] == "A<eos>"
    assert format_record(nochat, plain)[0][: len("Instruction: ")] == [ord(c) for c in "Instruction: "]


def test_record_text_of_every_format():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}, {"role": "assistant", "content": "A"}]
    assert record_text(row_to_record({"messages": msgs}, "f")) == "S\nU\nA"
    assert record_text(row_to_record({"prompt": "p ", "completion": "c"}, "f")) == "p c"
    assert record_text(row_to_record({"text": "t"}, "f")) == "t"
    assert record_text(validate_record({"input": "Q", "output": "A", "task": "t"}, "x")) == "Q\nA"


SHAREGPT = [
    {
        "conversations": [
            {"from": "system", "value": "You are a chemist."},
            {"from": "human", "value": "Name CH4."},
            {"from": "gpt", "value": "methane"},
        ]
    },
    {
        "conversations": [
            {"from": "user", "value": "Caption CCO."},
            {"from": "assistant", "value": "ethanol, a primary alcohol"},
        ],
        "task": "molecule_captioning",
    },
]


def test_sharegpt_rows_become_records_of_the_conversation_trl_trains_on(tmp_path):
    """ShareGPT's from/value rows, converted as TRL converts them (roles kept: the model saw "human" and "gpt");
    a final turn of another role than the assistant's keeps it (`response_role`) and is rendered with it."""
    records, _ = read_user_records(write_jsonl(tmp_path / "sharegpt.jsonl", SHAREGPT))
    first, second = records
    assert first["format"] == "chat" and first["output"] == "methane" and first["response_role"] == "gpt"
    assert json.loads(first["prompt_messages"]) == [
        {"role": "system", "content": "You are a chemist."},
        {"role": "human", "content": "Name CH4."},
    ]
    assert "response_role" not in second and second["task"] == "molecule_captioning"
    # the role is part of what the model sees: it changes the fingerprint (and a record read back keeps it)
    as_assistant = dict(first, response_role=None)
    assert record_fingerprint(first) != record_fingerprint({k: v for k, v in as_assistant.items() if v is not None})
    assert validate_record(first, "x")["response_role"] == "gpt"
    tok = ToyTokenizer()
    ids, mask, scored = format_record(tok, first)
    prompt = "<system>You are a chemist.<|im_end|><human>Name CH4.<|im_end|><gpt>"
    assert ids == tok(prompt)["input_ids"] + tok("methane<|im_end|>")["input_ids"] and scored == "methane<|im_end|>"
    assert mask == [False] * len(tok(prompt)["input_ids"]) + [True] * (len("methane") + 1)


@pytest.mark.parametrize(
    "row, message",
    [
        ({"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}, "from, value"),
        ({"conversations": [{"from": "human", "value": "a"}, {"from": "human", "value": "b"}]}, "role 'human'"),
        ({"conversations": "a text"}, "from, value"),
    ],
)
def test_malformed_sharegpt_rows_are_refused_with_the_fix(tmp_path, row, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [row])
    with pytest.raises(DataError, match=message) as err:
        read_user_records(path)
    assert f"{path}:1" in str(err.value)


def test_sharegpt_conversion_and_tokens_equal_trls_own():
    """TRL's own conversion (trl.data_utils.maybe_convert_to_chatml) and tokenisation (the chat template applied
    to the whole conversation, as SFTTrainer does) against ours, on a real BPE tokenizer with a ChatML template:
    the same messages, and the tokens llmaudit scores are a prefix of what TRL trained on, the scored ones
    exactly the final turn and its end of turn."""
    import copy

    trl_data = pytest.importorskip("trl.data_utils")
    from llmaudit.data.formats import is_sharegpt, sharegpt_to_chatml
    from llmaudit.data.records import response_role
    from llmaudit.models.builtin import build_tokenizer

    tok = build_tokenizer(
        [r["input"] + " " + r["output"] for r in generate_records(["molecule_captioning"], 64, seed=3)], 400
    )
    for row in SHAREGPT:
        assert is_sharegpt(row) == trl_data.is_conversational_from_value(row)
        theirs = trl_data.maybe_convert_to_chatml(copy.deepcopy(row))
        assert sharegpt_to_chatml(row) == theirs
        rec = row_to_record(row, "f")
        messages = theirs["messages"]
        assert json.loads(rec["prompt_messages"]) + [{"role": response_role(rec), "content": rec["output"]}] == messages
        ids, mask, _ = format_record(tok, rec)
        tokenize = getattr(trl_data, "_tokenize", None)
        trained = (
            tokenize(tok, messages)["input_ids"]
            if tokenize
            else tok.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        )
        assert list(trained[: len(ids)]) == ids
        assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]) == messages[-1]["content"] + "<|im_end|>"
