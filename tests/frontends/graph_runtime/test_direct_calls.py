"""The rewritten graphs call each op's C++ entry point directly (`direct_calls`): the same
statements and frees as fx's code, the same values bit for bit, and fx's own code where
``OpOverload.__call__`` does more than forward."""

from __future__ import annotations

import torch
from e2e_helpers import clone, load_example, max_relative_error, measured_peak, train_step

from frontends.graph_runtime.direct_calls import call_ops_directly, direct_source
from frontends.torch_compat import OpOverload, op_overload_call_only_forwards
from optimizer import optimize


def _runs_direct_code(gm: torch.fx.GraphModule) -> bool:
    return type(gm).forward.__code__.co_filename.startswith("<remat-opt graph")


def test_every_aten_call_is_bound_directly_and_the_frees_are_fx_s():
    model, inputs = load_example("gpt", dropout=0.1)
    remat = optimize(clone(model), inputs, "60%", solver="greedy")
    for gm in (remat.forward_graph, remat.backward_graph):
        assert _runs_direct_code(gm)
        source, namespace = direct_source(gm)
        assert "torch.ops.aten." not in source  # every overload named by a bound global
        fx_code = gm.code
        assert fx_code.count("torch.ops.aten.") == source.count("_direct_aten_") > 10
        assert fx_code.count(" = None") == source.count(" = None")  # the same frees, in the same places
        assert namespace["_direct_aten_mm_default"] is torch.ops.aten.mm.default._op


def test_direct_code_trains_bit_for_bit_like_fx_code_at_the_planned_peak():
    """examples/gpt.py with dropout at 60% (recomputation, replayed dropout): the direct code's
    loss and gradients equal fx's code's bitwise and plain autograd's to 1e-10, and its measured
    peak is the plan's."""
    model, inputs = load_example("gpt", dropout=0.1)
    direct = optimize(clone(model), inputs, "60%", solver="greedy")
    through_fx = optimize(clone(model), inputs, "60%", solver="greedy")
    for gm in (through_fx.forward_graph, through_fx.backward_graph):
        gm.recompile()  # fx's code back
        assert not _runs_direct_code(gm)
    torch.manual_seed(3)
    outputs_direct, grads_direct = train_step(direct, inputs)
    torch.manual_seed(3)
    outputs_fx, grads_fx = train_step(through_fx, inputs)
    torch.manual_seed(3)
    _, grads_plain = train_step(clone(model), inputs)
    assert all(torch.equal(a, b) for a, b in zip(outputs_direct, outputs_fx, strict=True))
    assert all(torch.equal(grads_direct[name], grads_fx[name]) for name in grads_fx)
    assert max_relative_error(grads_direct, grads_plain) < 1e-10
    assert measured_peak(direct, inputs) == direct.plan.predicted_peak_bytes


def test_an_overload_call_that_does_more_than_forward_keeps_fx_s_code(monkeypatch):
    calls = []

    def counting_call(self, /, *args, **kwargs):
        calls.append(self)
        return self._op(*args, **kwargs)

    assert op_overload_call_only_forwards()
    monkeypatch.setattr(OpOverload, "__call__", counting_call)
    assert not op_overload_call_only_forwards()
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.ops.aten.relu.default, (graph.call_function(
        torch.ops.aten.neg.default, (x,)),)))
    gm = call_ops_directly(torch.fx.GraphModule(torch.nn.Module(), graph))
    assert not _runs_direct_code(gm)
    assert torch.equal(gm(torch.tensor([-1.0, 2.0])), torch.tensor([1.0, 0.0]))
    assert calls == [torch.ops.aten.neg.default, torch.ops.aten.relu.default]  # torch's call ran
