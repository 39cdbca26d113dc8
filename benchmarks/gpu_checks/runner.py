"""The parent of benchmarks/gpu_check.py: the time budget, each check in its own process with its own limit,
the JSON report and the table; and the child side, which runs one check and records its verdict."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .bench_scoring import check_bench_scoring
from .common import ROOT, SCRIPT, Result, SkipCheck, _jsonable, _one_line, skip_result
from .ddp import check_ddp
from .gpu_tests import check_gpu_tests
from .install import setup
from .quant_audit import check_quant_audit
from .train_score import check_train_score


@dataclass(frozen=True)
class CheckSpec:
    key: str
    label: str
    cap_s: dict[str, float]  # the longest this check may run, per device type
    min_s: dict[str, float]  # not started with less than this left of the budget


CHECKS: tuple[CheckSpec, ...] = (
    CheckSpec("gpu_tests", "a. pytest -m gpu", {"cuda": 200, "cpu": 90}, {"cuda": 45, "cpu": 20}),
    CheckSpec("bench_scoring", "b. scoring bench", {"cuda": 180, "cpu": 90}, {"cuda": 45, "cpu": 20}),
    CheckSpec("quant_audit", "c. mini audit", {"cuda": 270, "cpu": 120}, {"cuda": 90, "cpu": 30}),
    CheckSpec("ddp", "d. 2-process DDP", {"cuda": 180, "cpu": 120}, {"cuda": 60, "cpu": 40}),
    CheckSpec("train_score", "e. train + score", {"cuda": 120, "cpu": 60}, {"cuda": 30, "cpu": 15}),
)
# The run order: the core proof first; the check table keeps a..e.
RUN_ORDER = ("quant_audit", "bench_scoring", "gpu_tests", "train_score", "ddp")
RESERVE_S = 3.0  # kept for writing the results

CHILDREN = {
    "gpu_tests": check_gpu_tests,
    "bench_scoring": check_bench_scoring,
    "quant_audit": check_quant_audit,
    "ddp": check_ddp,
    "train_score": check_train_score,
}


def run_checks(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    out_path = Path(args.out).resolve()
    log_dir = out_path.with_name(out_path.stem + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    report = _report_header(args, log_dir)
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for key in RUN_ORDER:
            results[key] = _run_or_skip(key, report["device"], deadline, args, Path(work), log_dir)
            print(f"[gpu_check] {key}: {results[key]['status']} ({results[key].get('seconds', 0):.0f} s)", flush=True)
    report["checks"] = {c.key: results[c.key] for c in CHECKS}
    report["wall_s"] = time.monotonic() - t0
    report["ok"] = all(r["status"] != "fail" for r in results.values()) and report["setup"].get("status") != "fail"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(_jsonable(report), indent=1))
    print_table(report)
    print(f"wrote {out_path} ({report['wall_s']:.0f} s)")
    return report


def _report_header(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """The report before the checks: the run, the setup step (run here) and the device."""
    report: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "budget_s": args.budget_s,
        "log_dir": str(log_dir),
    }
    if args.no_setup:
        report["setup"] = {"status": "skip", "reason": "--no-setup"}
    else:
        report["setup"] = setup(Path(args.wheels).resolve(), max(10.0, min(300.0, args.budget_s / 2)))

    import torch

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    report.update(device=device, python=sys.version.split()[0], torch=torch.__version__)
    report["gpus"] = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if device == "cuda" else []
    )
    if device == "cuda" and not torch.cuda.is_available():
        report["error"] = "--device cuda but torch sees no CUDA device"
    return report


def _run_or_skip(
    key: str, device: str, deadline: float, args: argparse.Namespace, work: Path, log_dir: Path
) -> dict[str, Any]:
    """One check's result: run when selected and its minimum time is left of the budget, else skipped."""
    spec = next(c for c in CHECKS if c.key == key)
    left = deadline - time.monotonic() - RESERVE_S
    if args.only and key not in set(args.only.split(",")):
        return skip_result(key, "not selected (--only)")
    if left < spec.min_s[device]:
        return skip_result(
            key,
            f"time budget: {max(0.0, left):.0f} s left of {args.budget_s:.0f} s, needs {spec.min_s[device]:.0f} s",
        )
    cap = args.cap_s or spec.cap_s[device]
    return run_child(key, device, cap, left, args, work, log_dir)


def run_child(
    key: str, device: str, cap_s: float, left_s: float, args: argparse.Namespace, work: Path, log_dir: Path
) -> dict[str, Any]:
    """Run one check in a fresh process (its own session, so a timeout kills its subprocesses too) for at
    most min(cap_s, left_s) seconds. Stopped at its own cap it has failed; stopped because the budget ran out
    (left_s < cap_s) it is skipped with the reason "time budget"."""
    result_path = work / f"{key}.json"
    cmd = [sys.executable, str(SCRIPT), "--child", key, "--child-out", str(result_path), "--device", device]
    cmd += ["--records", str(args.records), "--gptq-backend", args.gptq_backend, "--work", str(work)]
    cmd += ["--quantizers", args.quantizers]
    if args.model:
        cmd += ["--model", str(Path(args.model).resolve())]
    t0 = time.monotonic()
    timed_out = False
    with open(log_dir / f"{key}.log", "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=_child_env(), start_new_session=True
        )
        try:
            proc.wait(timeout=min(cap_s, left_s))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    seconds = time.monotonic() - t0
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"name": key, "status": "running", "figure": "", "error": None, "details": {}}
    result["seconds"] = seconds
    if timed_out:
        _timed_out(result, seconds, cap_s, budget_cut=left_s < cap_s)
    elif result.get("status") == "running":
        result["status"] = "fail"
        result["error"] = f"the check process exited with {proc.returncode} before reporting: " + _tail(
            log_dir / f"{key}.log"
        )
    return result


def _child_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }


def _timed_out(result: dict[str, Any], seconds: float, cap_s: float, budget_cut: bool) -> None:
    """A check killed at its time limit: skipped when the budget cut it short, else failed."""
    if budget_cut:
        result["status"] = "skip"
        result["reason"] = (
            f"time budget: stopped after {seconds:.0f} s, what was left of the budget (the check may take "
            f"{cap_s:.0f} s); partial figures kept"
        )
    else:
        result["status"] = "fail"
        result["error"] = f"timed out after {seconds:.0f} s (the check's limit); " + (
            result.get("error") or "partial figures kept"
        )


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, chars: int = 600) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-6:])[-chars:]


def print_table(report: dict[str, Any]) -> None:
    setup_info = report.get("setup", {})
    gpus = ", ".join(report.get("gpus") or []) or "none"
    print(
        f"\ngpu_check on {report.get('device')} (GPUs: {gpus}); python {report.get('python')}, torch {report.get('torch')}"
    )
    if setup_info.get("status") != "skip":
        installed = ", ".join(setup_info.get("installed", [])) or "nothing"
        print(
            f"setup: {setup_info.get('status')}: installed {installed}"
            + (f"; {setup_info['error']}" if setup_info.get("error") else "")
        )
    print(f"{'check':<22} {'status':<6} {'s':>5}  figure / error")
    for key, r in report["checks"].items():
        label = next(c.label for c in CHECKS if c.key == key)
        note = r.get("figure") or ""
        if r["status"] == "skip":
            note = f"skipped: {r.get('reason')}" + (f"; {note}" if note else "")
        elif r.get("error"):
            note = f"{note}; ERROR {r['error']}" if note else f"ERROR {r['error']}"
        print(f"{label:<22} {r['status']:<6} {r.get('seconds', 0):5.0f}  {_one_line(note, 150)}")
        for sub, row in (r.get("details", {}).get("rows") or {}).items():
            line = row.get("figure", "") + (f"; ERROR {row['error']}" if row.get("error") else "")
            print(f"  {sub:<20} {row.get('status', '?'):<6} {'':>5}  {_one_line(line, 150)}")
    print(f"all checks pass or skip with a reason: {report.get('ok')}")


def child_main(args: argparse.Namespace) -> None:
    result = Result(args.child_out, args.child)
    t0 = time.monotonic()
    try:
        CHILDREN[args.child](args, result)
    except SkipCheck as exc:
        result.set(status="skip", reason=str(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the check's error
        traceback.print_exc()
        result.set(status="fail", error=f"{type(exc).__name__}: {exc}"[:2000])
    finally:
        if result["status"] == "running":
            result.set(status="fail", error=result["error"] or "the check ended without a verdict")
        result.detail(seconds_in_process=time.monotonic() - t0, modules=_third_party_modules())


def _third_party_modules() -> list[str]:
    """Top-level distributions this process imported (what a box must have for the check)."""
    dists = importlib.metadata.packages_distributions()
    names = {m.split(".")[0] for m in list(sys.modules)}
    return sorted({d for n in names for d in dists.get(n, [])})
