"""How close `llmaudit plan` comes to the measured wall time of `llmaudit audit` on this machine.

For each setting (the CPU demo, more runs, more quantizers) the script runs, each in a fresh process as a user
would: `llmaudit plan RECIPE ... --device cpu --json` (the estimate, from a few-second calibration), then the
audit's three stages `llmaudit finetune RECIPE ... --out DIR`, `llmaudit score DIR`, `llmaudit report DIR` (what
`llmaudit audit` runs in one process), timing each, and prints the ratio measured / planned per stage and in
total. The goal is a total ratio within [1/1.5, 1.5].

The built-in base model is built once and cached in $LLMAUDIT_CACHE (the demo's first 30 s); the script builds
it before timing anything, so every audit measures finetune + score + report only, like the plan.

    python benchmarks/bench_plan.py                 # the three settings
    python benchmarks/bench_plan.py --only demo     # one of them
    python benchmarks/bench_plan.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "demo": ["demo-cpu"],
    "more-runs": ["demo-cpu", "train.runs=12"],
    "more-quantizers": [
        "demo-cpu",
        "score.quantizers=[fp32, uniform-5, uniform-4, uniform-3, uniform-2, ternary-50, ternary-90, sign, hqq-4, "
        "hqq-3, hqq-2, bnb-nf4, bnb-int8, gptq-4]",
        # the built-in model's layers are 64 wide: GPTQ's default group of 128 does not divide them
        "score.quantizer_options.gptq-4={group_size: 32}",
    ],
}


def _llmaudit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmaudit.cli", *args], capture_output=True, text=True, check=False)


def run_setting(name: str, args: list[str]) -> dict:
    plan = _llmaudit("plan", *args, "--device", "cpu", "--json")
    if plan.returncode:
        raise RuntimeError(f"plan failed for {name}: {plan.stderr[-2000:]}")
    estimate = json.loads(plan.stdout)["estimate"]
    measured = {}
    with tempfile.TemporaryDirectory(prefix="llmaudit-bench-plan-") as tmp:
        run_dir = str(Path(tmp) / "run")
        for stage, cmd in (
            ("finetune", ["finetune", *args, "--out", run_dir, "--no-progress"]),
            ("score", ["score", run_dir, "--no-progress"]),
            ("report", ["report", run_dir]),
        ):
            t0 = time.perf_counter()
            done = _llmaudit(*cmd)
            measured[stage] = time.perf_counter() - t0
            if done.returncode:
                raise RuntimeError(f"{stage} failed for {name}: {done.stderr[-2000:]}")
    total = sum(measured.values())
    return {
        "setting": name,
        "args": args,
        "planned_s": estimate["total_s"],
        "planned": {k: estimate[f"{k}_s"] for k in ("finetune", "score", "report")},
        "measured_s": total,
        "measured": measured,
        "ratio": total / estimate["total_s"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=sorted(SETTINGS), action="append", help="Run only these settings.")
    ap.add_argument("--json", type=Path, help="Also write the rows as JSON.")
    ns = ap.parse_args(argv)
    warm = _llmaudit("plan", "demo-cpu", "--device", "cpu", "--json")  # builds and caches the base model
    if warm.returncode:
        print(warm.stderr[-2000:], file=sys.stderr)
        return 1
    rows, failed = [], []
    for name in ns.only or list(SETTINGS):
        try:  # a failing setting must not lose the ones measured before it
            rows.append(run_setting(name, SETTINGS[name]))
        except RuntimeError as exc:
            failed.append(name)
            print(exc, file=sys.stderr)
    print(f"{'setting':<16} {'planned':>9} {'measured':>9} {'measured/planned':>17}  stages planned -> measured")
    for r in rows:
        stages = ", ".join(f"{k} {r['planned'][k]:.0f}->{r['measured'][k]:.0f}s" for k in r["planned"])
        print(f"{r['setting']:<16} {r['planned_s']:>8.0f}s {r['measured_s']:>8.0f}s {r['ratio']:>17.2f}  {stages}")
    ok = all(1 / 1.5 <= r["ratio"] <= 1.5 for r in rows) and not failed
    print(
        f"goal: every ratio within [0.67, 1.5]: {'met' if ok else 'NOT met'}"
        + (f"; failed: {failed}" if failed else "")
    )
    if ns.json:
        ns.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
