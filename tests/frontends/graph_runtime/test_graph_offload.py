"""Offload in the graph runtime: schedules with ``offload``/``reload`` steps train exactly.

Until the simulator accepts the two step kinds, the schedules here are written by hand from a
real capture: a store-all (or greedy) plan's schedule with offload, free and reload steps
inserted for some of its values, compiled by `RematModule` directly (it does not simulate).
On the CPU the offload is a host copy into a separate tensor (see
`frontends.graph_runtime.offload_ops`); the CUDA stream path runs only where a GPU is present.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import weakref
from typing import NamedTuple

import pytest
import torch
from e2e_helpers import clone, load_example, loss_of, max_relative_error, sgd_losses_and_grads, small_mlp, train_step

import optimizer.split_plan as split_plan
from frontends.capture.step import capture
from frontends.graph_runtime import offload_ops, rewrite
from frontends.graph_runtime.remat_module import RematModule
from frontends.graph_runtime.rewrite import RewriteError, build_scheduled_joint
from frontends.measure.link_bandwidth import measure_link
from optimizer import optimize, plan_only
from solvers import get_solver
from solvers.base import SolverOptions
from solvers.ir.graph import NodeKind, Phase
from solvers.ir.schedule import Schedule, StepKind, compute, free, offload, reload
from solvers.ir.simulator import SimulationResult, simulate
from solvers.offload_shift import shifted_offloads
from solvers.planning.planner import plan_for_schedule, plan_graph

# ----------------------------------------------------------------- schedule editing


class Edit:
    """A schedule's steps as two lists, with the insertions the tests need."""

    def __init__(self, graph, schedule: Schedule):
        self.graph = graph
        self.forward, self.backward = list(schedule.forward), list(schedule.backward)

    def schedule(self) -> Schedule:
        return Schedule(tuple(self.forward), tuple(self.backward))

    def readers(self, value: str) -> set[str]:
        return {n.name for n in self.graph.nodes if value in n.inputs}

    def computes(self, steps: list, names) -> list[int]:
        return [i for i, s in enumerate(steps) if s.kind is StepKind.COMPUTE and s.node in names]

    def after_run(self, steps: list, index: int) -> int:
        """The index after the sibling run that the compute at ``index`` belongs to."""
        members = self.graph.group_of(steps[index].node)
        while index + 1 < len(steps) and steps[index + 1].kind is StepKind.COMPUTE \
                and steps[index + 1].node in members:
            index += 1
        return index + 1

    def offload_across(self, value: str) -> None:
        """Forward: offload right after ``value`` is computed, free after its last forward
        reader; backward: reload right before its first reader."""
        made = self.computes(self.forward, {value})[0]
        last = max(self.computes(self.forward, self.readers(value) | {value}))
        self.forward.insert(self.after_run(self.forward, last), free(value))
        self.forward.insert(self.after_run(self.forward, made), offload(value))
        self.backward.insert(self.computes(self.backward, self.readers(value))[0], reload(value))

    def recompute_after_first_reader(self, value: str) -> None:
        """After an `offload_across`: the reloaded copy serves the first backward reader only;
        ``value`` is freed and computed again for the next one."""
        first, second = self.computes(self.backward, self.readers(value))[:2]
        self.backward.insert(second, compute(value))
        self.backward.insert(first + 1, free(value))

    def offload_in_backward(self, value: str) -> None:
        """A backward value is offloaded right after it is made and reloaded before its first reader."""
        made = self.computes(self.backward, {value})[0]
        end = self.after_run(self.backward, made)
        self.backward[end:end] = [offload(value), free(value)]
        self.backward.insert(self.computes(self.backward, self.readers(value))[0], reload(value))


def saved_across(edit: Edit, plan, count: int, single: bool = True) -> list[str]:
    """The ``count`` largest values the plan saves that some backward op reads (single-output
    ops only with ``single``), largest first."""
    graph = edit.graph
    backward_reads = {i for s in edit.backward if s.kind is StepKind.COMPUTE for i in graph[s.node].inputs}
    found = [v for v in plan.saved if v in backward_reads and graph[v].kind is NodeKind.OP
             and v not in graph.user_outputs and (not single or len(graph.group_of(v)) == 1)]
    return sorted(found, key=lambda v: -graph[v].bytes)[:count]


def recomputable(edit: Edit, values: list[str]) -> str:
    """One of ``values`` with two backward readers whose own inputs are still live (saved or
    resident) when its second reader runs, so it can be computed again there."""
    graph = edit.graph
    for value in values:
        readers = edit.computes(edit.backward, edit.readers(value))
        if len(readers) < 2 or graph[value].random:
            continue
        frees = {s.node: i for i, s in enumerate(edit.backward) if s.kind is StepKind.FREE}
        if all(graph[i].kind in (NodeKind.PARAMETER, NodeKind.INPUT) or frees.get(i, len(edit.backward)) > readers[1]
               for i in graph[value].inputs):
            return value
    raise AssertionError("no saved value can be recomputed for its second reader")


def spaced_backward_value(edit: Edit) -> str:
    """A single-output backward value whose first reader runs a few steps after it."""
    graph = edit.graph
    for index in edit.computes(edit.backward, {n.name for n in graph.nodes if n.phase is Phase.BACKWARD}):
        value = edit.backward[index].node
        readers = edit.computes(edit.backward, edit.readers(value))
        if len(graph.group_of(value)) == 1 and readers and readers[0] > index + 3 and graph[value].bytes > 1024:
            return value
    raise AssertionError("no backward value is read a few steps after it is made")


class Planned(NamedTuple):
    module: RematModule
    simulation: SimulationResult
    """The edited schedule as the simulator sees it (copies priced on PCIe Gen5)."""
    store_all_peak_bytes: int


def module_with(model, inputs, solver: str = "store-all", budget: str = "100%", edit=None) -> Planned:
    """A fresh capture of ``model`` planned by ``solver``, its schedule edited by ``edit(Edit, plan)``;
    the edited schedule must simulate, offloading what the module offloads."""
    captured = capture(clone(model), inputs)
    plan = plan_graph(captured.graph, budget, solver=solver)
    if edit is not None:
        steps = Edit(captured.graph, plan.schedule)
        edit(steps, plan)
        plan = dataclasses.replace(plan, schedule=steps.schedule())
    simulation = simulate(captured.graph, plan.schedule, link="pcie5")
    module = RematModule(clone(model), captured, plan, inputs)
    made = [n.name.removesuffix("_offloaded") for gm in (module.forward_graph, module.backward_graph)
            for n in gm.graph.nodes if n.target is offload_ops.offload_done]
    assert sorted(set(made)) == sorted(simulation.offloaded)
    return Planned(module, simulation, plan.store_all_peak_bytes)


def offloaded_names(module: RematModule) -> list[str]:
    return [n.name.removesuffix("_offloaded") for n in module.forward_graph.graph.nodes
            if n.target is offload_ops.offload_done]


# ------------------------------------------------------------------------- gradients


def test_mlp_with_offloaded_activations_gives_eager_gradients():
    model, inputs = small_mlp()
    model, inputs = model.double(), tuple(t.double() for t in inputs)
    chosen: list[str] = []

    def edit(steps: Edit, plan):
        chosen.extend(saved_across(steps, plan, 3))
        for value in chosen:
            steps.offload_across(value)

    rm, simulation, store_all_peak = module_with(model, inputs, edit=edit)
    assert len(chosen) == 3 and sorted(offloaded_names(rm)) == sorted(chosen)
    assert sorted(simulation.saved_on_host) == sorted(chosen) and simulation.peak_bytes < store_all_peak
    forward_outputs = [a.name for a in rm.forward_graph.graph.find_nodes(op="output")[0].args[0]]
    for value in chosen:  # forward hands backward the host copy, not the device value
        assert f"{value}_offloaded" in forward_outputs and value not in forward_outputs
    assert rm.backward_graph.code.count("reload_done") == 3
    _, reference = train_step(clone(model), inputs)
    for _ in range(2):  # the second step reuses the compiled graphs
        _, grads = train_step(rm, inputs)
        assert max_relative_error(grads, reference) <= 1e-10


def test_gpt_offloads_across_in_backward_and_with_recomputation_give_eager_gradients():
    model, inputs = load_example("gpt", dropout=0.0)
    picked: dict[str, str] = {}

    def edit(steps: Edit, plan):
        mixed = recomputable(steps, saved_across(steps, plan, len(plan.saved)))
        across = [mixed] + [v for v in saved_across(steps, plan, 6) if v != mixed][:5]
        in_backward = spaced_backward_value(steps)
        for value in across:
            steps.offload_across(value)
        steps.recompute_after_first_reader(mixed)
        steps.offload_in_backward(in_backward)
        picked.update(mixed=mixed, in_backward=in_backward)

    rm, simulation, store_all_peak = module_with(model, inputs, edit=edit)
    assert len(offloaded_names(rm)) == 6 and len(simulation.saved_on_host) == 6
    assert picked["in_backward"] in simulation.offloaded and simulation.peak_bytes < store_all_peak
    backward = rm.backward_graph.code
    assert f"{picked['mixed']}_recomputed = " in backward  # recomputed after serving one reader reloaded
    assert f"{picked['in_backward']}_offloaded = " in backward and f"{picked['in_backward']}_reloaded = " in backward
    _, reference = train_step(clone(model), inputs)
    _, grads = train_step(rm, inputs)
    assert max_relative_error(grads, reference) <= 1e-10


def test_offload_and_reload_within_forward():
    model, inputs = small_mlp()
    model, inputs = model.double(), tuple(t.double() for t in inputs)

    def edit(steps: Edit, plan):
        # the first layer's output: offloaded as soon as it is made, back for its forward reader
        value = steps.forward[steps.computes(steps.forward, {n.name for n in steps.graph.nodes
                                                              if n.op == "aten.addmm.default"})[0]].node
        reader = steps.computes(steps.forward, steps.readers(value))[0]
        steps.forward[reader:reader] = [offload(value), free(value), reload(value)]

    rm, simulation, _ = module_with(model, inputs, edit=edit)
    assert "reload_done" in rm.forward_graph.code and len(simulation.offloaded) == 1
    _, reference = train_step(clone(model), inputs)
    _, grads = train_step(rm, inputs)
    assert max_relative_error(grads, reference) <= 1e-10


def test_dropout_plan_with_offloads_trains_bitwise_like_the_plan_without():
    """A greedy plan that recomputes dropout (RNG replay) with saved values offloaded on top draws
    the same masks and computes the same numbers as the same plan without offloads."""
    model, inputs = load_example("gpt", dropout=0.1)
    offloaded: list[str] = []

    def edit(steps: Edit, plan):
        assert any(steps.graph[v].random for v, _ in plan.recomputed)  # dropout replays
        every = saved_across(steps, plan, len(plan.saved), single=False)
        drawn = [v for v in every if steps.graph[v].random]  # a dropout's output or mask
        offloaded.extend([drawn[0]] + [v for v in every if v != drawn[0]][:3])
        for value in offloaded:
            steps.offload_across(value)

    runs = []
    for how in (None, edit):
        rm = module_with(model, inputs, solver="greedy", budget="60%", edit=how).module
        runs.append(sgd_losses_and_grads(rm, inputs, steps=2, seed=3))
    assert len(offloaded) == 4
    (plain_losses, plain_grads), (losses, grads) = runs
    assert all(torch.equal(a, b) for a, b in zip(plain_losses, losses))
    for a, b in zip(plain_grads, grads):
        assert all(torch.equal(a[name], b[name]) for name in a), "offloading changed a gradient"


# ---------------------------------------------------------- what is really released


def test_host_copy_is_saved_and_the_device_value_is_dropped(monkeypatch):
    model, inputs = small_mlp()
    model, inputs = model.double(), tuple(t.double() for t in inputs)
    copies: list[tuple[weakref.ref, torch.Tensor]] = []

    def recording_offload(value):
        host = offload_ops.offload_to_host(value)
        assert host.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
        assert torch.equal(host, value) and host.stride() == value.stride()
        copies.append((weakref.ref(value), host))
        return host

    monkeypatch.setattr(rewrite, "offload_to_host", recording_offload)  # read when the graph is built
    rm = module_with(model, inputs, edit=lambda steps, plan: [steps.offload_across(v)
                                                               for v in saved_across(steps, plan, 3)]).module
    saved_storages: set[int] = set()

    def pack(tensor):
        saved_storages.add(tensor.untyped_storage().data_ptr())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(rm(*inputs))
    gc.collect()
    assert len(copies) == 3
    for device_ref, host in copies:
        assert device_ref() is None, "the device value outlived its offload's free"
        assert host.untyped_storage().data_ptr() in saved_storages, "backward does not hold the host copy"
    loss.backward()
    assert all(p.grad is not None for p in rm.model.parameters())


# ----------------------------------------------------------------------- bad schedules


@pytest.fixture(scope="module")
def mlp_capture():
    model, inputs = small_mlp()
    captured = capture(model, inputs)
    return captured, plan_graph(captured.graph, "100%", solver="store-all")


def _build(mlp_capture, edit):
    captured, plan = mlp_capture
    steps = Edit(captured.graph, plan.schedule)
    edit(steps, plan)
    return build_scheduled_joint(captured, steps.schedule())


def test_reload_of_a_value_never_offloaded_is_refused(mlp_capture):
    def edit(steps, plan):
        value = saved_across(steps, plan, 1)[0]
        steps.backward.insert(steps.computes(steps.backward, steps.readers(value))[0], reload(value))

    with pytest.raises(RewriteError, match=r"backward step \d+ \(reload\(.*\)\): .* has not been offloaded ever"):
        _build(mlp_capture, edit)


def test_reload_before_the_free_that_ends_the_offload_is_refused(mlp_capture):
    def edit(steps, plan):
        value = saved_across(steps, plan, 1)[0]
        made = steps.computes(steps.forward, {value})[0]
        steps.forward[made + 1:made + 1] = [offload(value), reload(value)]

    with pytest.raises(RewriteError, match="before its offload is finished: add free"):
        _build(mlp_capture, edit)


def test_reading_an_offloaded_value_without_reload_is_refused(mlp_capture):
    def edit(steps, plan):
        value = saved_across(steps, plan, 1)[0]
        steps.offload_across(value)
        steps.backward = [s for s in steps.backward if s != reload(value)]

    with pytest.raises(RewriteError, match=r"while it is offloaded to host: reload\("):
        _build(mlp_capture, edit)


def test_offload_of_a_parameter_or_twice_is_refused(mlp_capture):
    captured, _ = mlp_capture
    parameter = next(n.name for n in captured.graph.nodes if n.kind is NodeKind.PARAMETER)
    with pytest.raises(RewriteError, match="input, parameter or constant"):
        _build(mlp_capture, lambda steps, plan: steps.forward.insert(0, offload(parameter)))

    def twice(steps, plan):
        value = saved_across(steps, plan, 1)[0]
        made = steps.computes(steps.forward, {value})[0]
        steps.forward[made + 1:made + 1] = [offload(value), offload(value)]

    with pytest.raises(RewriteError, match="offloaded twice"):
        _build(mlp_capture, twice)


# ------------------------------------------------------------------------ the copies


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the stream path needs a GPU"))])
def test_copies_keep_layout_and_make_new_storage(device):
    base = torch.arange(60, dtype=torch.float64, device=device).reshape(5, 12)
    value = base[1:, 2:].t()  # an offset, non-contiguous view of a larger storage
    host = offload_ops.offload_to_host(value)
    kept = offload_ops.offload_done(host, value)
    assert kept is host and host.device.type == "cpu"
    assert host.untyped_storage().nbytes() == base.untyped_storage().nbytes()
    back = offload_ops.reload_done(offload_ops.reload_to_device(host, value.device))
    for copy in (host, back):
        assert copy.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()
        layout = (copy.storage_offset(), copy.size(), copy.stride())
        assert layout == (value.storage_offset(), value.size(), value.stride())
        assert torch.equal(copy.cpu(), value.cpu())
    if device == "cuda":
        assert host.is_pinned() and back.device == value.device


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the stream path needs a GPU")
def test_mlp_on_cuda_with_offloads_gives_eager_gradients():
    model, inputs = small_mlp()
    model, inputs = model.double().cuda(), tuple(t.double().cuda() for t in inputs)
    rm = module_with(model, inputs, edit=lambda steps, plan: [steps.offload_across(v)
                                                               for v in saved_across(steps, plan, 3)]).module
    _, reference = train_step(clone(model), inputs)
    _, grads = train_step(rm, inputs)
    assert max_relative_error(grads, reference) <= 1e-10


def assert_trains_like_store_all(rm: RematModule, model, inputs) -> None:
    """One step of ``rm`` and of the store-all module from the same seed: the same loss (dropout
    draws replayed) and gradients within 1e-10."""
    reference = module_with(model, inputs).module
    results = []
    for module in (reference, rm):
        torch.manual_seed(5)
        results.append(train_step(module, inputs))
    (ref_out, ref_grads), (out, grads) = results
    assert torch.equal(ref_out[0], out[0])
    assert max_relative_error(grads, ref_grads) <= 1e-10


def test_planner_offload_plan_with_dropout_trains_like_store_all():
    """The planner's own keep / recompute / offload choice (``offload="auto"``) runs as planned."""
    model, inputs = load_example("gpt", dropout=0.1)
    captured = capture(clone(model), inputs)
    plan = plan_graph(captured.graph, "70%", solver="greedy", offload="auto", link="pcie4")
    assert plan.offloaded
    rm = RematModule(clone(model), captured, plan, inputs)
    made = {n.name.removesuffix("_offloaded") for gm in (rm.forward_graph, rm.backward_graph)
            for n in gm.graph.nodes if n.target is offload_ops.offload_done}
    assert made == {v for v, _ in plan.offloaded}
    assert_trains_like_store_all(rm, model, inputs)


def test_a_smaller_batch_runs_the_offloaded_plan():
    """A smaller batch keeps the plan's copies (not only its computes) and trains exactly."""
    model, inputs = load_example("gpt", dropout=0.0)
    rm = optimize(clone(model), inputs, "70%", solver="greedy", offload="auto", link="pcie4")
    assert rm.plan.offloaded
    small = tuple(t[:3] for t in inputs)
    _, reference = train_step(clone(model), small)
    _, grads = train_step(rm, small)
    assert max_relative_error(grads, reference) <= 1e-10
    variant = next(plan for plan in rm.plans_by_shape.values() if plan is not rm.plan)
    assert [name for name, _ in variant.offloaded] == [name for name, _ in rm.plan.offloaded]
    assert variant.schedule.steps == rm.plan.schedule.steps and variant.link == rm.plan.link
    assert variant.predicted_peak_bytes < rm.plan.predicted_peak_bytes


def test_a_budget_shifted_offload_plan_of_the_hierarchical_solver_trains_like_store_all():
    """`solvers.offload_shift`: the hierarchical schedule for a larger budget with its first saved
    values offloaded (recomputation in backward and copies together) runs as simulated."""
    model, inputs = load_example("gpt", dropout=0.1)
    captured = capture(clone(model), inputs)
    graph = captured.graph
    plain = plan_graph(graph, "60%", solver="hierarchical")

    def solve(budget_bytes: int, seconds: float):
        return get_solver("hierarchical")(graph, budget_bytes, SolverOptions(time_limit_s=seconds)).schedule

    budget = plain.budget_bytes
    choice = shifted_offloads(graph, budget, "pcie4", solve, deadline=time.perf_counter() + 60)
    assert choice is not None and choice.offloaded and choice.result.recomputed
    plan = plan_for_schedule(graph, choice.schedule, budget, plain, link="pcie4")
    assert plan.predicted_peak_bytes <= budget and {v for v, _ in plan.offloaded} == set(choice.offloaded)
    rm = RematModule(clone(model), captured, plan, inputs)
    assert sorted(offloaded_names(rm)) == sorted(choice.offloaded)
    assert_trains_like_store_all(rm, model, inputs)


def test_link_measured_prices_the_copies_on_this_device(monkeypatch):
    """``link="measured"``: the planner prices copies on the link timed on the model's device
    (here the CPU's host copies; whether offloads then win depends on this VM's load, so the
    link handed to the planner is what is checked); without ``offload="auto"`` the link is
    refused as any is."""
    model, inputs = load_example("gpt", dropout=0.0)
    measured = measure_link("cpu")
    links = []

    def spy(*args, **kwargs):
        links.append(kwargs.get("link"))
        return plan_graph(*args, **kwargs)

    monkeypatch.setattr(split_plan, "plan_graph", spy)
    plan = plan_only(clone(model), inputs, "70%", solver="greedy", offload="auto", link="measured")
    assert links and all(link is measured for link in links)
    assert plan.link in ("", measured.describe())  # offloads priced there, or none won
    with pytest.raises(ValueError, match="offload='auto'"):
        plan_only(clone(model), inputs, "70%", solver="greedy", link="measured")
