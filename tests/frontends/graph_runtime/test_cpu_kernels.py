"""The graph runtime's CPU dropout kernels compute aten's values bit for bit, draw the same
random numbers, and are what a rewritten CPU graph runs (with gradients equal to eager's)."""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import clone, load_example, max_relative_error, train_step

from frontends.graph_runtime.cpu_kernels import cpu_kernel, native_dropout_backward_cpu, native_dropout_cpu
from frontends.graph_runtime.rng_replay import replay
from optimizer import optimize

aten = torch.ops.aten


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_dropout_matches_aten_bitwise_and_draws_the_same_numbers(dtype, p):
    x = torch.randn(3, 5, 64, dtype=dtype)
    grad = torch.randn_like(x)
    torch.manual_seed(7)
    want, want_mask = aten.native_dropout(x, p, True)
    after_aten = torch.rand(4)
    torch.manual_seed(7)
    got, got_mask = native_dropout_cpu(x, p, True)
    after_ours = torch.rand(4)
    assert got.dtype == want.dtype and got_mask.dtype == want_mask.dtype == torch.bool
    assert torch.equal(got_mask, want_mask)
    assert torch.equal(got, want)
    assert torch.equal(after_ours, after_aten)  # the generator moved by the same draws
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    assert torch.equal(native_dropout_backward_cpu(grad, want_mask, scale),
                       aten.native_dropout_backward(grad, want_mask, scale))


def test_evaluation_mode_is_the_identity_with_a_full_mask():
    x = torch.randn(4, 4)
    got, mask = native_dropout_cpu(x, 0.3, False)
    assert torch.equal(got, x) and bool(mask.all())


def test_rewritten_cpu_graph_runs_the_replacements_and_trains_like_eager():
    """examples/gpt.py with dropout 0.1 at 60%: dropout is recomputed (replayed) in backward
    through the replacement, and the gradients equal plain autograd's under the same seed."""
    model, inputs = load_example("gpt", dropout=0.1)
    remat = optimize(clone(model), inputs, "60%", solver="greedy")
    forward_targets = [n.target for n in remat.forward_graph.graph.nodes]
    backward_nodes = list(remat.backward_graph.graph.nodes)
    assert torch.ops.remat_opt.native_dropout_cpu.default in forward_targets
    assert any(n.target is torch.ops.remat_opt.native_dropout_backward_cpu.default for n in backward_nodes)
    assert any(n.target is replay and n.args[2] is torch.ops.remat_opt.native_dropout_cpu.default
               for n in backward_nodes)  # a recomputed dropout replays the replacement
    assert aten.native_dropout.default not in forward_targets

    torch.manual_seed(1)
    _, want = train_step(clone(model), inputs)
    torch.manual_seed(1)
    _, got = train_step(remat, inputs)
    assert max_relative_error(got, want) < 1e-10


def test_only_cpu_values_are_replaced():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    node = graph.call_function(aten.native_dropout.default, (x, 0.1, True))
    node.meta["val"] = (torch.empty(2, device="meta"), torch.empty(2, device="meta", dtype=torch.bool))
    assert cpu_kernel(node) is aten.native_dropout.default
    node.meta["val"] = (torch.empty(2), torch.empty(2, dtype=torch.bool))
    assert cpu_kernel(node) is torch.ops.remat_opt.native_dropout_cpu.default
