"""The graph runtime writes accumulations in place where the simulator says so (`solvers.ir.inplace`):
measured peaks still equal predicted ones, gradients still equal eager's, and backward writes into
nothing forward saved."""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import clone, load_example, max_relative_error, measured_peak, train_step

from optimizer import optimize
from solvers.ir.inplace import donations

aten = torch.ops.aten


def _in_place_nodes(remat) -> int:
    return sum(n.target is aten.add_.Tensor for g in (remat.forward_graph, remat.backward_graph)
               for n in g.graph.nodes)


@pytest.mark.parametrize("example, budget", [("gpt", "100%"), ("gpt", "60%"), ("convnet", "100%"), ("convnet", "70%")])
def test_accumulations_run_in_place_and_memory_is_as_predicted(example, budget):
    model, inputs = load_example(example, dropout=0.0) if example == "gpt" else load_example(example)
    remat = optimize(clone(model), inputs, budget, solver="greedy")  # the rule, not the solver, is tested
    in_place = _in_place_nodes(remat)
    assert in_place > 0  # both models sum gradients (residual branches, shared inputs)
    assert in_place == len(donations(remat._planned_graph, remat.plan.schedule))
    assert measured_peak(remat, inputs) == remat.plan.predicted_peak_bytes
    _, want = train_step(clone(model), inputs)
    _, got = train_step(remat, inputs)
    assert max_relative_error(got, want) < 1e-10


def test_no_saved_value_or_output_gradient_is_written():
    """Backward writes only into values it computed itself: a placeholder of the backward graph
    (a value forward saved, an output gradient) is never the target of an in-place op."""
    model, inputs = load_example("gpt", dropout=0.0)
    remat = optimize(clone(model), inputs, "60%", solver="greedy")
    backward = remat.backward_graph.graph
    written = [n.args[0] for n in backward.nodes if n.target is aten.add_.Tensor]
    assert written and all(w.op == "call_function" for w in written)
    assert all(n.target is not aten.add_.Tensor for n in backward.nodes
               if any(a.op == "placeholder" for a in n.all_input_nodes[:1]))
