"""Received run stores, round two: links inside a store, input without bounds, files that change a number but
were not under a digest, loss tables that contradict themselves, a full disk.

Every case tampers with a copy of one tiny real store (tests/conftest.py: `audited_tiny_store`) inside a
sandbox that also holds files the case must not touch (`outside/`), and asserts the outcome: exit 2 with one
line naming the file or key and the fix, no traceback, nothing outside the run directory opened or changed (an
audit hook records every `open` below `outside/`; a digest of the tree compares before and after), the
finished units intact. The risky cases (memory, recursion) run in one child process under an address-space
limit and a timeout (`run_limited`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from llmaudit.store.run_store import RunStore, content_digest
from tests.conftest import TINY_OVERRIDES, run_cli
from tests.test_untrusted_inputs import refused, tree_digest, unit_digests

# ------------------------------------------------------------------------------------------ fixtures

_WATCHED: list[Path] = []
_OPENED: list[str] = []


def _audit(event: str, args: tuple) -> None:
    """Records every file opened below a watched directory (the proof that nothing outside was read)."""
    if event == "open" and _WATCHED and args and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if any(path.startswith(str(w) + os.sep) for w in _WATCHED):
            _OPENED.append(path)


sys.addaudithook(_audit)


@contextlib.contextmanager
def nothing_opened_in(directory: Path):
    _WATCHED.append(directory.resolve())
    _OPENED.clear()
    try:
        yield
    finally:
        _WATCHED.clear()
    assert not _OPENED, f"files outside the run directory were opened: {_OPENED[:3]}"


class Received:
    """A copy of the audited tiny store in sandbox/exp, beside sandbox/outside (files no command may touch)."""

    def __init__(self, base: Path, sandbox: Path):
        self.base, self.sandbox, self.root, self.outside = base, sandbox, sandbox / "exp", sandbox / "outside"
        shutil.copytree(base, self.root, ignore=shutil.ignore_patterns("locks"))
        self.outside.mkdir()
        (self.outside / "keep.json").write_text('{"a": 1}')
        (self.outside / "secret.json").write_text('{"secret": "OUTSIDE-CONTENT"}')
        (self.outside / "dir").mkdir()
        shutil.copytree(self.root / "report", self.outside / "report")
        record = json.loads((self.root / "scores" / "quantizers" / "fp32.json").read_text())
        (self.outside / "fp32.json").write_text(json.dumps(dict(record, family="OUTSIDE-CONTENT")))
        self.store = RunStore(self.root)

    def cli(self, args: list[str], **kw) -> tuple[int, str, str]:
        """`llmaudit ARGS` in this process, with every open below outside/ recorded (none may happen)."""
        with nothing_opened_in(self.outside):
            return run_cli(args, **kw)

    def manifest(self) -> dict:
        return json.loads((self.root / "manifest.json").read_text())

    def write_manifest(self, manifest: dict) -> None:
        manifest["content_digest"] = content_digest(manifest)
        (self.root / "manifest.json").write_text(json.dumps(manifest))

    def final_dir(self, run: int) -> Path:
        return self.store.checkpoint_dir(run, self.store.checkpoints(run)[-1])

    def unit(self, run: int, quantizer: str = "fp32") -> Path:
        return self.store.unit_path(run, self.store.checkpoints(run)[-1], quantizer)


@pytest.fixture
def received(audited_tiny_store, tmp_path):
    work = Received(audited_tiny_store, tmp_path / "sandbox")
    before_outside, before_units = tree_digest(work.outside), unit_digests(work.root)
    work.before_units = before_units
    yield work
    assert tree_digest(work.outside) == before_outside, "a file outside the run directory changed"


def report_files(root: Path) -> str:
    return "".join((root / "report" / n).read_text() for n in ("report.json", "report.md", "report.html"))


# ------------------------------------------------------------------------------------------ the README's order


def test_every_test_runs_in_its_own_working_directory(tmp_path):
    """tests/conftest.py: no test reads or writes the directory pytest was started in (where the README's first
    command leaves the demo's store)."""
    assert Path.cwd() == tmp_path


# ------------------------------------------------------------------------------------------ links

LINKS = [
    # (what becomes a link, where it points, the command that must refuse the store)
    ("scores/worklog.jsonl", "keep.json", ["score", "{root}", "--no-progress"]),
    ("report", "report", ["report", "{root}"]),
    ("scores/quantizers/fp32.json", "fp32.json", ["report", "{root}"]),
    ("scores/run-000", "dir", ["status", "{root}"]),
    ("locks", "dir", ["score", "{root}", "--no-progress"]),
    ("results", "dir", ["report", "{root}"]),
    ("data/pool.jsonl", "secret.json", ["report", "{root}", "--include-samples"]),
    ("manifest.json", "keep.json", ["status", "{root}"]),
    ("runs/run-001/checkpoints/{final1}", "dir", ["score", "{root}", "--no-progress"]),
    ("scores/quarantine", "dir", ["score", "{root}", "--deep-verify", "--no-progress"]),
    ("scores/run-002/{final2}/fp32.RUNNING.json", "keep.json", ["status", "{root}"]),
    ("data", "dir", ["finetune", "demo-cpu", *TINY_OVERRIDES, "output_dir={root}", "--no-progress"]),
]


@pytest.mark.parametrize("entry, target, command", LINKS, ids=[e for e, _, _ in LINKS])
def test_a_link_inside_the_store_is_refused_by_every_command(received, entry, target, command):
    """Files and directories alike: the store is refused when it is opened, before any read or write, and the
    message names the link; nothing outside is opened, appended to, written into or shown in a report."""
    names = {
        "final1": f"step-{received.store.checkpoints(1)[-1]:06d}",
        "final2": f"step-{received.store.checkpoints(2)[-1]:06d}",
    }
    link = received.root / entry.format(**names)
    received.unit(0, "sign").unlink()  # a unit to score: a score that got past the check would write and log it
    if link.is_dir():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(received.outside / target)
    report_before = report_files(received.root) if entry != "report" else None
    code, out, err = received.cli([a.format(root=received.root) for a in command])
    refused(code, err, str(link), "is a symbolic link", "cp -rL")
    assert "OUTSIDE-CONTENT" not in out + err
    if report_before is not None:
        assert report_files(received.root) == report_before  # no report was written from outside content
    changed = ("run-000/", "run-002/", entry.removeprefix("scores/"))  # the unit deleted above, the link itself
    kept = {k: v for k, v in received.before_units.items() if not k.startswith(changed)}
    assert unit_digests(received.root).items() >= kept.items()


def test_a_fifo_or_a_hard_link_inside_the_store_is_refused(received):
    """A FIFO would block a read forever; a hard link is a second name of a file that may live outside (the
    work log and the locks are written in place)."""
    fifo = received.root / "data" / "val.jsonl"
    fifo.unlink()
    os.mkfifo(fifo)
    t0 = time.time()
    refused(*received.cli(["report", str(received.root)])[::2], str(fifo), "not a regular file")
    assert time.time() - t0 < 60
    fifo.unlink()
    shutil.copy(received.base / "data" / "val.jsonl", fifo)
    log = received.root / "scores" / "worklog.jsonl"
    log.unlink()
    os.link(received.outside / "keep.json", log)
    refused(*received.cli(["score", str(received.root), "--no-progress"])[::2], str(log), "hard links")
    os.unlink(log)


def test_links_at_or_above_the_root_and_in_submitits_folder_are_the_users_own(received):
    """The run directory may be reached through a link (a scratch disk linked from home), and submitit keeps
    links of its own in jobs/: both work."""
    (received.root / "jobs" / "score").mkdir(parents=True)
    (received.root / "jobs" / "score" / "1_submission.sh").symlink_to("1_submitted.sh")
    alias = received.sandbox / "alias"
    alias.symlink_to(received.root, target_is_directory=True)
    code, out, err = received.cli(["status", str(alias)])
    assert code == 0 and "complete" in out, err


# ------------------------------------------------------------------------------------------ digests


def test_an_edited_adapter_config_is_refused_by_score_status_and_report(received):
    """Doubling lora_alpha doubles the adapter's update: scored silently, the report's validation loss would be
    another model's. The adapter's configuration is under the recorded digest like its weights."""
    directory = received.final_dir(1)
    config = directory / "adapter_config.json"
    config.write_text(json.dumps(dict(json.loads(config.read_text()), lora_alpha=64)))
    received.unit(1).unlink()
    code, out, err = received.cli(["score", str(received.root), "--no-progress"])
    refused(code, err, str(directory), "adapter_config.json changed since it was recorded", f"delete {directory}")
    code, out, _ = received.cli(["status", str(received.root)])
    assert code == 0 and "problem:" in out and "adapter_config.json changed" in out
    refused(*received.cli(["report", str(received.root)])[::2], "adapter_config.json changed")
    kept = {k: v for k, v in received.before_units.items() if not k.startswith("run-001/")}
    assert unit_digests(received.root).items() >= kept.items()


def test_a_file_added_to_a_checkpoint_is_refused(received):
    """A tokenizer (or a full model) dropped beside an adapter changes what a loader may read."""
    directory = received.final_dir(0)
    (directory / "tokenizer.json").write_text("{}")
    refused(*received.cli(["report", str(received.root)])[::2], "tokenizer.json is in the checkpoint but not among")


def test_a_recorded_file_name_that_is_a_path_is_refused_unread(received):
    done = received.store.run_done_path(2)
    record = json.loads(done.read_text())
    record["checkpoint_files"][-1]["../../../../outside/secret.json"] = "0" * 64
    done.write_text(json.dumps(record))
    code, out, err = received.cli(["report", str(received.root)])
    refused(code, err, str(done), "is not a checkpoint file")


def test_a_run_record_with_the_adapter_digest_only_is_verified_as_far_as_it_goes(received):
    """A run record that holds the adapter weights' digest only (no checkpoint_files, no digest_scope) stays
    readable and reportable; status and report say which files are not covered (and an edit there is not detected)."""
    for run in range(3):
        path = received.store.run_done_path(run)
        record = json.loads(path.read_text())
        for key in ("checkpoint_files", "digest_scope"):
            record.pop(key)
        path.write_text(json.dumps(record))
    code, out, err = received.cli(["status", str(received.root)])
    assert code == 0 and "complete" in out.splitlines()[-1], err
    note = next(line for line in out.splitlines() if "note: digests:" in line)
    assert "older llmaudit" in note and "adapter_config.json not covered" in note
    code, out, err = received.cli(["report", str(received.root)])
    assert code == 0 and "adapter_config.json not covered" in out, err
    # the weights stay covered as before
    adapter = received.final_dir(0) / "adapter_model.safetensors"
    adapter.write_bytes(adapter.read_bytes()[:-8] + b"\0" * 8)
    received.unit(0).unlink()
    refused(*received.cli(["score", str(received.root), "--no-progress"])[::2], "adapter_model.safetensors changed")


# ------------------------------------------------------------------------------------------ loss tables


def _two_quantizers(received: Received) -> pd.DataFrame:
    return pd.concat([pq.read_table(received.unit(0, q)).to_pandas() for q in ("fp32", "sign")], ignore_index=True)


@pytest.mark.parametrize("command", ["attack", "indicator", "memorization"])
def test_a_table_whose_member_flags_differ_between_quantizers_is_refused(received, command):
    table = _two_quantizers(received)
    row = table.index[(table["quantizer"] == "sign") & (table["split"] == "pool")][0]
    table.loc[row, "member"] = not table.loc[row, "member"]
    path = received.sandbox / "table.parquet"
    table.to_parquet(path)
    code, _, err = received.cli([command, str(path), "--out", str(received.sandbox / "out.json")])
    refused(code, err, str(path), f"sample {table.loc[row, 'sample_id']!r}", "quantizer fp32", "quantizer sign")
    assert "One (run, sample) has one membership" in err
    assert not (received.sandbox / "out.json").exists()


def test_tables_in_a_directory_that_contradict_each_other_name_both_files(received):
    tables = received.sandbox / "tables"
    tables.mkdir()
    for q in ("fp32", "sign"):
        frame = pq.read_table(received.unit(1, q)).to_pandas()
        if q == "sign":
            pool = frame.index[frame["split"] == "pool"]
            frame.loc[pool, "member"] = ~frame.loc[pool, "member"]
        frame.to_parquet(tables / f"{q}.parquet")
    code, _, err = received.cli(["attack", str(tables), "--out", str(received.sandbox / "out.json")])
    refused(code, err, str(tables / "fp32.parquet"), str(tables / "sign.parquet"), "more (run, sample) pair(s)")


# ------------------------------------------------------------------------------------------ a full disk


@pytest.fixture
def disk_full_for(monkeypatch):
    """`disk_full_for("report.json")`: every fsync of a temporary file of that name (or of the file itself,
    appended to) fails as a full disk does."""
    real = os.fsync

    def arm(name: str) -> None:
        def fsync(fd: int) -> None:
            target = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
            if target == name or target.startswith(f".{name}."):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    return arm


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell which file an fsync is for")
def test_a_full_disk_names_the_file_and_keeps_what_was_there(received, disk_full_for):
    report = received.root / "report" / "report.json"
    before = report.read_bytes()
    disk_full_for("report.json")
    code, _, err = received.cli(["report", str(received.root)])
    refused(code, err, f"cannot write {report}: No space left on device", "free space", "kept")
    assert report.read_bytes() == before  # the old report stays whole
    assert not [p for p in report.parent.iterdir() if p.name.endswith(".tmp")]  # no half file left behind


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell which file an fsync is for")
def test_a_full_disk_while_logging_work_leaves_the_log_as_it_was(received, disk_full_for):
    log = received.root / "scores" / "worklog.jsonl"
    before = log.read_bytes()
    received.unit(2, "sign").unlink()
    disk_full_for("worklog.jsonl")
    code, _, err = received.cli(["score", str(received.root), "--no-progress"])
    refused(code, err, f"cannot write {log}: No space left on device")
    assert log.read_bytes() == before  # no torn line for the next append to run into
    assert (
        unit_digests(received.root).items()
        >= {k: v for k, v in received.before_units.items() if not k.endswith("sign.parquet")}.items()
    )


def test_a_full_disk_inside_a_checkpoint_writer_names_the_checkpoint(tmp_path):
    """safetensors reports a full disk in its own error type: still one line naming the directory, and no
    half checkpoint."""
    from llmaudit.common.io import WriteError, atomic_dir

    target = tmp_path / "step-000004"
    with pytest.raises(WriteError, match=f"cannot write {target}: No space left on device"), atomic_dir(target) as tmp:
        (tmp / "adapter_model.safetensors").write_bytes(b"half")
        raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "..." })')
    assert not target.exists() and os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------ unbounded input

DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, os, sys, time
    watched, opened = sys.argv[2] + os.sep, []
    def audit(event, args):
        if event == "open" and args and isinstance(args[0], (str, os.PathLike)):
            if os.path.abspath(os.fspath(args[0])).startswith(watched):
                opened.append(os.fspath(args[0]))
    sys.addaudithook(audit)
    from llmaudit import cli
    results = []
    for args in json.loads(sys.argv[1]):
        out, err, code, t0 = io.StringIO(), io.StringIO(), 0, time.time()
        sys.argv = ["llmaudit", *args]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                cli.main()
            except SystemExit as exc:
                code = int(exc.code or 0)
        results.append({"code": code, "out": out.getvalue(), "err": err.getvalue(), "seconds": time.time() - t0})
    print(json.dumps({"results": results, "opened": opened}))
    """
)
LIMIT_GIB = 3
"""Address space of the child process: enough for torch and llmaudit (about 1.5 GiB), far from what an alias bomb,
a recursion or an array of 300 million runs asks for."""


def run_limited(cases: list[list[str]], *, outside: Path, timeout: float = 300) -> list[dict]:
    """Each `llmaudit ARGS` of `cases`, in one child process under RLIMIT_AS = LIMIT_GIB and a timeout; a case
    that runs out of memory kills the child (MemoryError, a non-zero exit) and fails the test, and so does any
    file the child opens below `outside`."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT_GIB * 2**30, LIMIT_GIB * 2**30))

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), LLMAUDIT_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(cases), str(outside.resolve())],
        preexec_fn=limit,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert not report["opened"], f"files outside the run directory were opened: {report['opened'][:3]}"
    return report["results"]


def _alias_bomb(levels: int = 12) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _fake_training_dir(path: Path, trainer_state: str | None = None) -> Path:
    """A Trainer output directory as `llmaudit import` first reads it (names only: no model is loaded before
    the data files are read)."""
    checkpoint = path / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    (checkpoint / "adapter_model.safetensors").write_bytes(b"")
    if trainer_state is not None:
        (path / "trainer_state.json").write_text(trainer_state)
    return path


@pytest.mark.slow  # one child process (torch's import): about 20 s on a 2-core CPU
def test_unbounded_input_is_refused_in_bounded_time_and_memory(received):
    sandbox, deep = received.sandbox, "[" * 200_000 + "]" * 200_000
    recipes = {
        "bomb.yaml": _alias_bomb(),
        "sizes.yaml": "train:\n  runs: 300000000\ndata:\n  pool_size: 300000000\n",
        "date.yaml": "train:\n  runs: 2024-01-01\n",
        "binary.yaml": "name: !!binary aGVsbG8=\n",
        "deep.yaml": "train: " + "[" * 100_000 + "\n",
    }
    for name, text in recipes.items():
        (sandbox / name).write_text(text)
    deep_store = sandbox / "deep-store"  # a manifest nested 200,000 levels deep
    shutil.copytree(received.root, deep_store)
    (deep_store / "manifest.json").write_text('{"name": ' + deep + "}")
    deep_line = sandbox / "deep-line"  # a data file whose first line is nested as deep
    shutil.copytree(received.root, deep_line)
    pool = deep_line / "data" / "pool.jsonl"
    pool.write_text(deep + "\n" + pool.read_text())
    many = sandbox / "many-masks"  # a forged manifest (digest recomputed) with 2,000 runs' masks
    shutil.copytree(received.root, many)
    manifest = received.manifest()
    manifest["membership"]["masks"] = manifest["membership"]["masks"] * 700
    (many / "manifest.json").write_text(json.dumps(dict(manifest, content_digest=content_digest(manifest))))
    (sandbox / "deep.jsonl").write_text('{"text": "a"}\n{"text": ' + deep + "}\n")
    (sandbox / "ok.jsonl").write_text('{"text": "hello there"}\n' * 8)
    state_dir = _fake_training_dir(sandbox / "trainer-deep", trainer_state='{"log_history": ' + deep + "}")
    plain_dir = _fake_training_dir(sandbox / "trainer")
    imp = ["import", "--base", "builtin:tiny-qwen2", "--heldout", str(sandbox / "ok.jsonl")]
    cases = {
        "alias bomb": (["plan", str(sandbox / "bomb.yaml")], [str(sandbox / "bomb.yaml"), "alias"]),
        "alias in an override": (["plan", "demo-cpu", "train.runs=[&a [1, 1], *a, *a]"], ["train.runs", "alias"]),
        "absurd sizes": (
            ["plan", str(sandbox / "sizes.yaml")],
            ["train.runs = 300000000", "1024", "LiRA", "data.pool_size"],
        ),
        "date for a number": (["plan", str(sandbox / "date.yaml")], ["train.runs = '2024-01-01'", "valid integer"]),
        "binary value": (["plan", str(sandbox / "binary.yaml")], ["name (a bytes)", "not plain data"]),
        "deep recipe": (["plan", str(sandbox / "deep.yaml")], [str(sandbox / "deep.yaml"), "nested more than 64"]),
        "deep manifest": (["status", str(deep_store)], [str(deep_store / "manifest.json"), "nested more than 64"]),
        "deep data line": (
            ["report", str(deep_line)],
            [f"{deep_line / 'data' / 'pool.jsonl'}:1", "nested more than 64"],
        ),
        "2,000 runs of masks": (["status", str(many)], [str(many / "manifest.json"), "more than any experiment holds"]),
        "deep --train file": (
            [*imp, str(plain_dir), "--train", str(sandbox / "deep.jsonl"), "--out", str(sandbox / "o1")],
            [f"{sandbox / 'deep.jsonl'}:2", "nested more than 64"],
        ),
        "deep trainer_state.json": (
            [*imp, str(state_dir), "--train", str(sandbox / "ok.jsonl"), "--out", str(sandbox / "o2")],
            [str(state_dir / "trainer_state.json"), "nested more than 64"],
        ),
    }
    results = run_limited([args for args, _ in cases.values()], outside=received.outside)
    for (name, (_, fragments)), result in zip(cases.items(), results, strict=True):
        assert result["seconds"] < 60, (name, result["seconds"])
        try:
            refused(result["code"], result["err"], *fragments)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert not (sandbox / "o1").exists() and not (sandbox / "o2").exists()


def test_dates_in_a_recipe_stay_the_strings_they_are_written_as(tmp_path):
    from llmaudit.config import load_recipe

    path = tmp_path / "r.yaml"
    path.write_text("name: 2024-01-01\nreport:\n  indicator: 2024-01-01T10:00:00\n")
    cfg = load_recipe(path, ["output_dir=2025-02-03"])
    assert cfg.name == "2024-01-01" and cfg.report.indicator == "2024-01-01T10:00:00"
    assert cfg.output_dir == "2025-02-03"
