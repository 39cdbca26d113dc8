"""One number, one answer, five outputs: on a small audited store whose release decision measures every
quantizer's leakage, the terminal's last lines, report.html's banner, report.md, model_card.md and `--gate` (its
line, gate.json, the JUnit XML and the GitHub step summary) state the same headline leakage for each quantizer as
report.json's decision (`strongest.tpr`), and every FAIL line names its criterion with its number and limit."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET

import jsonschema
import numpy as np
import pandas as pd
import pytest

from llmaudit.analyze.store_analysis import analyze
from llmaudit.config import ExperimentConfig
from llmaudit.data.pool import membership_masks
from llmaudit.report.gate import gate_schema
from llmaudit.report.write import write_report
from llmaudit.store.losstable import validate_loss_table
from tests.conftest import run_cli, write_store_from_table

RUNS, N_POOL, N_VAL, STEPS, N_TOK = 6, 420, 12, (10, 20), 6
# quantizer: (member loss shift at the final checkpoint, extra loss of every record). The calibrated headline of
# these leaks lies near 0.1 (the limit is 0.05), so the table's seed fixes which side of the limit each lands on:
# seed 5 gives fp32 and uniform-5 a leakage FAIL and sign a utility FAIL, the verdicts these cases read.
LEAKS = {"fp32": (1.4, 0.0), "uniform-5": (1.4, 0.03), "sign": (0.0, 2.0)}
RELEASE = "uniform-5"

# "TPR 0.140 [0.074, 0.248]" as every output writes THE number (Markdown may escape the brackets)
TPR = re.compile(r"TPR (\S+) \\?\[([^,\]]+), ([^\]\\]+)\\?\]")


def _record(split: str, j: int) -> dict:
    return {
        "sample_id": f"synthetic/{split}/{j:04d}",
        "task": "molecule_captioning",
        "split": split,
        "input": f"Describe molecule number {j}",
        "output": f"Molecule {j} is a compound.",
    }


def _table(rng: np.random.Generator, membership: np.ndarray) -> pd.DataFrame:
    """Loss rows of every unit: the base model once, every run's checkpoints under every quantizer; members of
    a run lose `shift` nats at its final checkpoint, every record of a quantizer `extra` more."""
    difficulty = {"pool": rng.uniform(1.0, 2.0, N_POOL), "val": rng.uniform(1.0, 2.0, N_VAL)}
    rows = []

    def add(run, step, q, split, j, loss, member):
        tl = np.abs(rng.normal(loss, 0.2, N_TOK))
        rows.append(
            dict(run=run, checkpoint=step, quantizer=q, sample_id=f"synthetic/{split}/{j:04d}", split=split,
                 member=member, loss=float(tl.mean()), n_tokens=N_TOK, token_losses=tl, zlib_bytes=40 + j)
        )  # fmt: skip

    for split, n in (("pool", N_POOL), ("val", N_VAL)):
        for j in range(n):
            add(-1, 0, "fp32", split, j, difficulty[split][j] + 0.3, False)
    for q, (shift, extra) in LEAKS.items():
        for run in range(RUNS):
            for k, step in enumerate(STEPS):
                for split, n in (("pool", N_POOL), ("val", N_VAL)):
                    for j in range(n):
                        member = split == "pool" and bool(membership[run, j])
                        loss = difficulty[split][j] + extra - shift * member * (k + 1) / len(STEPS)
                        add(run, step, q, split, j, loss + rng.normal(0, 0.3), member)
    return validate_loss_table(pd.DataFrame(rows))


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """The store audited and reported, then `llmaudit report --release uniform-5 --gate` on it: every output."""
    root = tmp_path_factory.mktemp("one") / "run"
    cfg = ExperimentConfig(
        name="one-answer",
        output_dir=str(root),
        train={"runs": RUNS},
        score={"quantizers": list(LEAKS)},
        attack={"attacks": ["loss", "ref"], "n_boot": 20},
        report={"decision_resamples": 200},
    )
    pool, val = [_record("pool", j) for j in range(N_POOL)], [_record("val", j) for j in range(N_VAL)]
    membership = membership_masks(N_POOL, RUNS, 0.5, seed=0)
    store = write_store_from_table(root, cfg, pool, val, membership, _table(np.random.default_rng(5), membership))
    for q in LEAKS:
        (store.scores_dir / "quantizers").mkdir(parents=True, exist_ok=True)
        family = "full" if q == "fp32" else "simple"
        (store.scores_dir / "quantizers" / f"{q}.json").write_text(json.dumps({"name": q, "family": family}))
    write_report(store, analyze(cfg, store, echo=lambda *a, **k: None))
    summary = root / "step-summary.md"
    code, out, err = run_cli(
        ["report", root, "--release", RELEASE, "--gate"], env={"GITHUB_STEP_SUMMARY": str(summary)}
    )
    report_dir = root / "report"
    read = {name: (report_dir / name).read_text(encoding="utf-8") for name in ("report.md", "model_card.md")}
    return {
        "code": code,
        "terminal": out,
        "gate": err,
        "report": json.loads((report_dir / "report.json").read_text()),
        "html": (report_dir / "report.html").read_text(encoding="utf-8"),
        "gate.json": json.loads((report_dir / "gate.json").read_text()),
        "junit": ET.fromstring((report_dir / "gate-junit.xml").read_text()),
        "summary": summary.read_text(encoding="utf-8"),
        **read,
    }


def _headlines(report: dict) -> dict[str, tuple[float, float, float]]:
    """report.json's headline per quantizer: the release decision's strongest attack, (value, low, high)."""
    out = {}
    for row in report["grid"]:
        tpr = row["decision"]["strongest"]["tpr"]
        out[row["quantizer"]] = (tpr["value"], tpr["low"], tpr["high"])
    return out


def _stated(text: str) -> tuple[float, float, float]:
    """The one headline a piece of text states (asserted to be exactly one)."""
    found = TPR.findall(text)
    assert len(found) == 1, (found, text)
    return tuple(float(x) for x in found[0])


def _same(stated: tuple[float, float, float], truth: tuple[float, float, float]) -> bool:
    return all(abs(a - b) <= 5e-4 + 1e-9 for a, b in zip(stated, truth))


def _terminal_lines(terminal: str, reference: str) -> dict[str, str]:
    """Each quantizer's part of the terminal's answer: the baseline paragraph (the reference), each candidate's
    line with its continuation lines."""
    lines = terminal.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("llmaudit verdict:"))
    parts, current = {}, None
    for line in lines[start + 1 :]:
        m = re.match(r"  (\S+)\s+(PASS|FAIL|INCONCLUSIVE|NOT MEASURED)\s", line)
        if m:
            current = m.group(1)
            parts[current] = line
        elif line.startswith(" ") and current is not None:
            parts[current] += " " + line.strip()
        elif current is None:
            parts[reference] = parts.get(reference, "") + " " + line.strip()
        else:
            break
    return parts


def test_the_store_measures_every_quantizer_and_the_gate_blocks_the_release(outputs):
    heads = _headlines(outputs["report"])
    assert set(heads) == set(LEAKS) and all(v is not None for h in heads.values() for v in h)
    assert heads["fp32"][0] > 0.05 and heads["sign"][0] < heads["fp32"][0]  # what was planted: fp32 leaks
    assert outputs["code"] == 3  # uniform-5 leaks: not cleared


def test_the_five_outputs_state_the_same_headline_for_each_quantizer(outputs):
    report = outputs["report"]
    heads = _headlines(report)
    reference = report["reference_quantizer"]
    terminal = _terminal_lines(outputs["terminal"], reference)
    banner = re.search(r'<div class="banner \w+" role="status" id="answer">(.*?)</div>', outputs["html"], re.S)
    items = dict(re.findall(r"<li><code>([^<]+)</code>(.*?)</li>", banner.group(1)))
    first = html.unescape(re.sub("<[^>]+>", "", banner.group(1).split("</p>", 1)[0]))
    answer_md = outputs["report.md"].split("## Answer", 1)[1].split("\n## ", 1)[0]
    md = dict(re.findall(r"^- `([^`]+)` (.*)$", answer_md, re.M))
    md[reference] = answer_md.strip().split("\n")[0]
    card = dict(re.findall(r"^  - `([^`]+)`(.*)$", outputs["model_card.md"], re.M))
    gate = {q["name"]: q for q in outputs["gate.json"]["quantizers"]}
    for q, truth in heads.items():
        stated = {
            "terminal": _stated(terminal[q]),
            "html": _stated(first if q == reference else html.unescape(items[q])),
            "report.md": _stated(md[q]),
            "model_card.md": _stated(card[q]),
            "gate.json line": _stated(gate[q]["line"]),
        }
        for where, value in stated.items():
            assert _same(value, truth), (q, where, value, truth)
        leak = gate[q]["leakage"]
        assert (leak["value"], leak["low"], leak["high"]) == truth  # gate.json: the numbers themselves
    gate_line = next(x for x in outputs["gate"].splitlines() if x.startswith("[gate] BLOCKED: "))
    assert _same(_stated(gate_line), heads[RELEASE]) and gate_line.split()[2] == RELEASE
    row = next(x for x in outputs["summary"].splitlines() if x.startswith(f"| {RELEASE} "))
    assert "released" in row and _same(_stated(row), heads[RELEASE])


def test_every_fail_names_its_criterion_number_and_limit_everywhere(outputs):
    named = re.compile(r"(leakage TPR|validation loss) [-+\d.e%]+ \\?\[[^\]]+\\?\] (&gt;|\\?>) [-+\d.%]+")
    lines = [x for x in outputs["terminal"].splitlines() if re.match(r"\s+\S+\s+FAIL\s", x)]
    lines += [x for x in outputs["gate"].splitlines() if " FAIL " in x]
    lines += re.findall(r"<li><code>[^<]+</code> <b>FAIL</b>.*?</li>", outputs["html"])
    lines += [x for x in outputs["report.md"].splitlines() if x.startswith("- `") and "**FAIL**" in x]
    lines += [q["line"] for q in outputs["gate.json"]["quantizers"] if q["verdict"] == "FAIL"]
    fails = [q for q in outputs["gate.json"]["quantizers"] if q["verdict"] == "FAIL"]
    candidates = [q for q in fails if not q["is_reference"]]  # the reference is the baseline, not a candidate line
    assert len(candidates) >= 2 and len(lines) == 3 * len(candidates) + 1 + len(fails)
    for line in lines:
        assert named.search(line), line


def test_the_gate_files_follow_their_schema_and_conventions(outputs):
    summary = outputs["gate.json"]
    jsonschema.validate(summary, gate_schema())
    assert summary["schema_version"] == 1 and summary["release"] == RELEASE and summary["exit_code"] == 3
    assert summary["cleared"] is False and summary["reason"].startswith(f"{RELEASE}  FAIL  ")
    suite = outputs["junit"].find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == len(LEAKS) and int(suite.get("tests")) == len(LEAKS)
    failed = {c.get("name").split()[0]: c.find("failure") for c in cases if c.find("failure") is not None}
    assert int(suite.get("failures")) == len(failed)
    for q in summary["quantizers"]:
        if q["verdict"] != "PASS":
            assert failed[q["name"]].get("message") == f"{q['verdict']}: {q['deciding']['text']}"
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["release"] == RELEASE and props["cleared"] == "false"
    assert (
        outputs["summary"].startswith("### llmaudit release gate: one-answer") and "**BLOCKED**" in outputs["summary"]
    )
