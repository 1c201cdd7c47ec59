"""The simulator on hand-built graphs: hand-computed peaks and every rule it enforces."""

import pytest
from graphs import B, F, chain, op, random_graph, tiny_chain

from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.ir.graph import Node, NodeKind, RematGraph
from solvers.ir.schedule import Schedule, compute, free
from solvers.ir.simulator import InvalidScheduleError, simulate


def test_store_all_peak_is_hand_computed():
    g = tiny_chain()
    result = simulate(g, store_all_schedule(g))
    # resident 110; a(20), b(30), loss(1) -> 161 at the boundary; tangent 1 -> 162;
    # gb -> 192, frees b -> 162 (the tangent stays: the caller holds it); ga -> 182, frees gb
    # and a -> 132; gp (100) -> 232.
    assert result.boundary_bytes == 161
    assert result.peak_bytes == 232
    assert result.peak_node == "gp"
    assert set(result.saved) == {"a", "b"}
    assert result.extra_cost == 0
    assert result.live_curve[-1] == 212


def test_a_tangent_cannot_be_freed():
    """``loss.backward()`` holds the gradient it makes until backward returns (and a gradient
    given to ``backward(grad)`` is the caller's): a schedule that frees one is refused."""
    g = tiny_chain()
    (tangent,) = g.tangents
    steps = store_all_schedule(g)
    backward = list(steps.backward)
    backward.insert(len(g.group_of(backward[0].node)), free(tangent))
    with pytest.raises(InvalidScheduleError, match="held by the caller until backward ends"):
        simulate(g, Schedule(forward=steps.forward, backward=tuple(backward)))


def test_recompute_all_saves_nothing_and_pays_in_compute():
    g = tiny_chain()
    result = simulate(g, recompute_all_schedule(g))
    assert result.saved == ()
    assert result.boundary_bytes == 110 + 1
    # a is recomputed twice (for gb's b and for ga), b once: 2 * 1 + 1 = 3 extra.
    assert result.extra_cost == 3.0
    assert dict(result.recomputed) == {"a": 3, "b": 2}


def test_recompute_all_lowers_activation_memory_on_a_chain():
    g = chain(8)
    store = simulate(g, store_all_schedule(g))
    lean = simulate(g, recompute_all_schedule(g))
    assert lean.peak_bytes < store.peak_bytes
    assert lean.extra_cost > 0


def test_reading_a_freed_value_is_rejected():
    g = tiny_chain()
    bad = Schedule(forward=(compute("a"), free("a"), compute("b")), backward=())
    with pytest.raises(InvalidScheduleError, match="input 'a' is not live"):
        simulate(g, bad)


def test_missing_forward_output_is_rejected():
    g = tiny_chain()
    bad = Schedule(forward=(compute("a"),), backward=())
    with pytest.raises(InvalidScheduleError, match="forward ends without outputs"):
        simulate(g, bad)


def test_backward_op_in_forward_is_rejected():
    g = tiny_chain()
    steps = (compute("a"), compute("b"), compute("loss"), compute("gb"))
    with pytest.raises(InvalidScheduleError, match="backward op scheduled in forward"):
        simulate(g, Schedule(forward=steps, backward=()))


def _dropout_graph() -> RematGraph:
    nodes = (
        Node("x", NodeKind.INPUT, F, 10),
        op("d_out", F, 10, ["x"], group="d", random=True),
        Node("d_mask", NodeKind.OP, F, 2, ("x",), group="d", random=True),
        op("loss", F, 1, ["d_out"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("gx", B, 10, ["t", "d_mask"]),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("gx",))


def test_siblings_are_allocated_together_and_freed_apart():
    g = _dropout_graph()
    s = Schedule.from_computes(g, ["d_out", "loss"], ["gx"])
    assert s.forward[:2] == (compute("d_out"), compute("d_mask"))
    result = simulate(g, s)
    # 10 + (10 + 2) = 22 while dropout runs; d_out dies after loss -> boundary 10 + 2 + 1.
    assert result.boundary_bytes == 13
    assert result.saved == ("d_mask",)
    # backward: boundary 13 + tangent 1 + gx 10 = 24 (forward peaks at 23 when loss runs).
    assert result.peak_bytes == 24
    assert max(result.live_curve[: len(s.forward)]) == 23


def test_random_op_cannot_be_recomputed():
    g = _dropout_graph()
    steps = Schedule.from_computes(g, ["d_out", "loss"], ["gx"])
    recompute = Schedule(
        forward=steps.forward + (free("d_mask"),),
        backward=(compute("d_out"), compute("d_mask")) + steps.backward,
    )
    with pytest.raises(InvalidScheduleError, match="exactly once"):
        simulate(g, recompute)


def test_split_siblings_are_rejected():
    g = _dropout_graph()
    with pytest.raises(InvalidScheduleError, match="computed together"):
        simulate(g, Schedule(forward=(compute("d_mask"),), backward=()))


@pytest.mark.parametrize("seed", range(30))
def test_baselines_pass_the_simulator_on_random_graphs(seed):
    g = random_graph(seed, 6)
    store = simulate(g, store_all_schedule(g))
    lean = simulate(g, recompute_all_schedule(g))
    assert store.extra_cost == 0
    assert lean.extra_cost >= 0
    assert lean.boundary_bytes <= store.boundary_bytes


def test_a_user_output_is_never_freed_even_when_its_op_is_recomputed():
    g = tiny_chain()
    s = Schedule.from_computes(g, ["a", "b", "loss"], ["loss", "gb", "ga", "gp"])
    assert free("loss") not in s.steps
    result = simulate(g, s)
    assert "loss" not in result.saved
    bad = Schedule(forward=s.forward + (free("loss"),), backward=(compute("loss"),) + s.backward)
    with pytest.raises(InvalidScheduleError, match="held by the caller"):
        simulate(g, bad)


def _replayable_graph() -> RematGraph:
    """x -> s1 (saved state) -> d1 = dropout(x) replaying s1 -> s2 -> d2 = dropout(d1) -> loss."""
    nodes = (
        Node("x", NodeKind.INPUT, F, 10),
        op("s1", F, 5, [], cost=0.0, random=True),
        op("d1", F, 10, ["x", "s1"], random=True, rng_state="s1"),
        op("s2", F, 5, [], cost=0.0, random=True),
        op("d2", F, 10, ["d1", "s2"], random=True, rng_state="s2"),
        op("loss", F, 1, ["d2"]),
        Node("t", NodeKind.TANGENT, B, 1),
        op("g2", B, 10, ["t", "d2"]),
        op("g1", B, 10, ["g2", "d1"]),
    )
    return RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("g1",))


def test_a_replayable_random_op_may_be_recomputed_from_its_saved_state():
    g = _replayable_graph()
    assert not g["d1"].compute_once and g["d1"].replays_rng and g["s1"].compute_once
    forward = ["s1", "d1", "s2", "d2", "loss"]
    kept = simulate(g, Schedule.from_computes(g, forward, ["g2", "g1"]))
    replayed = simulate(g, Schedule.from_computes(g, forward, ["g2", "d1", "g1"]))
    assert dict(replayed.recomputed) == {"d1": 2}
    assert "s1" in replayed.saved and "d1" not in replayed.saved  # 5 bytes of state for 10 of output
    assert replayed.boundary_bytes == kept.boundary_bytes - 10 + 5


def test_a_replayable_random_op_draws_first_in_forward_in_order():
    g = _replayable_graph()
    late = Schedule(  # d1's first (drawing) run after s2 was taken: d2's state would be stale
        forward=(compute("s1"), compute("s2"), compute("d1"), compute("d2"), compute("loss")),
        backward=(compute("g2"), compute("g1")),
    )
    with pytest.raises(InvalidScheduleError, match="first run in forward, in the original order"):
        simulate(g, late)
    with pytest.raises(ValueError, match="replays 's1'"):
        RematGraph((Node("x", NodeKind.INPUT, F, 1), op("s1", F, 5, [], random=True),
                    op("d1", F, 1, ["x"], random=True, rng_state="s1")), ("d1",), ("d1",), ())
    dropped = Schedule.from_computes(g, ["s1", "d1", "s2", "d2", "loss"], ["g2", "g1"])
    assert dropped.computes("forward").count("d1") == 1  # the drawing run is never dropped


def test_a_schedule_simulated_again_on_its_graph_returns_its_result():
    """Solvers, hierarchical and the planner check the same schedules (seconds each on a
    10,000-step loop): the result is kept per (graph, schedule) object, and equals a fresh walk."""
    g = random_graph(3)
    schedule = recompute_all_schedule(g)
    first = simulate(g, schedule)
    assert simulate(g, schedule) is first
    again = Schedule(schedule.forward, schedule.backward)  # equal, another object: walked again
    fresh = simulate(g, again)
    assert fresh is not first and fresh == first
    seen: list[int] = []
    observed = simulate(g, schedule, lambda index, live_bytes, live, width: seen.append(live_bytes))
    assert observed == first and max(seen) == first.peak_bytes  # an observer always walks
    bad = Schedule(schedule.forward[1:], schedule.backward)
    for _ in range(2):  # errors are not kept: each call raises
        with pytest.raises(InvalidScheduleError):
            simulate(g, bad)
