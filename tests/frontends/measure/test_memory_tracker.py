"""The tracker counts live storages exactly: each once, freed ones leave, backward included."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from frontends.measure.memory_tracker import MemoryMeasurement, track_live_memory

MB = 1_000_000
FLOATS_PER_MB = MB // 4


def test_three_megabytes_live_at_most() -> None:
    with track_live_memory() as m:
        a = torch.empty(FLOATS_PER_MB)
        b = torch.empty(FLOATS_PER_MB)
        c = torch.empty(FLOATS_PER_MB)
        del b
        d = torch.empty(FLOATS_PER_MB)
        del a
    assert m.result == MemoryMeasurement(peak_bytes=3 * MB, final_live_bytes=2 * MB)
    assert c.numel() + d.numel() == 2 * FLOATS_PER_MB


def test_views_share_their_base_storage() -> None:
    with track_live_memory() as m:
        x = torch.zeros(1000, 250)
        views = [x.view(250, 1000), x[::2], x.t(), x.detach(), x.reshape(-1), x[0], x.unsqueeze(0)]
        x.add_(1)  # in place: same storage
    assert m.result.peak_bytes == 1000 * 250 * 4
    assert m.result.final_live_bytes == 1000 * 250 * 4
    assert len(views) == 7


def test_preexisting_tensors_are_not_counted() -> None:
    weight = torch.randn(100, 100)
    with track_live_memory() as m:
        weight.mul_(2)  # in-place update of a pre-existing storage
        torch.mul(weight, 3, out=weight)
        alias = weight.view(-1)
        y = weight @ weight  # only the new 100x100 result counts
    assert m.result.peak_bytes == 100 * 100 * 4
    assert alias.numel() == y.numel()


def test_reused_addresses_are_not_confused() -> None:
    # Each new tensor is allocated before the previous one is released, often at the same address.
    with track_live_memory() as m:
        t = torch.empty(1000)
        for _ in range(50):
            t = torch.empty(1000)
        del t
    assert m.result == MemoryMeasurement(peak_bytes=2 * 4000, final_live_bytes=0)


def test_in_place_resize_updates_bytes() -> None:
    with track_live_memory() as m:
        t = torch.empty(10)
        t.resize_(1000)
    assert m.result.peak_bytes == 4000
    assert m.result.final_live_bytes == 4000


def test_backward_allocations_and_loss_seed_are_seen() -> None:
    n = 1000
    x = torch.randn(n, requires_grad=True)
    with track_live_memory() as m:
        loss = (x * 2).sum()
        loss.backward()
    # Forward: x*2 (4n) and loss (4), then x*2 dies. Backward: the ones_like seed of the loss
    # gradient (4, held by torch.autograd.backward until it returns) and MulBackward's grad*2 (4n),
    # which becomes x.grad. Without seeing ones_like the peak would be 4n + 4.
    assert m.result.peak_bytes == 4 * n + 8
    assert m.result.final_live_bytes == 4 * n + 4  # x.grad and loss
    assert x.grad is not None


def test_linear_chain_peak_matches_hand_count() -> None:
    torch.manual_seed(0)
    batch, width = 256, 32
    model = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
        nn.Linear(width, width),
    )
    x = torch.randn(batch, width)
    act = batch * width * 4  # one activation (or activation gradient)
    weight, bias = width * width * 4, width * 4
    grads = sum(p.numel() * p.element_size() for p in model.parameters())

    with track_live_memory() as fwd:
        model(x).sum()
    # Forward peak: both ReLU outputs (saved), the last Linear's output and the 4-byte loss.
    assert fwd.result.peak_bytes == 3 * act + 4

    with track_live_memory() as step:
        loss = model(x).sum()
        loss.backward()
        del loss
    saved = 2 * act  # what forward keeps for backward: the two ReLU outputs
    # Peak at the second ReLU's backward: saved activations, the last Linear's input gradient,
    # its weight and bias gradients, the ReLU's output gradient, the loss and its ones seed.
    assert step.result.peak_bytes == saved + act + weight + bias + act + 8
    assert step.result.peak_bytes > saved
    assert step.result.peak_bytes > fwd.result.peak_bytes
    # Everything but the freshly created parameter gradients has been freed.
    assert step.result.final_live_bytes == grads


def test_backward_on_another_thread_is_tracked_by_that_threads_tracker() -> None:
    x = torch.randn(1000, requires_grad=True)
    results: list[MemoryMeasurement] = []

    def work() -> None:
        with track_live_memory() as m:
            (x * 3).sum().backward()
        results.append(m.result)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert results[0].peak_bytes == 4 * 1000 + 8


def test_result_only_after_exit_and_single_use() -> None:
    tracker = track_live_memory()
    with tracker as m:
        with pytest.raises(RuntimeError, match="after the 'with' block"):
            _ = m.result
    with pytest.raises(RuntimeError, match="entered once"):
        with tracker:
            pass


def test_result_available_after_exception() -> None:
    with pytest.raises(ZeroDivisionError):
        with track_live_memory() as m:
            keep = torch.empty(250)
            1 / 0
    assert m.result.peak_bytes == 1000
    assert keep.numel() == 250


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_storages_and_backward() -> None:
    with track_live_memory() as m:
        a = torch.empty(FLOATS_PER_MB, device="cuda")
        b = torch.empty(FLOATS_PER_MB, device="cuda")
        c = torch.empty(FLOATS_PER_MB, device="cuda")
        del b
        d = torch.empty(FLOATS_PER_MB, device="cuda")
    assert m.result.peak_bytes == 3 * MB
    assert a.is_cuda and c.is_cuda and d.is_cuda

    x = torch.randn(1000, device="cuda", requires_grad=True)
    with track_live_memory() as m2:
        (x * 2).sum().backward()  # backward runs on the CUDA device thread
    assert m2.result.peak_bytes == 4 * 1000 + 8
