"""Whole audits with a baseline checkout and with this one, one after the other on the same machine: wall time, peak
memory, the ratio, and whether the two reports agree.

    python benchmarks/bench_audit_baseline.py --baseline ../llmaudit-landed/src [--recipe demo-cpu] [--repeat 1]
        [--out DIR] [--json out.json]

Each audit is `llmaudit audit RECIPE --out DIR --no-progress` in a fresh process with that code first on the import
path, from an empty cache (`$LLMAUDIT_CACHE` wiped before every audit: the built-in model is built, a GGUF model
converted, as in a fresh clone; the same cache path every time, so the reports name the same paths). With
`--repeat N` the audits alternate, baseline first (B C B C ...), and the ratio is taken pair by pair, so a machine
whose speed drifts moves both. Printed per audit: the wall time, its stages as the audit logs them (fine-tuning,
scoring, the audit's own count), the peak resident memory of the largest process (`wait4`'s ru_maxrss, what
`/usr/bin/time -v` reports) and the largest VmHWM sampled every second among the audit's processes (its
scoring processes included); then current / baseline; and the reports compared: for the demo every value
(`compare_reports.py`: 0 differences expected of a change that changes no number), for any other recipe the
verdicts (`compare_verdicts.py`: 0 verdicts may differ). The demo takes minutes per audit; smollm2-135m-verdict
about an hour (run it on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CURRENT_SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))

AUDIT_S = re.compile(r"\[audit\] finished in (\d+(?:\.\d+)?)s")
STAGE_LINES = {"build_s": "[model]", "finetune_s": "[finetune]", "score_s": "[score]", "analysis_s": "[analyze]"}
"""Each stage's wall: from the first line of its tag to the first line of the next stage's (the analysis: from the
last "[score] scored" line, as it reads the loss tables before its own first line, to the end), by the time each line
reached the benchmark. Stages that several processes run (fine-tuning and scoring with
train.processes / score.processes) are timed as their wall, not as the sum of their processes' own seconds."""


def stage_walls(timed: list[tuple[float, str]], end: float) -> dict[str, float]:
    """{stage: seconds} from (arrival time, line) pairs; a stage whose tag never appears is 0."""
    starts = {}
    for key, tag in STAGE_LINES.items():
        starts[key] = next((t for t, line in timed if line.startswith(tag)), None)
    scored = [t for t, line in timed if line.startswith("[score] scored")]
    if scored and starts["analysis_s"] is not None:  # the analysis reads the loss tables before its first line
        starts["analysis_s"] = scored[-1]
    order = [k for k in STAGE_LINES if starts[k] is not None]
    walls = dict.fromkeys(STAGE_LINES, 0.0)
    for i, key in enumerate(order):
        stop = starts[order[i + 1]] if i + 1 < len(order) else end
        walls[key] = stop - starts[key]
    return walls


def _timed_lines(stream: Any, sink: Any, t0: float, timed: list[tuple[float, str]]) -> None:
    """Copy the audit's output to its log, noting when each line arrived (seconds after t0)."""
    for line in iter(stream.readline, ""):
        sink.write(line)
        timed.append((time.monotonic() - t0, line))


def _tree(root: int) -> list[int]:
    """root and its descendants (from /proc's parent ids)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _vmhwm_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_audit(src: Path, recipe: str, out: Path, cache: Path) -> dict[str, Any]:
    """One audit with the code at `src`: wall, stages, peak memory, where its report is."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=str(src), LLMAUDIT_CACHE=str(cache), HF_HUB_OFFLINE="1")
    log = out.with_suffix(".log")
    command = [sys.executable, "-m", "llmaudit.cli", "audit", recipe, "--out", str(out), "--no-progress"]
    peaks: dict[int, int] = {}
    timed: list[tuple[float, str]] = []
    t0 = time.monotonic()
    with open(log, "w") as sink:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        reader = threading.Thread(target=_timed_lines, args=(child.stdout, sink, t0, timed), daemon=True)
        reader.start()
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            for p in _tree(child.pid):
                peaks[p] = max(peaks.get(p, 0), _vmhwm_kib(p))
            time.sleep(1.0)
        wall = time.monotonic() - t0
        reader.join(timeout=10)
    text = log.read_text(errors="replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_audit_baseline: the audit with {src} failed; its output: {log}\n{text[-2000:]}")
    finished = [float(v) for v in AUDIT_S.findall(text)]
    end = next((t for t, line in timed if line.startswith("[audit] finished")), wall)
    return {
        "src": str(src),
        "wall_s": wall,
        **stage_walls(timed, end),
        "audit_s": (finished or [float("nan")])[-1],
        "max_rss_mib": usage.ru_maxrss / 1024,
        "max_vmhwm_mib": max(peaks.values() or [0]) / 1024,
        "report": str(out / "report" / "report.json"),
    }


def compare(recipe: str, before: str, after: str) -> dict[str, Any]:
    """The two reports: every value (the demo) or the verdicts (any other recipe)."""
    a, b = (json.loads(Path(p).read_text()) for p in (before, after))
    if recipe == "demo-cpu":
        from compare_reports import differences

        found = differences(a, b)
        return {"kind": "every value", "differences": len(found), "first": [str(d)[:160] for d in found[:5]]}
    from compare_verdicts import verdicts

    va, vb = verdicts(a), verdicts(b)
    differ = sorted(q for q in set(va) | set(vb) if va.get(q) != vb.get(q))
    rec = [(r["recommendation"].get("quantizer"), r["recommendation"].get("overall")) for r in (a, b)]
    return {"kind": "verdicts", "differences": len(differ) + (rec[0] != rec[1]), "first": differ[:5]}


def print_rows(rows: list[dict], pairs: list[float], agreement: list[dict]) -> None:
    print(
        f"{'audit':10s} {'wall s':>8s} {'build s':>8s} {'finetune s':>11s} {'score s':>8s} {'analysis s':>11s} "
        f"{'max RSS MiB':>12s} {'max VmHWM MiB':>14s}"
    )
    for row in rows:
        print(
            f"{row['label']:10s} {row['wall_s']:8.1f} {row['build_s']:8.1f} {row['finetune_s']:11.1f} "
            f"{row['score_s']:8.1f} {row['analysis_s']:11.1f} {row['max_rss_mib']:12.0f} {row['max_vmhwm_mib']:14.0f}"
        )
    print(
        f"current / baseline wall, pair by pair: {', '.join(f'{r:.3f}' for r in pairs)}; median {statistics.median(pairs):.3f}"
    )
    for a in agreement:
        print(f"reports ({a['kind']}): {a['differences']} difference(s)" + (f": {a['first']}" if a["first"] else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the baseline checkout's src directory")
    ap.add_argument("--recipe", default="demo-cpu")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench-audit-baseline"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, pairs, agreement = [], [], []
    for i in range(args.repeat):
        pair = {}
        for label, src in (("baseline", args.baseline.resolve()), ("current", CURRENT_SRC)):
            row = run_audit(src, args.recipe, args.out / f"{label}-{i}", args.out / "cache")
            pair[label] = row | {"label": label}
            print(f"[bench_audit_baseline] {label} {i}: {row['wall_s']:.1f} s", file=sys.stderr, flush=True)
        rows += [pair["baseline"], pair["current"]]
        pairs.append(pair["current"]["wall_s"] / pair["baseline"]["wall_s"])
        agreement.append(compare(args.recipe, pair["baseline"]["report"], pair["current"]["report"]))
    print_rows(rows, pairs, agreement)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratios": pairs, "reports": agreement}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
