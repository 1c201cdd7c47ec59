"""Offload through the compile backend (issue 39): ``remat_backend(..., offload="auto")``.

The backend plans each joint graph with keep / recompute / offload (`plan_graph`) and the
rewrite puts the copies into the compiled forward and backward (`frontends.graph_runtime.offload_ops`).
On the CPU the "host" is the same memory: the meter counts the host copies in a ledger of their
own, so the device peak it measures is the plan's, and the host peak is the plan's host pool.
"""

from __future__ import annotations

import pytest
import torch
from compiled_steps import grads, step, within
from e2e_helpers import clone, load_example, max_relative_error, resident_bytes, train_step

from frontends.compile.backend_settings import OFFLOAD_NEEDS_EAGER
from frontends.graph_runtime import offload_ops
from optimizer.compile import remat_backend
from solvers.planning.planner import plan_graph


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_gpt(device: str = "cpu"):
    """examples/gpt (no dropout, float64) compiled with offload at 70% (greedy, PCIe Gen4), one
    step run with gradients checked against eager; the backend, the compiled module and callable."""
    model, inputs = load_example("gpt", dropout=0.0)
    model, inputs = model.to(device), tuple(t.to(device) for t in inputs)
    _, ref_grads = train_step(clone(model), inputs)
    backend = remat_backend("70%", compiler="eager", solver="greedy", offload="auto", link="pcie4")
    compiled_model = clone(model)
    compiled = torch.compile(compiled_model, backend=backend, dynamic=False)
    step(compiled, inputs)
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10
    return backend, compiled_model, compiled, inputs, ref_grads


def test_compiled_gpt_offloads_as_planned_with_eager_gradients_and_the_planned_peaks():
    backend, compiled_model, compiled, inputs, ref_grads = _compiled_gpt()
    (planned,) = backend.plans
    plan = planned.plan
    offloaded = {value for value, _ in plan.offloaded}
    assert offloaded and plan.predicted_peak_bytes <= plan.budget_bytes
    made = {n.name.removesuffix("_offloaded") for gm in (planned.forward_graph, planned.backward_graph)
            for n in gm.graph.nodes if n.target is offload_ops.offload_done}
    assert made == offloaded  # the compiled graphs make exactly the plan's copies
    saved = {a.name for a in planned.forward_graph.graph.find_nodes(op="output")[0].args[0] if a is not None}
    across = {v for v in offloaded if f"{v}_offloaded" in saved}
    assert across and not across & saved  # forward hands backward the host copy, not the device value
    assert planned.backward_graph.code.count("reload_done(") >= len(across)
    # what stays saved on the device across later graphs (a graph break's budget split) leaves them out
    graph = planned.graph
    assert planned.footprint.saved_bytes == sum(graph[v].bytes for v in plan.saved if v not in across)
    # the offloads buy back recomputation: the recompute-only plan at this budget recomputes more
    recompute_only = plan_graph(planned.graph, plan.budget_bytes, "greedy")
    assert plan.extra_flops < recompute_only.extra_flops

    with backend.meter.measuring() as measured:
        step(compiled, inputs)
    assert max_relative_error(grads(compiled_model), ref_grads) <= 1e-10  # the graphs run again
    assert measured.resident_bytes == resident_bytes(compiled_model, inputs)
    assert within(measured.peak_bytes, plan.predicted_peak_bytes), (measured.peak_bytes, plan)
    assert plan.host_peak_bytes > 0 and within(measured.host_peak_bytes, plan.host_peak_bytes), \
        (measured.host_peak_bytes, plan.host_peak_bytes)
    assert measured.peak_bytes < plan.store_all_peak_bytes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stream path needs a GPU")
def test_compiled_gpt_on_cuda_offloads_with_eager_gradients():
    backend, *_ = _compiled_gpt("cuda")
    assert backend.plans[0].plan.offloaded


def test_offload_compiles_with_the_eager_compiler_only():
    with pytest.raises(ValueError, match="compiler='eager'") as refused:
        remat_backend("70%", compiler="inductor", offload="auto")
    assert str(refused.value) == OFFLOAD_NEEDS_EAGER and "Inductor" in OFFLOAD_NEEDS_EAGER
    assert remat_backend("70%", offload="auto").compiler == "eager"  # "auto" picks the one that runs copies
    with pytest.raises(ValueError, match="compiler='eager'"):
        remat_backend("70%", compiler="eager", offload="auto").partitioner()  # Inductor's partitioner


@pytest.mark.parametrize(("settings", "message"), [
    ({"link": "pcie4"}, "pass offload='auto' with it"),
    ({"host_budget": "1GB"}, "pass offload='auto' with it"),
    ({"offload": "always"}, "offload is 'auto'"),
    ({"offload": "auto", "link": "usb3"}, "usb3"),
])
def test_bad_offload_settings_fail_before_compiling(settings, message):
    with pytest.raises(ValueError, match=message):
        remat_backend("70%", compiler="eager", **settings)
