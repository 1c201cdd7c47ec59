"""Offload as a third choice (issue 39): the link, the simulator's copy model, the placement of
the copies, the keep / recompute / offload search against brute force, and the planner's setting."""

from __future__ import annotations

import random

import pytest
from graphs import chain, random_graph, small_offload_cases, store_and_lean_peaks, tiny_chain
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers.baselines import store_all_schedule
from solvers.brute_force import brute_force_offload, min_feasible_budget
from solvers.greedy import droppable, schedule_from_saved
from solvers.ir.graph import NodeKind, RematGraph
from solvers.ir.link import LINKS, Link, default_link, get_link
from solvers.ir.plan_text import format_plan
from solvers.ir.schedule import Schedule, StepKind, compute, free, offload, reload
from solvers.ir.simulator import InvalidScheduleError, simulate
from solvers.offload import choose_offloads, saved_by
from solvers.offload_placement import place_offloads
from solvers.planning.planner import plan_graph
from solvers.planning.request import PlanRequest

SLOW = Link("slow", 10.0, 20.0, latency_s=0.5)
"""10 B/s to host, 20 B/s back, 0.5 s a copy: copy times comparable to tiny_chain's op costs."""


# ------------------------------------------------------------------ the link
def test_link_presets_and_lookup():
    assert get_link("PCIe5") is LINKS["pcie5"] and get_link(LINKS["pcie4"]) is LINKS["pcie4"]
    assert LINKS["pcie5"].offload_seconds(55_000_000_000) == pytest.approx(1.0 + LINKS["pcie5"].latency_s)
    assert LINKS["nvlink-c2c"].host_to_device_bytes_per_s > 8 * LINKS["pcie5"].host_to_device_bytes_per_s
    assert default_link("h200").name == "pcie5" and default_link("a100-80gb").name == "pcie4"
    with pytest.raises(ValueError, match="pcie4, pcie5, nvlink-c2c"):
        get_link("pcie7")
    with pytest.raises(ValueError, match="positive number of bytes/s"):
        Link("bad", 0.0, 1.0)


# ------------------------------------------------------------------ the simulator
def _hand_schedule() -> Schedule:
    """tiny_chain with ``a`` offloaded after forward makes it and reloaded right before ``ga``."""
    return Schedule(
        (compute("a"), offload("a"), compute("b"), free("a"), compute("loss")),
        (compute("gb"), free("b"), reload("a"), compute("ga"), free("gb"), free("a"), compute("gp"), free("ga")),
    )


def test_simulator_prices_an_offload_by_hand():
    graph = tiny_chain()
    sim = simulate(graph, _hand_schedule(), link=SLOW)
    # Device: resident 110; a 130, b 160, a freed 140, loss 141, tangent 142, gb 172, b freed 142,
    # a reloaded 162, ga 182, ..., gp 232 (gb and a freed before it).
    assert sim.peak_bytes == 232 and sim.peak_node == "gp"
    assert sim.live_curve[:5] == (130, 130, 160, 140, 141)
    assert sim.host_peak_bytes == 20 and sim.offloaded == ("a",)
    assert sim.saved == ("b",) and sim.saved_on_host == ("a",)
    # Time: the offload (0.5 + 20/10 s) starts at 1 and lands at 3.5: free(a) at 2 waits 1.5 s.
    # The reload (0.5 + 20/20 s) starts at 6.5 after gb and lands at 8: ga waits 1.5 s.
    assert sim.total_cost == 9.0
    assert sim.transfer_time_s == pytest.approx(4.0)
    assert sim.stall_time_s == pytest.approx(3.0)
    assert sim.step_time_s == pytest.approx(12.0)


def test_a_fast_link_hides_the_copies_and_no_offload_simulates_as_before():
    graph = tiny_chain()
    fast = Link("fast", 1e9, 1e9, latency_s=0.0)
    assert simulate(graph, _hand_schedule(), link=fast).stall_time_s == pytest.approx(0.0, abs=1e-6)
    plain = store_all_schedule(graph)
    assert simulate(graph, plain, link=fast) == simulate(graph, plain)


@pytest.mark.parametrize("steps, message", [
    (lambda s: s, "pass simulate\\(\\.\\.\\., link=\\.\\.\\.\\)"),
    (lambda s: Schedule(s.forward[:1] + s.forward[2:], s.backward), "reloads a value that is not on host"),
    (lambda s: Schedule(s.forward[:3] + s.forward[4:], s.backward), "reloads a value that is still live"),
    (lambda s: Schedule(s.forward + (offload("b"), offload("b")), s.backward), "already on host"),
    (lambda s: Schedule((offload("p"),) + s.forward, s.backward), "only values the step computes"),
    (lambda s: Schedule((offload("a"),) + s.forward, s.backward), "not live on device"),
    (lambda s: Schedule(s.forward, tuple(x for x in s.backward if x != reload("a"))), "input 'a' is not live"),
])
def test_simulator_refuses_broken_copies(steps, message):
    link = None if "link" in message else SLOW
    with pytest.raises(InvalidScheduleError, match=message):
        simulate(tiny_chain(), steps(_hand_schedule()), link=link)


def _reference(graph: RematGraph, schedule: Schedule) -> tuple[int, int]:
    """(device peak, host peak) by plain step-by-step accounting, checking that no value is read
    while it is only on host and that every reload follows an offload and a free."""
    resident = {n.name for n in graph.nodes if n.kind in (NodeKind.PARAMETER, NodeKind.INPUT)}
    device, host = set(resident), set()
    nbytes = lambda names: sum(graph[v].bytes for v in names)  # noqa: E731
    peak, host_peak = nbytes(device), 0
    steps, n_forward, i = schedule.steps, len(schedule.forward), 0
    while i < len(steps):
        if i == n_forward:
            device |= set(graph.tangents)
            peak = max(peak, nbytes(device))
        step = steps[i]
        if step.kind is StepKind.COMPUTE:
            members = graph.group_of(step.node)
            assert all(inp in device for inp in graph[step.node].inputs), f"{step} reads a value not on device"
            fresh = [m for m in members if m not in device]
            peak = max(peak, nbytes(device) + nbytes(members) + graph[step.node].temp_bytes)
            device.update(fresh)
            i += len(members)
            continue
        if step.kind is StepKind.FREE:
            device.discard(step.node)
        elif step.kind is StepKind.OFFLOAD:
            assert step.node in device
            host.add(step.node)
            host_peak = max(host_peak, nbytes(host))
        else:
            assert step.node in host and step.node not in device, f"{step} before its offload and free"
            host.discard(step.node)
            device.add(step.node)
            peak = max(peak, nbytes(device))
        i += 1
    if n_forward == len(steps):
        peak = max(peak, nbytes(device | set(graph.tangents)))
    return peak, host_peak


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 400), fraction=st.floats(0.0, 1.0), slack=st.integers(-5, 40),
       bandwidth=st.sampled_from([0.5, 4.0, 100.0]))
def test_placed_offloads_simulate_to_an_independent_accounting(seed, fraction, slack, bandwidth):
    graph = random_graph(seed, 4 + seed % 6)
    rng = random.Random(seed)
    saved = frozenset(v for v in droppable(graph) if rng.random() < 0.8)
    base = schedule_from_saved(graph, saved)
    values = [v for v in sorted(saved_by(graph, base)) if rng.random() < fraction]
    link = Link("t", bandwidth, bandwidth, latency_s=0.25)
    tight = place_offloads(graph, base, values, link, budget_bytes=0)  # no room: every copy where it must be
    budget = simulate(graph, tight, link=link).peak_bytes + slack
    schedule = place_offloads(graph, base, values, link, budget_bytes=budget)
    sim = simulate(graph, schedule, link=link)
    assert (sim.peak_bytes, sim.host_peak_bytes) == _reference(graph, schedule)
    assert sim.peak_bytes <= max(budget, simulate(graph, tight, link=link).peak_bytes)
    assert set(sim.offloaded) == set(values) and set(sim.saved_on_host) <= set(values)
    assert sim.host_peak_bytes <= sum(graph[v].bytes for v in values)
    assert sim.transfer_time_s == pytest.approx(sum(
        link.offload_seconds(graph[v].bytes) + link.reload_seconds(graph[v].bytes) for v in values))
    assert sim.total_cost == simulate(graph, base).total_cost  # copies cost no compute
    for v in values:  # the copy starts right after the value is made, in forward
        steps = list(schedule.forward)
        assert steps.index(offload(v)) < steps.index(free(v))


def test_prefetch_hides_the_reload_when_backward_has_the_compute():
    graph = chain(6, size=10, fwd_cost=1.0, bwd_cost=2.0)
    base = store_all_schedule(graph)
    link = Link("t", 20.0, 20.0, latency_s=0.0)  # 0.5 s a copy: one op's time hides it
    schedule = place_offloads(graph, base, ["f0", "f1"], link)
    sim = simulate(graph, schedule, link=link)
    assert sim.stall_time_s == pytest.approx(0.0, abs=1e-9)
    backward = list(schedule.backward)
    first_read = next(i for i, s in enumerate(backward) if s.kind is StepKind.COMPUTE and s.node == "g1")
    assert backward.index(reload("f0")) < first_read and backward.index(reload("f1")) < first_read
    # with no room above the tightest placement, the reload waits right before its reader
    tight = place_offloads(graph, base, ["f0"], link, budget_bytes=0)
    reader = next(i for i, s in enumerate(tight.backward)
                  if s.kind is StepKind.COMPUTE and "f0" in graph[s.node].inputs)
    assert tight.backward[reader - 1] == reload("f0")
    assert simulate(graph, tight, link=link).stall_time_s > 0


def test_placement_refuses_values_forward_does_not_save():
    graph = tiny_chain()
    with pytest.raises(ValueError, match="only values forward saves"):
        place_offloads(graph, store_all_schedule(graph), ["loss"], SLOW)


# ------------------------------------------------------------------ the search
def test_the_search_reaches_the_brute_force_optimum_on_tiny_graphs():
    compared = offloading = 0
    for graph, budget, link in small_offload_cases():
        exact = brute_force_offload(graph, budget, link)
        found = choose_offloads(graph, budget, link)
        if exact is None:
            assert found is None
            continue
        assert found is not None and found.result.peak_bytes <= budget
        assert found.step_time_s == pytest.approx(exact.step_time_s, rel=1e-9), (graph.name, budget)
        compared += 1
        offloading += bool(exact.offloaded)
    assert compared > 40 and offloading > 10  # offload is the optimum in a good share of them


def test_offload_fits_budgets_no_recompute_only_schedule_meets():
    graph = random_graph(2, 6)  # found by search: offload lowers this graph's floor by 2 bytes
    budget = min_feasible_budget(graph, space="free") - 1  # exact: no recompute-only schedule fits
    link = Link("t", 100.0, 100.0, latency_s=0.0)
    exact = brute_force_offload(graph, budget, link)
    assert exact is not None and exact.offloaded
    found = choose_offloads(graph, budget, link)
    assert found is not None and found.result.peak_bytes <= budget and found.offloaded


def test_the_host_budget_limits_what_is_offloaded():
    graph = chain(6, size=10)
    link = Link("t", 100.0, 100.0, latency_s=0.0)
    high, low = store_and_lean_peaks(graph)
    free_choice = choose_offloads(graph, low, link)
    limited = choose_offloads(graph, low, link, host_budget_bytes=10)
    assert free_choice is not None and free_choice.result.host_peak_bytes > 10
    assert limited is None or limited.result.host_peak_bytes <= 10


# ------------------------------------------------------------------ the planner
def test_the_planner_offloads_when_it_is_faster_and_says_so():
    graph = chain(8, size=10, fwd_cost=1.0, bwd_cost=2.0)
    high, low = store_and_lean_peaks(graph)
    budget = (high + low) // 2
    link = Link("fast", 1e3, 1e3, latency_s=0.0)
    plain = plan_graph(graph, budget, "greedy")
    offloading = plan_graph(graph, budget, "greedy", offload="auto", link=link)
    assert plain.offloaded == () and plain.extra_time_s > 0
    assert offloading.offloaded and offloading.extra_time_s < plain.extra_time_s
    assert offloading.predicted_peak_bytes <= budget and offloading.solver == "greedy+offload"
    assert offloading.transfer_time_s > 0 and offloading.host_peak_bytes > 0
    assert offloading.extra_time_s == pytest.approx(offloading.stall_time_s + offloading.extra_flops)
    assert {name for name, _ in offloading.offloaded} <= set(offloading.saved)
    assert offloading.to_json()["offloaded"] and "offloaded" in format_plan(offloading, "chain")
    assert simulate(graph, offloading.schedule, link=link).peak_bytes == offloading.predicted_peak_bytes


def test_plan_request_offload_settings():
    request = PlanRequest.of("60%", "test", offload="auto", link="nvlink-c2c", host_budget="1GB")
    assert request.offload_settings == {"offload": "auto", "link": "nvlink-c2c", "host_budget": 10**9}
    with pytest.raises(ValueError, match="'auto'"):
        PlanRequest.of("60%", "test", offload="yes")
    with pytest.raises(ValueError, match="offload='auto'"):
        PlanRequest.of("60%", "test", link="pcie5")
    with pytest.raises(ValueError, match="unknown link"):
        PlanRequest.of("60%", "test", offload="auto", link="usb")
