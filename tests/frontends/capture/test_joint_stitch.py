"""Long loops: the joint written from three short traces is the joint AOTAutograd traces whole.

`frontends.capture.joint_stitch` is only trusted where it reproduces traced joints; these tests hold it
to the whole trace itself on loops of several kinds (plain cells, a multi-output op, dropout,
a state of two tensors), check that a loop it cannot cut falls back to the whole trace, and run
the rewritten module of a stitched capture against eager autograd.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from e2e_helpers import max_relative_error, measured_peak, train_step
from torch import nn

import frontends.capture.joint_stitch
import frontends.capture.step
from frontends.capture.joint_stitch import canonical_form, joint_of_long_loop
from frontends.capture.repeated_body import NotRepeated, collapse_run, find_repeated_run
from frontends.capture.step import capture
from optimizer import optimize

STEPS = 40


class Residual(nn.Module):
    """``h <- h + 0.1 cell(h)`` ``steps`` times (the issue's time-stepping loop, small)."""

    def __init__(self, cell: nn.Module, steps: int = STEPS, read_early: bool = False):
        super().__init__()
        self.cell, self.steps, self.read_early = cell, steps, read_early

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        early = None
        for i in range(self.steps):
            h = h + 0.1 * self.cell(h)
            if i == 1:
                early = h
        return (h + early).sum() if self.read_early else h.sum()


class TwoStates(nn.Module):
    """A leapfrog-like loop whose state is two tensors, each step reading both."""

    def __init__(self, width: int = 8, steps: int = STEPS):
        super().__init__()
        self.force, self.steps = nn.Linear(width, width), steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = torch.zeros_like(x)
        for _ in range(self.steps):
            v = v + 0.05 * torch.tanh(self.force(x))
            x = x + 0.05 * v
        return (x * x).sum()


def _cells() -> dict[str, nn.Module]:
    return {
        "linear-tanh": nn.Sequential(nn.Linear(8, 8), nn.Tanh()),
        "layer-norm (a multi-output op)": nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.GELU()),
        "dropout": nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Tanh()),
    }


def _same_ir(a, b) -> bool:
    """The two captures' IRs are equal up to node names (the stitch names its nodes as fx's
    namespace does; the whole trace's counters also count nodes its dead-code pass removed)."""
    return _renamed(a) == _renamed(b)


def _renamed(step) -> list:
    number = {node.name: f"n{i}" for i, node in enumerate(step.gm.graph.nodes)}
    return [dataclasses.replace(node, name=number[node.name], group=number.get(node.group, node.group),
                                inputs=tuple(number[i] for i in node.inputs),
                                reuses=tuple(number[r] for r in node.reuses)) for node in step.graph.nodes]


def _whole_and_stitched(model: nn.Module, x: torch.Tensor):
    torch.manual_seed(0)
    whole = capture(model, (x,), stitch_loops=False)
    torch.manual_seed(0)
    stitched = capture(model, (x,))
    return whole, stitched


@pytest.mark.parametrize("kind", list(_cells()))
def test_the_stitched_joint_is_the_whole_trace(kind: str) -> None:
    torch.manual_seed(0)
    model = Residual(_cells()[kind])
    whole, stitched = _whole_and_stitched(model, torch.randn(4, 8))
    assert whole.stitched_loop is None
    assert stitched.stitched_loop is not None and stitched.stitched_loop.count >= STEPS - 2
    assert canonical_form(stitched.gm) == canonical_form(whole.gm)
    assert _same_ir(stitched, whole)


def test_a_state_of_two_tensors_is_stitched_exactly() -> None:
    torch.manual_seed(0)
    whole, stitched = _whole_and_stitched(TwoStates(), torch.randn(4, 8))
    assert stitched.stitched_loop is not None
    assert canonical_form(stitched.gm) == canonical_form(whole.gm)
    assert _same_ir(stitched, whole)


def test_a_loop_whose_end_reads_an_early_step_is_traced_whole() -> None:
    """The loss reads step 2's state: cutting copies out of the middle would change which
    copy that is, so the run is not cut, and the capture is the whole trace."""
    torch.manual_seed(0)
    model = Residual(nn.Sequential(nn.Linear(8, 8), nn.Tanh()), read_early=True)
    whole, stitched = _whole_and_stitched(model, torch.randn(4, 8))
    assert stitched.stitched_loop is None
    assert canonical_form(stitched.gm) == canonical_form(whole.gm)


def test_a_stitch_that_fails_its_check_leaves_the_whole_trace_as_it_would_be(monkeypatch) -> None:
    """The short joints were traced (each in its own contexts) and then no recipe reproduced
    them: the whole trace runs after them and is the same as without them."""
    torch.manual_seed(0)
    model = Residual(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    whole = capture(model, (torch.randn(4, 8),), stitch_loops=False)

    def no_recipe(joints):
        assert len(joints) == 3
        raise NotRepeated("test: no recipe")

    monkeypatch.setattr(frontends.capture.joint_stitch, "learn_stitch", no_recipe)
    torch.manual_seed(0)
    fallback = capture(model, (torch.randn(4, 8),))
    assert fallback.stitched_loop is None
    assert canonical_form(fallback.gm) == canonical_form(whole.gm)
    assert _same_ir(fallback, whole)


def test_the_repeated_run_is_found_and_cut_to_the_copies_asked_for() -> None:
    model = Residual(nn.Sequential(nn.Linear(8, 8), nn.Tanh()))
    forward = torch.export.export(model, (torch.randn(4, 8),), strict=False).module()
    run = find_repeated_run(forward.graph)
    assert run is not None and run.period == 4 and run.count >= STEPS - 2  # addmm, tanh, mul, add
    nodes = list(forward.graph.nodes)
    assert [n.target for n in nodes[run.start:run.start + run.period]] == \
        [n.target for n in nodes[run.start + run.period:run.start + 2 * run.period]]
    short = collapse_run(forward, run, 2, 2)
    assert len(short.graph.nodes) == len(nodes) - (run.count - 4) * run.period
    x = torch.randn(4, 8)
    expected = Residual(model.cell, steps=STEPS - (run.count - 4))(x)
    assert torch.allclose(short(x), expected)
    with pytest.raises(NotRepeated):
        collapse_run(forward, run, run.count, 1)


def test_distinct_layers_are_not_a_run() -> None:
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(20)])
    forward = torch.export.export(model, (torch.randn(4, 8),), strict=False).module()
    assert find_repeated_run(forward.graph) is None  # each layer reads its own parameters


def test_a_stitched_plan_gives_eagers_gradients_at_its_predicted_peak(monkeypatch) -> None:
    stitched = []

    def recorded(*args):
        made = joint_of_long_loop(*args)
        stitched.append(made is not None)
        return made

    monkeypatch.setattr(frontends.capture.step, "joint_of_long_loop", recorded)
    torch.manual_seed(0)
    model = Residual(nn.Sequential(nn.Linear(16, 16), nn.Tanh()), steps=60).double()
    x = torch.randn(32, 16, dtype=torch.float64)
    rm = optimize(model, (x,), "20%")
    assert stitched == [True]
    assert rm.plan.predicted_peak_bytes <= rm.plan.budget_bytes
    _, expected = train_step(model, (x,))
    _, grads = train_step(rm, (x,))
    assert max_relative_error(grads, expected) < 1e-10
    measured = measured_peak(rm, (x,))
    assert abs(measured - rm.plan.predicted_peak_bytes) <= 64, (measured, rm.plan.predicted_peak_bytes)
