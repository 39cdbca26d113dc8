"""common.runtime: threads, devices and dtypes from one rule."""

import pytest
import torch

from llmaudit.common.errors import UserError
from llmaudit.common.runtime import (
    BF16_MIN_SPEEDUP,
    DeviceError,
    choose_compute_dtype,
    configure_threads,
    cpu_parallelism,
    cpu_signature,
    env_threads,
    legacy_dtype,
    matmul_probe,
    matmul_rates,
    pick_device,
    resolve_dtype,
    threads_per_process,
    torch_threads,
)


def test_threads_follow_the_environment_then_the_model_size(monkeypatch):
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("LLMAUDIT_THREADS", "1")
        assert env_threads() == 1 and configure_threads(tiny_model=False) == 1 and cpu_parallelism() == 1
        monkeypatch.delenv("LLMAUDIT_THREADS")
        assert configure_threads(tiny_model=True) == 1
        monkeypatch.setenv("LLMAUDIT_THREADS", "two")
        with pytest.raises(UserError, match="LLMAUDIT_THREADS"):
            env_threads()
    finally:
        torch.set_num_threads(before)


def test_local_processes_divide_the_cores_among_them(monkeypatch):
    monkeypatch.setenv("LLMAUDIT_THREADS", "8")
    assert [threads_per_process(n) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]  # at least one thread each
    monkeypatch.delenv("LLMAUDIT_THREADS")
    assert threads_per_process(1) == cpu_parallelism()


def test_torch_threads_restores_the_callers_count():
    before = torch.get_num_threads()
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with torch_threads(None):
        assert torch.get_num_threads() == before


def test_devices_and_dtypes():
    assert pick_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA GPU"):
            pick_device("cuda")
        assert issubclass(DeviceError, UserError)
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16
    assert legacy_dtype("auto", torch.device("cpu")) is torch.float32  # the rule of stores made before 0.3


def _fake_probe(speedup):
    return lambda: {"bf16_speedup": speedup, "cpu": "Test CPU", "flags": "avx512f", "measured": "today"}


def test_auto_picks_bf16_only_where_this_cpu_measured_it_faster():
    cpu = torch.device("cpu")
    fast = choose_compute_dtype("auto", cpu, probe=_fake_probe(2.55))
    assert fast.dtype is torch.bfloat16 and "2.55x" in fast.reason and "Test CPU" in fast.reason
    slow = choose_compute_dtype("auto", cpu, probe=_fake_probe(0.17))  # a CPU without AVX512-BF16 / AMX
    assert slow.dtype is torch.float32 and "0.17x" in slow.reason
    edge = choose_compute_dtype("auto", cpu, probe=_fake_probe(BF16_MIN_SPEEDUP - 0.01))
    assert edge.dtype is torch.float32
    assert choose_compute_dtype("bfloat16", cpu, probe=_fake_probe(0.1)).dtype is torch.bfloat16  # asked for
    with pytest.raises(UserError, match="not one of"):
        choose_compute_dtype("float64", cpu)


def test_the_matmul_probe_is_measured_once_per_machine_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMAUDIT_CACHE", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return {"float32_gflops": 75.0, "bfloat16_gflops": 191.0}

    first = matmul_probe(measure=measure)
    second = matmul_probe(measure=measure)
    assert len(calls) == 1 and first == second
    assert first["bf16_speedup"] == pytest.approx(191 / 75) and first["cpu"] == cpu_signature()["cpu"]
    (cached,) = (tmp_path / "machine").glob("matmul-*.json")
    cached.write_text("{broken")  # a damaged cache is measured again, never trusted
    assert matmul_probe(measure=measure)["bf16_speedup"] == pytest.approx(191 / 75) and len(calls) == 2


def test_matmul_rates_measure_both_dtypes():
    rates = matmul_rates(shape=(64, 32, 48), rounds=1)
    assert set(rates) == {"float32_gflops", "bfloat16_gflops"} and all(v > 0 for v in rates.values())
