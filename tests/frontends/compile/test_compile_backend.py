"""Issue 10: ``torch.compile(model, backend=remat_backend(...))`` plans every compiled graph.

Gradients through the compiled plan equal eager autograd's (float64); the planned peak matches
the peak measured inside the compiled forward/backward (`CompiledStepMeter`) and by the CPU
allocator's profiler events; graph breaks share the step's budget; Inductor compiles the plan
(once, on the tiniest model: an Inductor compile takes tens of seconds here).
"""

from __future__ import annotations

import traceback

import pytest
import torch
from compiled_steps import grads, step, within
from e2e_helpers import (
    clone,
    load_example,
    max_relative_error,
    resident_bytes,
    train_step,
)
from torch import nn

from frontends.compile.backend_settings import inductor_available
from frontends.compile.compile_backend import GraphBreakError
from frontends.compile.compiled_memory import profiled_peak
from optimizer import find_graph_breaks
from optimizer.compile import remat_backend
from solvers.base import InfeasibleBudgetError
from solvers.ir.budget import BudgetError


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _allocator_peak(compiled_model: nn.Module, compiled, inputs: tuple) -> int:
    """One compiled step's peak as the CPU allocator sees it, plus the resident parameters and
    inputs (gradients cleared first, so the step allocates them again)."""
    for p in compiled_model.parameters():
        p.grad = None
    return profiled_peak(lambda: step(compiled, inputs)) + resident_bytes(compiled_model, inputs)


def _inductor_step(model: nn.Module, inputs: tuple, budget: str):
    """Compile ``model`` with Inductor through `remat_backend` at ``budget`` (greedy), run one
    step with gradients checked against eager (float64, 1e-10); the backend, the compiled
    module, its callable and the one graph's plan."""
    _, ref_grads = train_step(clone(model), inputs)
    backend = remat_backend(budget, compiler="inductor", solver="greedy")
    compiled_model = clone(model)
    compiled = torch.compile(compiled_model, backend=backend, dynamic=False)
    step(compiled, inputs)
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10
    (planned,) = backend.plans
    return backend, compiled_model, compiled, planned


def test_compiled_gpt_matches_eager_and_its_planned_peak():
    model, inputs = load_example("gpt", dropout=0.0)
    ref_out, ref_grads = train_step(clone(model), inputs)
    backend = remat_backend("70%", compiler="eager", solver="greedy")
    compiled_model = clone(model)
    compiled = torch.compile(compiled_model, backend=backend, dynamic=False)
    step(compiled, inputs)
    out = compiled(*inputs)
    assert backend.graph_breaks == 0 and len(backend.plans) == 1
    plan = backend.plans[0].plan
    assert plan.recomputed and plan.predicted_peak_bytes <= plan.budget_bytes
    assert plan.breakdown.parameters_bytes > 0  # dynamo's lifted parameters are parameters
    assert "_recomputed" in backend.plans[0].backward_graph.code
    assert torch.equal(out[0].detach(), ref_out[0])
    step(compiled, inputs)
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10

    with backend.meter.measuring() as measured:
        step(compiled, inputs)
    assert measured.resident_bytes == resident_bytes(compiled_model, inputs)
    assert within(measured.peak_bytes, plan.predicted_peak_bytes), (measured.peak_bytes, plan)
    step(compiled, inputs)  # grads exist now; the profiled step allocates them again
    by_allocator = _allocator_peak(compiled_model, compiled, inputs)
    assert within(by_allocator, plan.predicted_peak_bytes), (by_allocator, plan.predicted_peak_bytes)
    assert by_allocator < plan.store_all_peak_bytes


def test_compiled_convnet_updates_batchnorm_statistics_once():
    """Dynamo's joint graph returns the updated running stats as forward outputs: the plan
    recomputes batch norms without touching them, so buffers match eager after the step."""
    model, inputs = load_example("convnet")
    reference = clone(model)
    _, ref_grads = train_step(reference, inputs)
    backend = remat_backend("70%", compiler="eager", solver="greedy")
    compiled_model = clone(model)
    step(torch.compile(compiled_model, backend=backend, dynamic=False), inputs)
    assert backend.plans[0].plan.recomputed
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10
    for (name, got), (_, want) in zip(compiled_model.named_buffers(), reference.named_buffers()):
        assert torch.equal(got, want), name


class _Broken(nn.Module):
    """Two MLP halves with a graph break between them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
        self.second = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                                    nn.Linear(256, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        torch._dynamo.graph_break()
        return self.second(h).square().mean()


def test_graph_breaks_share_the_step_budget():
    model, x = _Broken().double(), torch.randn(256, 32, dtype=torch.float64)
    report = find_graph_breaks(clone(model), x)
    assert (report.graphs, report.graph_breaks) == (2, 1) and report.reasons
    torch._dynamo.reset()
    _, ref_grads = train_step(clone(model), (x,))
    budget = 6_200_000  # the first graph fits as plain autograd; the second must recompute
    backend = remat_backend(budget, compiler="eager", solver="greedy")
    compiled_model = clone(model)
    compiled = torch.compile(compiled_model, backend=backend, dynamic=False)
    step(compiled, (x,))
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10
    assert backend.graph_breaks == 1 and len(backend.plans) == 2
    first, second = backend.plans
    held = first.footprint.parameters_bytes + first.footprint.inputs_bytes + first.footprint.saved_bytes
    assert first.budget_bytes == budget and second.budget_bytes == budget - held
    assert not first.plan.recomputed and second.plan.recomputed
    assert second.plan.predicted_peak_bytes <= budget - held
    summary = backend.summary()
    assert summary.graph_breaks == 1 and not summary.exact
    with backend.meter.measuring() as measured:
        step(compiled, (x,))
    assert max(p.plan.predicted_peak_bytes for p in backend.plans) < measured.peak_bytes <= budget
    # The split's bound holds, but no longer proves the fit: it adds the second graph's parameters
    # and gradients to the first graph's whole peak, which now keeps the gradient arriving from
    # the second graph (its tangent) to the end of its backward, as autograd does (measured
    # 5,912,608 B against a bound of 6,438,928 B; before tangents were held, the bound was 2% off).
    assert measured.peak_bytes <= summary.predicted_step_peak_bytes
    assert not summary.fits


def test_fullgraph_refuses_a_graph_break():
    model, x = _Broken().double(), torch.randn(256, 32, dtype=torch.float64)
    compiled = torch.compile(model, backend=remat_backend("90%", compiler="eager", fullgraph=True,
                                                          solver="greedy"), dynamic=False)
    with pytest.raises(GraphBreakError, match="fullgraph=True"):
        step(compiled, (x,))


def test_a_too_small_budget_reaches_the_user_as_remat_opts_own_error():
    """Dynamo would wrap it in BackendCompilerFailed under its whole stack; the user sees the
    InfeasibleBudgetError itself, one line, with a traceback that stops at the backend."""
    from torch._dynamo.exc import BackendCompilerFailed

    model, x = _Tiny().double(), torch.randn(512, 16, dtype=torch.float64)
    compiled = torch.compile(model, backend=remat_backend(10_000, compiler="eager", solver="greedy"),
                             dynamic=False)
    with pytest.raises(InfeasibleBudgetError, match="no schedule fits a budget of 10000 bytes") as info:
        step(compiled, (x,))
    assert not isinstance(info.value, BackendCompilerFailed)
    assert info.value.budget_bytes == 10_000 and "\n" not in str(info.value)
    frames = [f.filename for f in traceback.extract_tb(info.value.__traceback__)]
    assert not any("_functorch" in f or "_inductor" in f or "convert_frame" in f for f in frames), frames


@pytest.mark.parametrize("kwargs, error, message", [
    ({"budget": "lots"}, BudgetError, "invalid budget"),
    ({"budget": "-5%"}, BudgetError, "must be positive"),
    ({"budget": "1GB", "compiler": "tvm"}, ValueError, "unknown compiler"),
    ({"budget": "1GB", "solver": "magic"}, ValueError, "unknown solver"),
    ({"budget": "1GB", "cost_model": "profile"}, ValueError, "roofline"),
    ({"budget": "1GB", "cost_model": "roofline:abacus"}, ValueError, "abacus"),
])
def test_bad_arguments_fail_before_compiling(kwargs, error, message):
    with pytest.raises(error, match=message):
        remat_backend(**kwargs)


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).square().mean()


@pytest.mark.skipif(not inductor_available(), reason="Inductor needs a C++ compiler")
def test_inductor_compiles_the_plan_and_predicts_the_compiled_peak():
    """The plan (unfused aten ops) bounds the compiled step from above; the prediction read
    from Inductor's buffer plan (fusion, buffer reuse) is the compiled step's peak."""
    model, x = _Tiny().double(), torch.randn(512, 16, dtype=torch.float64)
    backend, compiled_model, compiled, planned = _inductor_step(model, (x,), "80%")
    assert planned.plan.recomputed  # Inductor ran our partition, not its min-cut
    assert planned.compiled_peak is not None
    predicted = planned.predicted_peak_bytes
    assert backend.summary().predicted_step_peak_bytes == predicted
    measured = _allocator_peak(compiled_model, compiled, (x,))
    assert abs(measured - predicted) <= 0.02 * predicted, (measured, predicted)
    # Fusion and reuse make the compiled step much smaller than the unfused plan says (85% here
    # since the backend CSEs the joint graph as torch's partitioners do; 79% before).
    assert predicted < 0.9 * planned.plan.predicted_peak_bytes


def test_a_forward_op_after_backward_ops_is_moved_first():
    """Inductor's joint passes can leave a forward op after backward ones; the exact solvers'
    data refused such graphs with a deep ValueError on the infeasible-budget path (GPT at 50%).
    `forward_ops_first` moves it before every backward op, and the bound is computed."""
    from frontends.compile.dynamo_joint import forward_ops_first
    from solvers.checkmate.data import prepare
    from solvers.ir.graph import Node, NodeKind, Phase, RematGraph

    f, b = Phase.FORWARD, Phase.BACKWARD

    def op(name, phase, size, inputs):
        return Node(name, NodeKind.OP, phase, size, inputs, group=name, cost=1.0)

    graph = RematGraph((
        Node("x", NodeKind.INPUT, f, 8), op("a", f, 100, ("x",)), op("loss", f, 8, ("a",)),
        Node("t", NodeKind.TANGENT, b, 8), op("da", b, 100, ("t", "a")),
        op("late", f, 100, ("x",)), op("dx", b, 8, ("da", "late")),
    ), ("loss",), ("loss",), ("dx",))
    with pytest.raises(ValueError, match="forward op groups must all come before"):
        prepare(graph)
    ordered = forward_ops_first(graph)
    assert [n.name for n in ordered.nodes] == ["x", "a", "loss", "late", "t", "da", "dx"]
    prepare(ordered)
    assert forward_ops_first(ordered) is ordered


class _Attention(nn.Module):
    """SDPA and a strided convolution: Inductor runs both as extern kernels whose calls allocate
    workspace the buffer plan does not name (CPU SDPA's backward, float64 im2col)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Conv2d(3, 32, 4, stride=4)
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(x).view(x.shape[0], x.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        y = nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape)
        return self.out(torch.tanh(y)).square().mean()


@pytest.mark.skipif(not inductor_available(), reason="Inductor needs a C++ compiler")
def test_inductor_prediction_counts_the_workspace_of_extern_kernels():
    """The compiled peak predicted from Inductor's buffer plan plus each extern kernel's measured
    call (outputs and workspace) is the peak the CPU allocator sees, to the loss's seed gradient
    (without the kernels' workspace the ViT example was 299,784 B low: over its budget)."""
    model, images = _Attention().double(), torch.randn(8, 3, 32, 32, dtype=torch.float64)
    _, compiled_model, compiled, planned = _inductor_step(model, (images,), "100%")
    assert planned.compiled_peak is not None and not planned.compiled_peak.unmeasured_kernels
    measured = _allocator_peak(compiled_model, compiled, (images,))
    assert 0 <= measured - planned.predicted_peak_bytes <= 64, (measured, planned.compiled_peak)


def test_the_partitioners_cache_key_hashes_the_planning_code_and_the_settings():
    """Inductor's FX graph cache asks ``custom_partitioner_fn.uuid()`` for its key: it must be
    computable (it read files that had moved: FileNotFoundError) and change with what a plan
    depends on."""
    key = remat_backend("90%", compiler="eager").partitioner().uuid()
    assert key == remat_backend("90%", compiler="eager").partitioner().uuid()
    assert key != remat_backend("80%", compiler="eager").partitioner().uuid()
    assert key != remat_backend("90%", compiler="eager", solver="greedy").partitioner().uuid()
