"""Ops run in place (`solvers.ir.inplace`): when an input's storage is taken over, what the
simulator charges for it, and where it must not be (saved for backward, read later, offloaded)."""

from __future__ import annotations

import pytest
from graphs import B, F, op

from solvers.baselines import store_all_schedule
from solvers.ir.graph import Node, NodeKind, RematGraph
from solvers.ir.inplace import donations
from solvers.ir.reduce import reduce_graph
from solvers.ir.schedule import Schedule, compute, free, offload, reload
from solvers.ir.simulator import simulate


def accumulating(reuses: bool, late_reader: bool = False) -> RematGraph:
    """a, b -> loss; backward: two partial gradients ga1, ga2 summed by ``acc`` (which may reuse
    either), then the parameter's gradient. ``late_reader``: gp also reads ga1."""
    nodes = (
        Node("p", NodeKind.PARAMETER, F, 100),
        Node("x", NodeKind.INPUT, F, 10),
        op("a", F, 40, ["x", "p"]),
        op("loss", F, 1, ["a"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("ga1", B, 40, ["t", "a"]),
        op("ga2", B, 40, ["t"]),
        op("acc", B, 40, ["ga1", "ga2"], reuses=("ga1", "ga2") if reuses else ()),
        op("gp", B, 10, ["acc", "x", *(["ga1"] if late_reader else [])]),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("gp",))


def test_an_accumulation_freed_right_after_runs_in_place_and_allocates_nothing():
    plain, in_place = accumulating(False), accumulating(True)
    schedule = store_all_schedule(in_place)
    steps = schedule.steps
    donated = donations(in_place, schedule)
    assert [steps[i].node for i in donated] == ["acc"] and set(donated.values()) <= {"ga1", "ga2"}
    before, after = simulate(plain, store_all_schedule(plain)), simulate(in_place, schedule)
    # resident 110 + loss 1 + t 1 + ga1 40 + ga2 40 while acc runs (a freed after ga1): acc's 40 is not new
    assert before.peak_bytes == 110 + 1 + 1 + 40 + 40 + 40 and before.peak_node == "acc"
    assert after.peak_bytes == before.peak_bytes - 40
    assert after.live_curve[-1] == before.live_curve[-1]  # the same bytes once both are freed


def test_an_input_read_later_is_not_written():
    graph = accumulating(True, late_reader=True)
    schedule = store_all_schedule(graph)
    donated = donations(graph, schedule)
    assert set(donated.values()) == {"ga2"}  # ga1 is read by gp: only ga2 may be taken over


def test_a_value_saved_for_backward_is_never_written():
    """Forward computes u; backward's only reader sums it: a retained graph must find u intact."""
    nodes = (
        Node("x", NodeKind.INPUT, F, 10),
        op("u", F, 20, ["x"]),
        op("loss", F, 1, ["u"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("g", B, 20, ["t"]),
        op("acc", B, 20, ["u", "g"], reuses=("u", "g")),
    )
    graph = RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("acc",))
    schedule = store_all_schedule(graph)
    assert set(donations(graph, schedule).values()) == {"g"}
    only_u = RematGraph(tuple(n if n.name != "acc" else op("acc", B, 20, ["u", "g"], reuses=("u",)) for n in nodes),
                        forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("acc",))
    assert donations(only_u, store_all_schedule(only_u)) == {}


def test_an_offloaded_value_is_never_written():
    graph = accumulating(True)
    forward = (compute("a"), compute("loss"))
    backward = (compute("ga1"), offload("ga1"), compute("ga2"), compute("acc"), free("ga2"), free("ga1"),
                compute("gp"), free("acc"), free("a"))
    schedule = Schedule(forward, backward)
    assert set(donations(graph, schedule).values()) == {"ga2"}
    at_acc = [i for i, s in enumerate(schedule.steps) if s == compute("acc")][0]
    seen: dict[str, list[int]] = {"reuses": [], "plain": []}
    for key, g in (("reuses", graph), ("plain", accumulating(False))):
        simulate(g, schedule, lambda i, during, live, width, key=key: seen[key].append(during) if i == at_acc else None,
                 link="pcie4")
    assert seen["reuses"][0] == seen["plain"][0] - 40  # ga2 taken over; ga1, being copied, is not
    reloaded = Schedule(forward, (compute("ga1"), offload("ga1"), free("ga1"), reload("ga1"), compute("ga2"),
                                  compute("acc"), free("ga1"), free("ga2"), compute("gp"), free("acc"), free("a")))
    assert set(donations(graph, reloaded).values()) == {"ga2"}


def test_the_graph_refuses_a_reuse_it_cannot_honour():
    x = Node("x", NodeKind.INPUT, F, 10)
    with pytest.raises(ValueError, match="reuse only inputs of its own bytes"):
        RematGraph((x, op("u", F, 20, ["x"]), op("v", F, 30, ["u"], reuses=("u",))), ("v",), ("v",), ())
    with pytest.raises(ValueError, match="reuse only inputs"):
        RematGraph((x, op("u", F, 20, ["x"]), op("w", F, 20, ["x"]), op("v", F, 20, ["u"], reuses=("w",))),
                   ("v",), ("v",), ())
    with pytest.raises(ValueError, match="several outputs"):
        RematGraph((x, op("u", F, 20, ["x"]), op("v1", F, 20, ["u"], group="v", reuses=("u",)),
                    op("v2", F, 20, ["u"], group="v")), ("v1", "v2"), ("v1", "v2"), ())


def test_reduction_keeps_an_op_apart_from_the_reader_that_may_write_into_it():
    """u (resident-fed, one reader) would fuse into v; not when v may take u's storage."""
    def graph(reuses):
        return RematGraph((Node("p", NodeKind.PARAMETER, F, 10), op("u", F, 20, ["p"]),
                           op("v", F, 20, ["u"], reuses=reuses), op("loss", F, 1, ["v"])),
                          ("loss",), ("loss",), ())
    assert reduce_graph(graph(())).absorbed == {"v": ("u",)}
    reduced = reduce_graph(graph(("u",)))
    assert reduced.absorbed == {} and "u" in reduced.graph


def test_a_forward_output_freed_at_the_boundary_is_never_written():
    """``upd`` (an updated buffer: a forward output nobody reads later) is freed where backward
    starts; forward's last op, which reads it last, must not write into it."""
    nodes = (
        Node("x", NodeKind.INPUT, F, 10),
        op("u", F, 20, ["x"]),
        op("upd", F, 20, ["x"]),
        op("w", F, 20, ["x"]),
        op("loss", F, 1, ["u"]),
        op("s", F, 20, ["upd", "w"], reuses=("upd",)),
        Node("t", NodeKind.TANGENT, B, 1),
        op("g", B, 20, ["t", "u"]),
    )
    graph = RematGraph(nodes, forward_outputs=("loss", "upd", "s"), user_outputs=("loss",),
                       backward_outputs=("g",))
    schedule = store_all_schedule(graph)
    assert schedule.forward[-2:] == (compute("s"), free("w"))
    assert free("upd") in schedule.backward  # freed at the boundary, after forward returned it
    assert donations(graph, schedule) == {}
