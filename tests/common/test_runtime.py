"""common.runtime: threads, devices and dtypes from one rule."""

import pytest
import torch

from llmaudit.common.errors import UserError
from llmaudit.common.runtime import (
    DeviceError,
    configure_threads,
    cpu_parallelism,
    env_threads,
    pick_device,
    resolve_dtype,
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
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) is torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16
