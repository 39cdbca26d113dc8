"""Fine-tuning in row slices (train.token_budget): the same optimizer step as the whole batch, bounded memory."""

from __future__ import annotations

import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from llmaudit.common import memory
from llmaudit.common.memory import peak_rss_mib, release_memory, rss_mib
from llmaudit.data.tokenize import collate
from llmaudit.models.training import (
    CPU_ACTIVATION_BYTES,
    TrainSettings,
    _plain_step,
    activation_bytes_per_token,
    batch_mean_nll,
    row_slices,
    summed_nll,
    train_token_budget,
)
from tests.tiny_models import tiny_causal_lm


@pytest.mark.parametrize(
    ("rows", "width", "budget"), [(8, 192, 1024), (8, 192, 970), (7, 150, 1024), (5, 300, 200), (3, 10, 64), (1, 9, 8)]
)
def test_row_slices_cover_the_batch_within_the_budget(rows, width, budget):
    slices = row_slices(rows, width, budget)
    assert slices[0][0] == 0 and slices[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:]))  # contiguous, disjoint
    sizes = [hi - lo for lo, hi in slices]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1  # as even as possible
    for size in sizes:  # within the budget, or one row wider than it on its own
        assert size * width <= budget or size == 1
    assert len(slices) == np.ceil(rows / max(1, budget // width))  # no more slices than the budget needs


def test_one_slice_when_the_batch_fits_or_no_budget():
    assert row_slices(8, 128, 1024) == [(0, 8)]
    assert row_slices(8, 4096, None) == [(0, 8)]


def test_default_budget_from_the_model_sizes():
    smollm2 = types.SimpleNamespace(num_hidden_layers=30, hidden_size=576, intermediate_size=1536)
    assert activation_bytes_per_token(smollm2) == 4 * 30 * (8 * 576 + 6 * 1536)
    cpu = train_token_budget(None, "cpu", smollm2)
    assert cpu == CPU_ACTIVATION_BYTES // activation_bytes_per_token(smollm2) == 970
    assert row_slices(8, 192, cpu) == [(0, 4), (4, 8)]  # the verdict recipe's batches: two halves
    assert train_token_budget(None, "cuda", smollm2) is None  # a GPU computes the whole batch
    assert train_token_budget(512, "cuda", smollm2) == 512  # the recipe's value wins everywhere
    assert train_token_budget(None, "cpu", types.SimpleNamespace()) is None  # sizes unknown: the whole batch
    demo = types.SimpleNamespace(num_hidden_layers=2, hidden_size=96, intermediate_size=192)
    assert train_token_budget(None, "cpu", demo) > 8 * 256  # the demo's batches are never cut


def _examples(seed: int = 0) -> list[tuple[list[int], list[bool]]]:
    rng = np.random.default_rng(seed)
    out = []
    for length in (23, 9, 31, 17, 12, 28):
        ids = rng.integers(1, 500, size=length).tolist()
        mask = [i >= length // 3 for i in range(length)]  # a prompt that is not scored, then the answer
        out.append((ids, mask))
    return out


def _step(budget: int | None) -> tuple[torch.nn.Module, float, int, int]:
    model = tiny_causal_lm(seed=3)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # linear in the gradient (Adam's first step is its sign)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    settings = TrainSettings(epochs=1, batch_size=6, lr=1e-3, seed=0, pad_id=0, progress=False, token_budget=budget)
    loss, tokens, padded = _plain_step(model, _examples(), optimizer, scheduler, settings, np.arange(6))
    return model, loss, tokens, padded


def test_a_step_in_slices_is_the_whole_batch_step():
    whole, loss, tokens, padded = _step(None)
    for budget in (64, 100):  # 6 slices of one row; 3 slices of two
        sliced, loss_s, tokens_s, padded_s = _step(budget)
        assert loss_s == pytest.approx(loss, rel=1e-6)
        assert tokens_s == tokens == sum(len(ids) for ids, _ in _examples())
        assert padded_s < padded == 6 * 31  # each slice is cut to its own longest row
        for (name, a), b in zip(whole.named_parameters(), sliced.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=f"{name} after a step in slices of {budget}")
    untouched = tiny_causal_lm(seed=3)
    moved = [(p - q).abs().max() for p, q in zip(whole.parameters(), untouched.parameters())]
    assert max(moved) > 1e-3  # the step did move the weights: the comparison above is not vacuous


def test_a_sliced_step_differentiates_the_batch_mean():
    """The gradient accumulated over slices equals the gradient of the whole batch's mean NLL."""
    model = tiny_causal_lm(seed=5)
    examples = _examples(1)
    ids, attn, mask = collate(examples, 0)
    batch_mean_nll(model, ids, attn, mask).backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    n_scored = int(mask[:, 1:].sum())
    for lo, hi in row_slices(len(examples), ids.shape[1], 40):
        (summed_nll(model, ids[lo:hi], attn[lo:hi], mask[lo:hi]) / n_scored).backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-7)


def test_peak_memory_is_this_process_s_own_after_exec():
    """getrusage's maximum survives exec; the peak reported is the new process's own (VmHWM)."""
    if rss_mib() is None:
        pytest.skip("needs /proc")
    parent = (
        "import subprocess, sys, torch\n"
        "big = torch.ones(1500 * 2**20, dtype=torch.uint8)\n"  # the parent holds 1.5 GiB when it starts the child
        "child = 'from llmaudit.common.memory import peak_rss_mib; print(round(peak_rss_mib()))'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True, check=True).stdout)\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, check=True).stdout
    assert int(out.split()[-1]) < 1000  # the child's own peak, not the parent's 1.5 GiB and more


def test_memory_readings():
    assert peak_rss_mib() > 0
    now = rss_mib()
    if now is not None:  # Linux
        assert 0 < now <= peak_rss_mib() + 1
    assert isinstance(release_memory(), bool)


def test_release_memory_hands_freed_heap_back_on_glibc():
    """Blocks below glibc's mmap threshold stay in its heap when freed; release_memory returns them."""
    if rss_mib() is None or not release_memory():
        pytest.skip("needs /proc and glibc's malloc_trim")
    big = torch.empty(16 * 2**20, dtype=torch.uint8)  # freeing a 16 MiB mmapped block raises the threshold to 16 MiB
    del big
    blocks = [torch.ones(2**20, dtype=torch.uint8) for _ in range(300)]  # 300 MiB of 1 MiB blocks, now in the heap
    keep = torch.ones(64, dtype=torch.uint8)  # noqa: F841  a live block after them: the heap cannot shrink by itself
    held = rss_mib()
    del blocks
    before = rss_mib()
    release_memory()
    after = rss_mib()
    assert held - after > 200, (held, before, after)


def test_bounded_heap_maps_large_blocks_within_and_restores_the_ceiling_after(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "bound_allocator", lambda threshold: calls.append(threshold) or True)
    with memory.bounded_heap(False):
        pass
    assert calls == []  # inactive: the allocator is left alone
    with pytest.raises(RuntimeError), memory.bounded_heap(True):
        assert calls == [memory.MMAP_THRESHOLD]
        raise RuntimeError("a unit that fails")
    assert calls == [memory.MMAP_THRESHOLD, memory.DYNAMIC_CEILING]  # restored on the way out, even after a failure


def test_bound_allocator_is_accepted_by_glibc():
    if not release_memory():
        pytest.skip("needs glibc")
    assert memory.bound_allocator(memory.MMAP_THRESHOLD) is True
    assert memory.bound_allocator(memory.DYNAMIC_CEILING) is True


def test_importing_gptqmodel_keeps_no_frame_of_its_caller():
    """gptqmodel keeps a traceback from its import; imported in a thread of its own, it holds none of the caller's
    frames (which held whole model copies). Checked in a fresh interpreter, where gptqmodel is not imported yet."""
    script = (
        "import gc, types\n"
        "def caller():\n"
        "    model_copy = bytearray(10)\n"
        "    from llmaudit.models.loading import import_gptqmodel_quietly\n"
        "    import_gptqmodel_quietly()\n"
        "caller()\n"
        "gc.collect()\n"
        "import sys\n"
        "print('imported' if 'gptqmodel' in sys.modules else 'absent')\n"
        "print(sum(isinstance(o, types.FrameType) and o.f_code.co_name == 'caller' for o in gc.get_objects()))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.split()
    if out[-2] != "imported":
        pytest.skip("gptqmodel is not installed")
    assert out[-1] == "0"


def test_a_failing_gptqmodel_import_still_raises_with_its_output(monkeypatch):
    import builtins

    from llmaudit.models import loading

    real_import = builtins.__import__

    def failing(name, *args, **kwargs):
        if name == "gptqmodel":
            print("banner before the failure")
            raise RuntimeError("no kernels")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "gptqmodel", raising=False)
    monkeypatch.delenv("LLMAUDIT_LOG", raising=False)
    monkeypatch.setattr(loading.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(builtins, "__import__", failing)
    with pytest.raises(ImportError, match="no kernels") as caught:
        loading.import_gptqmodel_quietly()
    assert "banner before the failure" in str(caught.value)
