"""Offloaded regions in the eager runtime: saved activations go to host and gradients do not change."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from e2e_helpers import load_example, loss_of, max_relative_error, small_mlp
from torch import nn

from frontends.eager_runtime.eager_checkpoint import CheckpointPlanError, remove_checkpointing
from frontends.eager_runtime.eager_offload import (
    OffloadedForward,
    OffloadSession,
    apply_offloading,
    offloaded_modules,
    offloaded_saved_tensors,
    run_offloaded,
)


def _grads(module: nn.Module, inputs: tuple, seed: int = 0) -> dict[str, torch.Tensor]:
    module.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss_of(module(*inputs)).backward()
    return {n: p.grad.clone() for n, p in module.named_parameters()}


class Probe(nn.Module):
    """``sin(x @ w)`` that remembers (weakly) the matmul's output, which ``sin`` saves, and saves
    a view of it beside it (``mul`` saves both of its inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16, dtype=torch.float64))
        self.seen: weakref.ref | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x @ self.w
        self.seen = weakref.ref(h)
        return (h.sin() * h.t().t()).sum()


def test_run_offloaded_gives_plain_gradients_and_keeps_weights_on_device():
    model, inputs = small_mlp()
    model, inputs = model.double(), tuple(t.double() for t in inputs)
    reference = _grads(copy.deepcopy(model), inputs)
    model.zero_grad(set_to_none=True)
    resident = list(model.parameters())
    with offloaded_saved_tensors(resident) as counts:
        loss = model(*inputs)
    loss.backward()
    assert counts.tensors > 0 and counts.host_bytes > 0
    assert counts.kept_on_device > 0  # the layers' weights, saved by their matmuls
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert max_relative_error(grads, reference) <= 1e-10


def test_the_device_activation_is_dropped_and_one_storage_is_copied_once():
    torch.manual_seed(0)
    plain, offloaded = Probe(), Probe()
    offloaded.load_state_dict(plain.state_dict())
    x = torch.randn(32, 16, dtype=torch.float64)
    plain_loss = plain(x)
    gc.collect()
    assert plain.seen() is not None  # plain autograd holds the matmul's output for backward
    with offloaded_saved_tensors([offloaded.w]) as counts:
        loss = offloaded(x)
    gc.collect()
    assert offloaded.seen() is None, "the offloaded activation is still held on the device"
    # saved: x (by the matmul), h (by sin), sin(h) and a view of h (by mul): h's storage is copied once
    assert counts.tensors == 4 and counts.host_bytes == 3 * 32 * 16 * 8
    loss.backward()
    plain_loss.backward()
    assert torch.equal(loss, plain_loss)
    assert max_relative_error({"w": offloaded.w.grad}, {"w": plain.w.grad}) <= 1e-10


def test_apply_offloading_on_gpt_blocks_with_dropout_gives_plain_gradients():
    model, inputs = load_example("gpt", dropout=0.1)
    reference = _grads(copy.deepcopy(model), inputs, seed=3)
    blocks = [p for p, m in model.named_modules() if p.startswith("blocks.") and p.count(".") == 1]
    assert apply_offloading(model, blocks) == len(blocks) >= 2
    assert offloaded_modules(model) == tuple(blocks)
    grads = _grads(model, inputs, seed=3)  # same seed: the dropout masks are the same
    assert max_relative_error(grads, reference) <= 1e-10
    clone = copy.deepcopy(model)  # the wrappers refer to their module: a copy offloads its own
    assert offloaded_modules(clone) == tuple(blocks)
    assert max_relative_error(_grads(clone, inputs, seed=3), reference) <= 1e-10
    assert remove_checkpointing(model) == len(blocks) and offloaded_modules(model) == ()
    assert not any(isinstance(m.__dict__.get("forward"), OffloadedForward) for m in model.modules())


def test_a_saved_tensor_held_outside_the_region_is_read_on_the_device_not_copied_back():
    torch.manual_seed(0)
    w = torch.randn(16, 16, dtype=torch.float64, requires_grad=True)
    x = torch.randn(8, 16, dtype=torch.float64)
    h = x @ w  # the caller keeps h through backward
    session = OffloadSession()
    with offloaded_saved_tensors((), session, prefetch=False):
        inside = h.sin()  # saves h: copied to host all the same
    inside.sum().backward()
    assert torch.allclose(w.grad, x.t() @ h.detach().cos(), rtol=1e-12, atol=0)
    assert session.counts.host_bytes == 8 * 16 * 8 and session.counts.read_on_device == 1
    assert session.counts.reloaded_bytes == 0


def test_the_first_unpack_of_a_region_brings_back_the_region_before_it_when_it_prefetches():
    torch.manual_seed(0)
    w = torch.randn(16, 16, dtype=torch.float64, requires_grad=True)
    x = torch.randn(8, 16, dtype=torch.float64)
    for prefetch, reloaded_at_first_unpack in ((True, 2), (False, 1)):
        session = OffloadSession()
        with offloaded_saved_tensors((), session, prefetch=prefetch):
            a = (x @ w).sin()  # saves x @ w
        with offloaded_saved_tensors((), session):
            b = (a * 2).sin()  # saves its input (a * 2), which nothing else holds
        seen = []

        def hook(grad, seen=seen, session=session):
            seen.append(session.counts.reloaded_bytes)
            return grad

        a.register_hook(hook)  # runs after the second region's backward, before the first's
        b.sum().backward()
        assert seen == [reloaded_at_first_unpack * 8 * 16 * 8]
        assert session.counts.reloaded_bytes == 2 * 8 * 16 * 8


def test_run_offloaded_and_bad_paths():
    torch.manual_seed(0)
    probe = Probe()
    x = torch.randn(8, 16, dtype=torch.float64)
    run_offloaded(probe, x).backward()
    gc.collect()
    assert probe.w.grad is not None and probe.seen() is None
    with pytest.raises(CheckpointPlanError, match="'nope', which this model does not have"):
        apply_offloading(probe, ["nope"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stream path needs a GPU")
def test_offloaded_region_on_cuda_gives_plain_gradients():
    model, inputs = small_mlp()
    model, inputs = model.double().cuda(), tuple(t.double().cuda() for t in inputs)
    reference = _grads(copy.deepcopy(model), inputs)
    model.zero_grad(set_to_none=True)
    run_offloaded(model, *inputs).backward()
    assert max_relative_error({n: p.grad for n, p in model.named_parameters()}, reference) <= 1e-10
