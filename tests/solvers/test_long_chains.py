"""Long chains of multi-op stages (time-stepping loops): revolve, rotor, and auto choosing them.

The chain is the motivating model's shape, built without torch: step i computes
``a = W h`` (linear), ``t = tanh(a)``, ``m = 0.1 t``, ``h' = h + m``; its backward reads the
step's input h (weight gradient) and t (tanh's derivative), and accumulates the weight
gradient across steps.
"""

from __future__ import annotations

import gc
import itertools
import math
import random
import re
import time

import pytest
import torch
from exhaustive import exhaustive_optimum
from graphs import op
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

import frontends.capture.step
import solvers.auto
import solvers.baselines
import solvers.chain_model
import solvers.chen
import solvers.hierarchical
import solvers.remat_bound
import solvers.revolve
import solvers.rotor
from solvers import get_solver
from solvers.auto import solve_auto
from solvers.base import ScheduleTooLongError, SolverOptions, SolveStatus
from solvers.baselines import recompute_all_schedule, store_all_schedule
from solvers.chain_dp import solve_chain_dp
from solvers.chain_model import chain_model, coarsen
from solvers.checkmate.contract import classic_schedules
from solvers.chen import solve_chen_greedy, stage_weights, uniform_checkpoints
from solvers.highs_lp import LinearProgram
from solvers.ir.allocator import AllocatorModel
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph
from solvers.ir.schedule import Schedule, StepKind
from solvers.ir.simulator import simulate
from solvers.linearize import linearize
from solvers.planning.batch_search import classic_floor
from solvers.planning.sweep import run_sweep
from solvers.remat_bound import base_cost_bound, lower_bound
from solvers.revolve import (
    binomial_schedule,
    chain_steps,
    max_steps,
    min_recomputations,
    replay,
    revolve_backward,
    revolve_schedule,
    solve_revolve,
)
from solvers.rotor import dp_work, fits_work_limit, memory_step, solve_rotor

F, B = Phase.FORWARD, Phase.BACKWARD


def residual_chain(steps: int, size: int = 8, widths: list[int] | None = None,
                   random_every: int = 0, stem: bool = False) -> RematGraph:
    """``steps`` residual cells h <- h + 0.1 tanh(W h) sharing one weight W; ``widths`` scales
    each step's sizes and costs (a heterogeneous chain); ``random_every`` > 0 puts a run-once
    random op (dropout without replay) in every such step. Without ``stem`` the first cell
    reads the input, so its ops are single-op stages (as in the captured model); with it, a
    parameter-free op s = stem(x) comes first and every cell is one stage."""
    widths = widths or [1] * steps
    nodes = [Node("x", NodeKind.INPUT, F, size), Node("w", NodeKind.PARAMETER, F, size)]
    prev = "x"
    if stem:
        nodes.append(op("s", F, size, ["x"], cost=1.0))
        prev = "s"
    for i in range(steps):
        s = size * widths[i]
        nodes += [op(f"a{i}", F, s, [prev, "w"], cost=2.0 * widths[i]),
                  op(f"t{i}", F, s, [f"a{i}"], cost=1.0 * widths[i])]
        source = f"t{i}"
        if random_every and i % random_every == 0:
            nodes.append(op(f"d{i}", F, s, [source], cost=1.0, random=True))
            source = f"d{i}"
        nodes += [op(f"m{i}", F, s, [source], cost=1.0 * widths[i]),
                  op(f"h{i}", F, size, [prev, f"m{i}"], cost=1.0)]
        prev = f"h{i}"
    nodes.append(op("loss", F, 1, [prev]))
    nodes.append(Node("tan", NodeKind.TANGENT, B, 1))
    grad, acc = "tan", ""
    for i in reversed(range(steps)):
        inp = ("s" if stem else "x") if i == 0 else f"h{i - 1}"
        s = size * widths[i]
        source = f"d{i}" if random_every and i % random_every == 0 else f"t{i}"
        nodes += [op(f"gm{i}", B, s, [grad], cost=1.0 * widths[i]),
                  op(f"gt{i}", B, s, [f"gm{i}", f"t{i}"] + ([source] if source != f"t{i}" else []),
                     cost=1.0 * widths[i]),
                  op(f"gw{i}", B, size, [f"gt{i}", inp], cost=2.0 * widths[i])]
        if i > 0:  # the input needs no gradient
            nodes += [op(f"gx{i}", B, size, [f"gt{i}", "w"], cost=2.0 * widths[i]),
                      op(f"gh{i}", B, size, [grad, f"gx{i}"], cost=1.0)]
        if acc:
            nodes.append(op(f"acc{i}", B, size, [acc, f"gw{i}"], cost=1.0))
            acc = f"acc{i}"
        else:
            acc = f"gw{i}"
        grad = f"gh{i}"
    return RematGraph(tuple(nodes), forward_outputs=("loss",), user_outputs=("loss",),
                      backward_outputs=(acc,))


def _peaks(graph: RematGraph) -> tuple[int, int]:
    return (simulate(graph, recompute_all_schedule(graph)).peak_bytes,
            simulate(graph, store_all_schedule(graph)).peak_bytes)


def _on_graph(graph: RematGraph, abstract) -> tuple[Schedule, object]:
    forward = [n.name for n in graph.ops if n.phase is F]
    backward = revolve_backward(graph, chain_steps(graph), abstract, reuse_output=False)
    schedule = Schedule.from_computes(graph, forward, backward)
    return schedule, simulate(graph, schedule)


def _checkpoints_live(graph: RematGraph, schedule: Schedule, steps: int) -> int:
    """Most stage outputs h_i live at once."""
    outputs = {f"h{i}" for i in range(steps)}
    live: set[str] = set()
    most = 0
    for step in schedule.steps:
        if step.node in outputs:
            (live.add if step.kind is StepKind.COMPUTE else live.discard)(step.node)
            most = max(most, len(live))
    return most


# ------------------------------------------------------------- the binomial table on graphs
BINOMIAL = [(2, 2, 6), (3, 3, 20), (4, 3, 35), (5, 5, 252)]


@pytest.mark.parametrize("slots, sweeps, steps", BINOMIAL)
def test_binomial_table_from_the_solvers_schedules_on_multi_op_stages(
        slots: int, sweeps: int, steps: int) -> None:
    """A chain of C(c + r, c) steps (a stem op, then cells of four ops each) is reversed with
    c checkpoint slots (the input x in one) and no op run more than r + 1 times; one step more
    needs a sweep more."""
    assert max_steps(slots, sweeps) == math.comb(slots + sweeps, slots) == steps
    graph = residual_chain(steps - 1, stem=True)
    assert chain_steps(graph).n == steps + 1  # the stem, the cells, then the loss
    cells = steps - 1
    for abstract in (binomial_schedule(slots, sweeps), revolve_schedule(steps, slots)):
        assert abstract.steps == steps
        assert replay(abstract).max_recomputations == sweeps
        schedule, sim = _on_graph(graph, abstract)  # the simulator accepts it
        counts = schedule.compute_counts()
        # Every op of a stage is recomputed with it: the tape (a, t) once per sweep, the output
        # path (m, h) on advances only; nothing runs more than r + 1 times.
        assert max(counts.values()) == sweeps + 1
        evaluations = replay(abstract).evaluations
        for i in range(cells):
            assert counts[f"a{i}"] == counts[f"t{i}"] == evaluations[i + 2]
            assert counts[f"m{i}"] == counts[f"h{i}"] == evaluations[i + 2] - (i + 2 < steps)
        # x is slot 0; at most c - 1 stored outputs, plus the current state and its successor.
        assert _checkpoints_live(graph, schedule, cells) <= slots + 1
    assert min_recomputations(steps, slots) == sweeps
    assert min_recomputations(steps + 1, slots) == sweeps + 1


@pytest.mark.parametrize("slots, sweeps, steps", BINOMIAL[:3])
def test_solve_revolve_matches_the_binomial_schedule_at_its_peak(
        slots: int, sweeps: int, steps: int) -> None:
    graph = residual_chain(steps - 1, stem=True)
    _, sim = _on_graph(graph, revolve_schedule(steps, slots))
    result = solve_revolve(graph, sim.peak_bytes, SolverOptions())
    assert result.schedule is not None
    assert simulate(graph, result.schedule).peak_bytes <= sim.peak_bytes
    assert result.objective <= sim.total_cost + 1e-9


# --------------------------------------------------------------------------- rotor
def test_rotor_and_revolve_on_a_small_chain_against_the_exhaustive_optimum() -> None:
    graph = residual_chain(2, widths=[2, 1])
    low, high = _peaks(graph)
    for budget in range(low, high + 1, max(1, (high - low) // 3)):
        optimum = exhaustive_optimum(graph, budget)
        for solve in (solve_rotor, solve_revolve):
            result = solve(graph, budget, SolverOptions())
            if result.schedule is None:
                continue
            sim = simulate(graph, result.schedule)
            assert sim.peak_bytes <= budget
            assert optimum is not None and result.objective >= optimum - 1e-9
            assert result.objective == pytest.approx(sim.total_cost)


@pytest.mark.parametrize("widths", [[1] * 8, [1, 3, 1, 2, 4, 1]])
def test_rotor_is_never_worse_than_revolve_and_close_to_chain_dp(widths: list[int]) -> None:
    """Rotor's family holds revolve's schedules (checkpoint-only advances, re-taping, kept top
    stages) and is chain-dp's without the early drop."""
    graph = residual_chain(len(widths), widths=widths)
    low, high = _peaks(graph)
    for budget in range(low, high, max(1, (high - low) // 4)):
        rotor = solve_rotor(graph, budget, SolverOptions())
        revolve = solve_revolve(graph, budget, SolverOptions())
        dp = solve_chain_dp(graph, budget, SolverOptions())
        if rotor.schedule is not None:
            assert simulate(graph, rotor.schedule).peak_bytes <= budget
        if revolve.schedule is not None and rotor.schedule is not None and widths == [1] * 8:
            assert rotor.objective <= revolve.objective + 1e-9
        if rotor.schedule is not None and dp.schedule is not None:
            assert dp.objective <= rotor.objective * 1.25 + 1e-9


def test_run_once_ops_are_kept_not_recomputed() -> None:
    graph = residual_chain(30, random_every=3)
    low, high = _peaks(graph)
    budget = (low + high) // 3
    for solve in (solve_rotor, solve_revolve):
        result = solve(graph, budget, SolverOptions())
        assert result.schedule is not None, result.message
        sim = simulate(graph, result.schedule)  # enforces run-once
        assert sim.peak_bytes <= budget
        assert all(result.schedule.compute_counts()[f"d{i}"] == 1 for i in range(0, 30, 3))
        assert sim.extra_cost > 0


def test_rotor_plans_a_chain_past_its_work_limit_with_super_stages() -> None:
    graph = residual_chain(200)  # (recompute-all is quadratic on a chain: not used here)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    budget = high // 2
    model = chain_model(graph)
    levels = budget * 5 // 4 // memory_step(model, budget * 5 // 4) + 1
    assert not fits_work_limit(model.n, levels)  # the old rotor refused this chain
    options = SolverOptions(time_limit_s=4)  # super-stages sized to the time limit
    rotor = solve_rotor(graph, budget, options)
    assert rotor.schedule is not None and "stages of" in rotor.message
    sim = simulate(graph, rotor.schedule)
    assert sim.peak_bytes <= budget and sim.total_cost == pytest.approx(rotor.objective)
    chen = solve_chen_greedy(graph, budget, options)
    assert rotor.objective <= chen.objective + 1e-9


def test_super_stages_merge_consecutive_stages_and_keep_the_chain() -> None:
    graph = residual_chain(20)
    lin = linearize(graph)
    merged = coarsen(lin, 3)
    assert len(merged.stages) == math.ceil(len(lin.stages) / 3)
    assert [v for s in merged.stages for v in s.values] == [v for s in lin.stages for v in s.values]
    assert merged.stages[0].boundary == lin.stages[2].boundary
    fine, coarse = chain_model(graph), chain_model(graph, 3)
    assert coarse.n == len(merged.stages)
    assert coarse.advance[1].cost == pytest.approx(sum(r.cost for r in fine.advance[1:4]))
    for k in range(1, coarse.n + 1):  # what the merged stages' backward reads is its tape
        fine_reads = {v for j in range(3 * k - 2, min(3 * k, fine.n) + 1) for v in fine.tape[j]}
        assert fine_reads <= set(coarse.tape[k])
        assert set(coarse.tape[k]) <= set(merged.stages[k - 1].values)


# --------------------------------------------------------------- auto on a long chain
def test_auto_uses_the_chain_solvers_on_a_long_chain_and_its_gap_is_honest(monkeypatch) -> None:
    for module in (solvers.auto, solvers.hierarchical):  # 30 steps stand for a long loop here
        monkeypatch.setattr(module, "LONG_CHAIN_STAGES", 16)
    graph = residual_chain(30)  # 240 op groups: auto goes hierarchical
    low, high = _peaks(graph)
    budget = low + (high - low) // 10
    options = SolverOptions(time_limit_s=15)
    rotor = solve_rotor(graph, budget, options)
    revolve = solve_revolve(graph, budget, options)
    answer = solve_auto(graph, budget, options)
    assert answer.schedule is not None
    sim = simulate(graph, answer.schedule)
    assert sim.peak_bytes <= budget
    assert answer.objective <= min(rotor.objective, revolve.objective) + 1e-9
    assert "rotor" in answer.message and "revolve" in answer.message
    assert answer.bound is not None and answer.bound <= answer.objective + 1e-9


def test_auto_proves_its_gap_on_a_long_chain_with_the_lp(monkeypatch) -> None:
    """The bound LP runs on a long chain (not the base cost) and proves the chain plan close."""
    for module in (solvers.auto, solvers.hierarchical):
        monkeypatch.setattr(module, "LONG_CHAIN_STAGES", 16)
    graph = residual_chain(30)
    low, high = _peaks(graph)
    budget = low + (high - low) // 10
    answer = solve_auto(graph, budget, SolverOptions(time_limit_s=20))
    base = sum(n.cost for n in graph.ops)
    assert answer.bound is not None and base < answer.bound <= answer.objective + 1e-9
    assert answer.gap is not None and answer.gap < 0.25


@pytest.mark.parametrize("why", ["the LP ended at the base cost", "past the LP's value cap"])
def test_no_lp_solution_means_no_rounding(monkeypatch, why: str) -> None:
    """With the base-cost bound (no LP solution) there is no saved set to round: repairing an
    empty one would recompute every backward input from the inputs (quadratic on a chain).
    Past `LONG_CHAIN_LP_MAX_VALUES` the LP is not even built (at 10,000 steps its build outlasted
    its share and ended at the base cost anyway)."""
    for module in (solvers.auto, solvers.hierarchical):
        monkeypatch.setattr(module, "LONG_CHAIN_STAGES", 16)
    if why == "past the LP's value cap":
        monkeypatch.setattr(solvers.hierarchical, "LONG_CHAIN_LP_MAX_VALUES", 100)
        bound = _refusing("the bound LP was built past the cap")
    else:
        bound = lambda graph, *a, **k: base_cost_bound(graph, "test: no LP")  # noqa: E731
    monkeypatch.setattr(solvers.hierarchical, "lower_bound", bound)
    monkeypatch.setattr(solvers.hierarchical, "repair_saved_set",
                        _refusing("repair_saved_set ran without an LP solution to round"))
    graph = residual_chain(30)
    low, high = _peaks(graph)
    answer = solve_auto(graph, low + (high - low) // 10, SolverOptions(time_limit_s=10))
    assert answer.schedule is not None and "lp-rounding -" in answer.message
    assert answer.bound == pytest.approx(sum(n.cost for n in graph.ops))


def _refusing(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(what)
    return refuse


def _uneven_chain_at(fraction: float) -> tuple[RematGraph, int]:
    """A 24-step chain of uneven widths and a budget ``fraction`` of the way from its leanest
    classic peak to store-all's."""
    graph = residual_chain(24, widths=[1 + (i % 3) for i in range(24)])
    low, high = _peaks(graph)
    return graph, low + int((high - low) * fraction)


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_primal_simplex_proves_the_same_bound(fraction: float) -> None:
    graph, budget = _uneven_chain_at(fraction)
    dual = lower_bound(graph, budget, time_limit_s=20)
    primal = lower_bound(graph, budget, time_limit_s=20, primal_simplex=True)
    assert dual.message == primal.message == "LP bound"
    assert primal.bound == pytest.approx(dual.bound, rel=1e-7)


@pytest.mark.parametrize("fraction", [0.05, 0.3])
def test_the_lower_bound_stays_below_the_chain_schedules(fraction: float) -> None:
    graph, budget = _uneven_chain_at(fraction)
    bound = lower_bound(graph, budget, time_limit_s=20)
    for solve in (solve_rotor, solve_revolve):
        result = solve(graph, budget, SolverOptions())
        if result.status is SolveStatus.HEURISTIC:
            assert bound.bound <= result.objective + 1e-9


def _uniform_checkpoints_reference(lin, weights: list[int], segments: int) -> tuple[str, ...]:
    """The quadratic original: nearest articulation value to each target, scanning them all."""
    cut_stages = [s.index for s in lin.stages if s.boundary]
    if segments <= 1 or not cut_stages:
        return ()
    prefix = [sum(weights[: i + 1]) for i in range(len(weights))]
    total = prefix[-1] or 1
    chosen: list[int] = []
    for j in range(1, segments):
        target = j * total / segments
        candidates = [i for i in cut_stages if not chosen or i > chosen[-1]]
        if not candidates:
            break
        chosen.append(min(candidates, key=lambda i: (abs(prefix[i] - target), i)))
    return tuple(lin.stages[i].boundary for i in chosen)


@pytest.mark.parametrize("seed", [0, 1])
def test_uniform_checkpoints_match_the_exhaustive_nearest_choice(seed: int) -> None:
    graph = residual_chain(40, widths=[1 + (i * (seed + 3)) % 4 for i in range(40)])
    lin = linearize(graph)
    weights = [w * (i % 3 != seed) for i, w in enumerate(stage_weights(graph, lin))]  # ties
    for k in range(1, len(lin.articulation) + 2):
        assert (uniform_checkpoints(graph, lin, k, weights)
                == _uniform_checkpoints_reference(lin, weights, k))


def test_chen_greedy_bisects_its_candidates_on_a_long_chain(monkeypatch) -> None:
    """A long chain has a candidate per segment count: simulating them all was most of the
    planning time at 1,000 steps; chen-greedy simulates O(log) of them plus a few neighbours."""
    graph = residual_chain(60)
    high = simulate(graph, store_all_schedule(graph)).peak_bytes
    calls: list[int] = []

    def counted(g, schedule):
        calls.append(1)
        return simulate(g, schedule)

    monkeypatch.setattr(solvers.chen, "simulate", counted)
    monkeypatch.setattr(solvers.chen, "_SIMULATE_ALL", 20)  # this chain stands for a long one
    answer = solve_chen_greedy(graph, high // 4, SolverOptions(time_limit_s=60))
    assert answer.schedule is not None and simulate(graph, answer.schedule).peak_bytes <= high // 4
    candidates = int(re.search(r"of (\d+) candidates", answer.message)[1])
    assert candidates > 60
    assert 0 < len(calls) <= math.ceil(math.log2(candidates)) + 2 * solvers.chen._NEIGHBOURS + 2


# --------------------------------------------------------------- capture time on long loops
def test_capture_traces_without_cyclic_collections_and_restores_the_collector(monkeypatch) -> None:
    """Each automatic collection walks every object torch's tracers keep alive: on a long loop
    they made capture quadratic. None may run while AOTAutograd traces; the collector is on
    after capture."""
    started: list[int] = []
    tracing = [False]

    def count(phase: str, info: dict) -> None:
        if phase == "start" and tracing[0]:
            started.append(info["generation"])

    def traced(*args, **kwargs):
        tracing[0] = True
        try:
            return aot_export_joint_with_descriptors(*args, **kwargs)
        finally:
            tracing[0] = False

    monkeypatch.setattr(frontends.capture.step, "aot_export_joint_with_descriptors", traced)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(8)])
    gc.callbacks.append(count)
    try:
        step = frontends.capture.step.capture(model, (torch.randn(2, 4),))
    finally:
        gc.callbacks.remove(count)
    assert len(step.graph.ops) > 20
    assert started == []
    assert gc.isenabled()


def test_capture_generates_the_joints_code_only_when_read(monkeypatch) -> None:
    """AOTAutograd generated and compiled the joint's Python code twice, and capture never runs
    it (10,000 steps: two 120,000-line compiles). The joint is a lazy graph module: no code is
    generated for it during capture, and reading ``.code`` gives what an eager module has."""
    generated: list[torch.fx.Graph] = []
    python_code = torch.fx.Graph.python_code

    def counted(self, *args, **kwargs):
        generated.append(self)
        return python_code(self, *args, **kwargs)

    monkeypatch.setattr(torch.fx.Graph, "python_code", counted)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    step = frontends.capture.step.capture(model, (torch.randn(2, 4),))
    assert generated and not any(g is step.gm.graph for g in generated)  # export's modules did
    assert isinstance(step.gm, torch.fx.GraphModule)
    code = step.gm.code
    assert any(g is step.gm.graph for g in generated)
    assert code == torch.fx.GraphModule(step.gm, step.gm.graph).code


def _fx_trees(step) -> list:
    trees = []
    for node in step.gm.graph.nodes:
        trees += [(node.args, node.kwargs), node.meta.get("val")]
    return trees


def test_flat_leaves_are_pytrees_leaves() -> None:
    """`frontends.capture.fx_leaves.flat_leaves` (the IR's fast flatten) returns tree_flatten's leaves in
    tree_flatten's order: for every node's arguments and value of a captured step, and for the
    containers it hands to pytree (namedtuples, OrderedDict, deque, torch.Size)."""
    from collections import OrderedDict, deque, namedtuple

    from torch.fx.immutable_collections import immutable_dict, immutable_list
    from torch.utils._pytree import tree_flatten

    from frontends.capture.fx_leaves import flat_leaves

    pair = namedtuple("pair", "a b")
    t = torch.ones(2)
    trees = [None, 3, t, (t, [t, {"k": t, "j": (1, None)}]), immutable_list([t, immutable_dict(a=t, b=[2])]),
             pair(t, [t]), OrderedDict(b=t, a=1), deque([t, (t,)]), torch.Size([2, 3]), slice(1, 2),
             {"z": 1, "a": [pair(1, 2), torch.float32, torch.device("cpu")]}, ((), [], {})]
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Dropout(0.1),
                                torch.nn.GELU(), torch.nn.Linear(8, 2))
    trees += _fx_trees(frontends.capture.step.capture(model, (torch.randn(4, 8),)))
    for tree in trees:
        expected = tree_flatten(tree)[0]
        got = flat_leaves(tree)
        assert len(got) == len(expected) and all(a is b for a, b in zip(got, expected)), tree


def test_ir_is_the_same_with_pytrees_flatten(monkeypatch) -> None:
    """The IR built with the fast flatten equals the IR built with torch's pytree (values,
    bytes, costs, inputs, groups), on a step with multi-output ops, kwargs and random ops."""
    from torch.utils._pytree import tree_flatten

    import frontends.measure.costs

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Dropout(0.1),
                                torch.nn.GELU(), torch.nn.Linear(8, 2))
    step = frontends.capture.step.capture(model, (torch.randn(4, 8),))
    fast = frontends.capture.step.build_remat_graph(step.gm)
    for module in (frontends.capture.step, frontends.measure.costs):
        monkeypatch.setattr(module, "flat_leaves", lambda tree: tree_flatten(tree)[0])
    assert frontends.capture.step.build_remat_graph(step.gm) == fast
    assert any(len(members) > 1 for members in fast[0].groups.values())  # layer norm's siblings


# ------------------------------------------------- recompute-all's length on long chains
@pytest.mark.parametrize("steps", [3, 12, 40])
def test_recompute_all_estimate_bounds_its_recomputations(steps: int) -> None:
    graph = residual_chain(steps, widths=[1 + (i % 2) for i in range(steps)])
    schedule = recompute_all_schedule(graph)
    forward = sum(1 for n in graph.ops if n.phase is F)
    recomputed = sum(1 for s in schedule.steps if s.kind is StepKind.COMPUTE) - len(graph.ops)
    estimate = solvers.baselines.recompute_all_steps_estimate(graph)
    assert recomputed <= estimate <= 2 * recomputed + forward  # an upper bound, and not loose


def test_hierarchical_skips_recompute_all_past_its_cap(monkeypatch) -> None:
    """Past RECOMPUTE_ALL_MAX_STEPS recompute-all is never built (10,000 steps: 400 million
    recomputations), and the other schedules still answer. 30 stages: not a long chain, so
    hierarchical would offer recompute-all."""
    monkeypatch.setattr(solvers.baselines, "RECOMPUTE_ALL_MAX_STEPS", 10)

    def no_recompute_all(graph):
        raise AssertionError("recompute-all was built past its cap")

    monkeypatch.setattr(solvers.baselines, "recompute_all_schedule", no_recompute_all)
    graph = residual_chain(30)  # 240 op groups: auto goes hierarchical
    low, high = _peaks(graph)
    budget = low + (high - low) // 3
    answer = solve_auto(graph, budget, SolverOptions(time_limit_s=10))
    assert answer.schedule is not None and simulate(graph, answer.schedule).peak_bytes <= budget
    assert "recompute-all -" in answer.message


@pytest.mark.skipif(frontends.capture.step.resource is None, reason="no POSIX stack limit here")
def test_capture_traces_with_the_hard_stack_limit_and_restores_it(monkeypatch) -> None:
    """AOTAutograd's joint trace recurses in C through the autograd graph: a 10,000-step loop
    overflowed the 8 MiB soft stack limit (a segmentation fault). The trace runs with the hard
    limit; the caller's limit is back after capture."""
    resource = frontends.capture.step.resource
    before = resource.getrlimit(resource.RLIMIT_STACK)
    seen: list[tuple[int, int]] = []

    def traced(*args, **kwargs):
        seen.append(resource.getrlimit(resource.RLIMIT_STACK))
        return aot_export_joint_with_descriptors(*args, **kwargs)

    monkeypatch.setattr(frontends.capture.step, "aot_export_joint_with_descriptors", traced)
    frontends.capture.step.capture(torch.nn.Linear(4, 4), (torch.randn(2, 4),))
    assert seen == [(before[1], before[1])]
    assert resource.getrlimit(resource.RLIMIT_STACK) == before


# ------------------------------------------- time shares on long chains (issue 25, 10,000 steps)
def _slow_simulations(monkeypatch, module, seconds: float) -> list[tuple[float, float]]:
    """Make every simulation ``module`` runs take ``seconds`` longer (a 10,000-step loop's take
    seconds); returns the (start, end) of each, filled as they run."""
    real = module.simulate
    log: list[tuple[float, float]] = []

    def slow(graph, schedule, *args):
        began = time.perf_counter()
        time.sleep(seconds)
        result = real(graph, schedule, *args)
        log.append((began, time.perf_counter()))
        return result

    monkeypatch.setattr(module, "simulate", slow)
    return log


def _tenth(graph: RematGraph) -> int:
    """10% of store-all's peak (recompute-all is quadratic on a long chain: not used here)."""
    return simulate(graph, store_all_schedule(graph)).peak_bytes // 10


def test_chen_greedy_with_a_tiny_time_limit_still_returns_a_simulated_schedule(monkeypatch) -> None:
    """A long chain has a candidate per segment count: building them all was quadratic in its
    length (137 s of a 30 s share at 10,000 steps) and the limit then left no time to simulate
    any. Now the candidates are ranked without being built, the leanest uniform split is
    simulated first, whatever the limit, and nothing after it once the limit has passed."""
    graph = residual_chain(300)
    budget = _tenth(graph)
    built: list[int] = []
    real_uniform = solvers.chen.uniform_checkpoints

    def counted(*args, **kwargs):
        built.append(1)
        return real_uniform(*args, **kwargs)

    monkeypatch.setattr(solvers.chen, "uniform_checkpoints", counted)
    log = _slow_simulations(monkeypatch, solvers.chen, 0.0)
    answer = solve_chen_greedy(graph, budget, SolverOptions(time_limit_s=1e-3))
    assert answer.status is SolveStatus.HEURISTIC and answer.schedule is not None
    sim = simulate(graph, answer.schedule)
    assert sim.peak_bytes <= budget and sim.total_cost == pytest.approx(answer.objective)
    assert len(log) == 1 and "1 of" in answer.message
    assert int(re.search(r"of (\d+) candidates", answer.message)[1]) > 300
    assert len(built) <= 2  # the simulated split only, not one per segment count


def test_chen_greedy_starts_no_simulation_that_would_end_past_its_limit(monkeypatch) -> None:
    graph = residual_chain(300)
    budget = _tenth(graph)
    log = _slow_simulations(monkeypatch, solvers.chen, 0.25)
    start = time.perf_counter()
    answer = solve_chen_greedy(graph, budget, SolverOptions(time_limit_s=1.0))
    assert answer.schedule is not None and simulate(graph, answer.schedule).peak_bytes <= budget
    assert len(log) >= 2  # it used its time
    assert all(end <= start + 1.0 + 0.1 for _, end in log[1:])


def test_chen_greedy_on_a_long_chain_is_never_worse_than_its_first_candidate() -> None:
    """The bisection starts from the leanest uniform split and keeps the cheapest that fits."""
    graph = residual_chain(300)
    budget = _tenth(graph)
    lin = linearize(graph)
    weights = stage_weights(graph, lin)
    first = solvers.chen.chen_schedule(
        graph, lin, uniform_checkpoints(graph, lin, solvers.chen._leanest_segments(graph, lin, weights),
                                        weights))
    first_sim = simulate(graph, first)
    answer = solve_chen_greedy(graph, budget, SolverOptions(time_limit_s=60))
    assert first_sim.peak_bytes <= budget  # the leanest split fits at 10%
    assert answer.objective <= first_sim.total_cost + 1e-12
    assert int(re.search(r"(\d+) of", answer.message)[1]) > 3  # it searched past the first


def test_rotor_sizes_its_dp_for_the_time_the_chain_model_leaves(monkeypatch) -> None:
    """Measuring the chain model takes seconds on a 10,000-step loop: the DP used to be sized
    for the whole limit, then ran out of it (nothing found in 18 s). It is sized for what the
    model leaves."""
    graph = residual_chain(300)
    budget = _tenth(graph)
    real_model = solvers.rotor.chain_model
    slow = 1.5

    def slow_model(*args, **kwargs):
        time.sleep(slow)
        return real_model(*args, **kwargs)

    monkeypatch.setattr(solvers.rotor, "chain_model", slow_model)
    limit = 4.0
    answer = solve_rotor(graph, budget, SolverOptions(time_limit_s=limit))
    found = re.search(r"memory step (\d+) bytes; (\d+) stages", answer.message)
    assert found, answer.message
    step, stages = int(found[1]), int(found[2])
    levels = int(budget * solvers.rotor._HEADROOM) // step + 1
    assert dp_work(stages, levels) <= (solvers.rotor.WORK_PER_SECOND * solvers.rotor.DP_TIME_SHARE
                                       * (limit - slow))
    if answer.schedule is not None:
        assert simulate(graph, answer.schedule).peak_bytes <= budget


def test_rotor_and_revolve_start_no_simulation_that_would_end_past_their_limit(monkeypatch) -> None:
    graph = residual_chain(300)
    budget = _tenth(graph)
    for module, solve in ((solvers.rotor, solve_rotor), (solvers.revolve, solve_revolve)):
        log = _slow_simulations(monkeypatch, module, 0.4)
        start = time.perf_counter()
        limit = 2.5
        answer = solve(graph, budget, SolverOptions(time_limit_s=limit))
        assert log, module.__name__
        assert all(end <= start + limit + 0.15 for _, end in log[1:]), module.__name__
        if answer.schedule is not None:
            assert simulate(graph, answer.schedule).peak_bytes <= budget


def test_the_bound_lp_stops_building_at_its_deadline() -> None:
    """At 10,000 steps the LP's build alone (14 million coefficients) outlasts a minute: past
    its deadline it stops with the base cost, a valid bound, instead of overrunning."""
    graph, budget = _uneven_chain_at(0.05)
    started = time.perf_counter()
    late = lower_bound(graph, budget, time_limit_s=20, deadline=started)
    assert late.message.startswith("base cost only: no time left to build the LP")
    assert late.bound == late.base_cost and not late.proven_infeasible
    assert time.perf_counter() - started < 5
    full = lower_bound(graph, budget, time_limit_s=20)
    assert full.bound > late.bound and full.base_cost == late.base_cost
    assert lower_bound(graph, budget, time_limit_s=20, deadline=math.inf).bound == full.bound


def test_the_bound_lp_is_not_started_when_it_cannot_be_set_up_in_time(monkeypatch) -> None:
    """HiGHS honours its time limit only once the model is set up and presolved: 35 s for a
    10,000-step loop's 13 million coefficients, given 1.2 s. An LP the time left cannot set up
    is not started."""
    graph, budget = _uneven_chain_at(0.05)

    def no_solve(*args, **kwargs):
        raise AssertionError("the LP was solved")

    monkeypatch.setattr(LinearProgram, "solve", no_solve)
    monkeypatch.setattr(solvers.remat_bound, "LP_SETUP_RATE", 10.0)  # 10 coefficients a second
    skipped = lower_bound(graph, budget, time_limit_s=20, deadline=time.perf_counter() + 20)
    assert "too little to set up the LP's" in skipped.message
    assert skipped.bound == skipped.base_cost


def test_hierarchical_gives_the_bound_lp_a_deadline_on_a_long_chain(monkeypatch) -> None:
    for module in (solvers.auto, solvers.hierarchical):
        monkeypatch.setattr(module, "LONG_CHAIN_STAGES", 16)
    seen: list[float] = []
    real = solvers.hierarchical.lower_bound

    def spy(*args, **kwargs):
        seen.append(kwargs["deadline"])
        return real(*args, **kwargs)

    monkeypatch.setattr(solvers.hierarchical, "lower_bound", spy)
    graph = residual_chain(30)
    low, high = _peaks(graph)
    start = time.perf_counter()
    answer = solve_auto(graph, low + (high - low) // 10, SolverOptions(time_limit_s=30))
    assert answer.schedule is not None and seen  # the LP, and maybe a tighter one at the end
    assert all(start < deadline <= start + 31 for deadline in seen)  # hierarchical starts a little later


def test_auto_on_a_long_chain_keeps_to_its_time_limit_with_slow_simulations(monkeypatch) -> None:
    """Every phase auto runs on a long chain keeps to its share, simulations included (seconds
    each at 10,000 steps: chen-greedy alone took 137 s of a 60 s plan there)."""
    graph = residual_chain(300)  # 300 stages: a long chain
    budget = _tenth(graph)
    for module in (solvers.chen, solvers.rotor, solvers.revolve, solvers.hierarchical):
        _slow_simulations(monkeypatch, module, 0.3)
    limit = 8.0
    start = time.perf_counter()
    answer = solve_auto(graph, budget, SolverOptions(time_limit_s=limit))
    elapsed = time.perf_counter() - start
    assert answer.schedule is not None and simulate(graph, answer.schedule).peak_bytes <= budget
    # rotor ran within its share and is the answer, unless a later phase (swaps, repair) improved
    # on it in the time left (a machine under load gives the phases other shares: swaps 5268 < 5270)
    tried = dict(re.findall(r"(\S+) (\d+|-)(?:,|$)", answer.message.split("tried: ")[1]))
    assert tried["rotor"] != "-", answer.message
    best = answer.message.split("best: ")[1].split(";")[0]
    assert best == "rotor" or (tried.get(best, "-") != "-" and int(tried[best]) <= int(tried["rotor"])), answer.message
    assert elapsed <= 1.2 * limit + 1.0, elapsed


# --------------------------------------------------------- recompute-all past its cap, by name
def test_recompute_all_by_name_refuses_a_chain_past_its_cap(monkeypatch) -> None:
    """By name it used to build its schedule whatever its length (400 million recomputations
    at 10,000 steps: practically forever); now it refuses, naming the estimate and a solver
    that scales. The classic schedules (the what-if classic floor) skip it."""
    monkeypatch.setattr(solvers.baselines, "RECOMPUTE_ALL_MAX_STEPS", 10)

    def no_recompute_all(graph):
        raise AssertionError("recompute-all was built past its cap")

    monkeypatch.setattr(solvers.baselines, "recompute_all_schedule", no_recompute_all)
    graph = residual_chain(30)
    estimate = solvers.baselines.recompute_all_steps_estimate(graph)
    with pytest.raises(ScheduleTooLongError) as refused:
        get_solver("recompute-all")(graph, 10**9, SolverOptions())
    assert f"up to {estimate:,} ops" in str(refused.value)
    assert "'rotor'" in str(refused.value) and "'auto'" in str(refused.value)
    assert [c.name for c in classic_schedules(graph)] == ["store-all"]
    store = simulate(graph, store_all_schedule(graph)).peak_bytes
    assert classic_floor(lambda batch: graph, store, AllocatorModel(block_bytes=1), limit=4) == 4
    sweep = run_sweep(graph, [store], strategies=("recompute-all",))
    [point] = sweep.points_of("recompute-all")
    assert point.status == "not-applicable" and "past its cap" in point.message


def test_recompute_all_by_name_still_runs_within_its_cap() -> None:
    graph = residual_chain(12)
    answer = get_solver("recompute-all")(graph, 10**9, SolverOptions())
    assert answer.schedule is not None
    assert answer.objective == simulate(graph, recompute_all_schedule(graph)).total_cost


# ----------------------------------------------------- linear-time pieces, against the originals
def _walk_reference(graph: RematGraph, order: list[str], targets: set[str], pinned: set[str]):
    """The quadratic original of `solvers.chain_model._walk` (every live value checked after
    each run; the live bytes summed each time)."""
    reads: dict[str, int] = {}
    runs = []
    i = 0
    while i < len(order):
        members = graph.group_of(order[i])
        runs.append(members)
        for inp in dict.fromkeys(graph[members[0]].inputs):
            reads[inp] = reads.get(inp, 0) + 1
        i += len(members)
    live: dict[str, int] = {}
    peak = cost = 0.0
    for members in runs:
        first = graph[members[0]]
        alloc = sum(graph[m].bytes for m in members if m not in pinned)
        peak = max(peak, sum(live.values()) + alloc + first.temp_bytes)
        cost += first.cost
        for m in members:
            if m not in pinned:
                live[m] = graph[m].bytes
        for inp in dict.fromkeys(first.inputs):
            reads[inp] -= 1
        for name in list(live):
            if reads.get(name, 0) == 0 and name not in targets:
                del live[name]
    return float(cost), int(peak)


@pytest.mark.parametrize("size", [1, 4])
def test_chain_model_walks_match_the_quadratic_originals(size: int) -> None:
    graph = residual_chain(24, widths=[1 + (i % 3) for i in range(24)], random_every=5)
    model = chain_model(graph, size)
    pinned = solvers.chain_model.pinned_values(graph)
    checked = 0
    for recompute in (*model.advance, *model.advance_tape, *model.retape):
        if recompute.order:
            targets = set(recompute.order) & {v for k in range(model.n + 1)
                                              for v in (model.boundary[k], *model.tape[k])}
            reference = _walk_reference(graph, list(recompute.order), targets, pinned)
            walked = solvers.chain_model._walk(graph, list(recompute.order), targets, pinned)
            assert (walked.cost, walked.peak) == reference
            checked += 1
    assert checked > model.n


def test_the_lp_matrix_is_built_column_wise_as_before() -> None:
    """`LinearProgram._columns` (numpy) against the Python loop it replaced."""
    rng = random.Random(0)
    for _ in range(20):
        lp = LinearProgram()
        n = rng.randint(1, 30)
        for _ in range(n):
            lp.add_var(rng.random())
        for _ in range(rng.randint(0, 40)):
            lp.add_row({c: rng.uniform(-3, 3) for c in rng.sample(range(n), rng.randint(0, min(n, 6)))},
                       lower=-1.0)
        columns: list[list[tuple[int, float]]] = [[] for _ in range(n)]
        for r, (index, value) in enumerate(lp.rows):
            for i, v in zip(index, value):
                columns[i].append((r, v))
        starts, rows, values = lp._columns()
        assert list(starts) == [0, *itertools.accumulate(len(c) for c in columns)]
        assert list(rows) == [r for c in columns for r, _ in c]
        assert list(values) == [v for c in columns for _, v in c]


def test_a_long_chain_left_above_one_percent_gets_the_tighter_bound(monkeypatch) -> None:
    """The first LP (4 snapshots, no rule 6) leaves the chain's plan more than 1% above it: the
    LP is solved again with 32 snapshots and rule 6, and the answer's bound is the higher one."""
    for module in (solvers.auto, solvers.hierarchical):
        monkeypatch.setattr(module, "LONG_CHAIN_STAGES", 16)
    calls: list[tuple[dict, float]] = []
    real = solvers.hierarchical.lower_bound

    def spy(*args, **kwargs):
        found = real(*args, **kwargs)
        calls.append((kwargs, found.bound))
        return found

    monkeypatch.setattr(solvers.hierarchical, "lower_bound", spy)
    graph = residual_chain(30)
    low, high = _peaks(graph)
    answer = solve_auto(graph, low + (high - low) // 10, SolverOptions(time_limit_s=30))
    (first, first_bound), *rest = calls
    assert first["snapshots"] == solvers.hierarchical.LONG_CHAIN_SNAPSHOTS and not first["second_runs"]
    if answer.objective <= first_bound * 1.01:
        pytest.skip("the chain schedules came within 1% of the first bound: nothing to tighten")
    assert len(rest) == 1 and rest[0][0]["snapshots"] == solvers.hierarchical.TIGHT_BOUND_SNAPSHOTS
    assert answer.bound == pytest.approx(min(max(first_bound, rest[0][1]), answer.objective))
