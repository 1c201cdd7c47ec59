"""Hugging Face models from default configs: planned, rewritten, and trained like eager.

Generative configs default to ``use_cache=True``: capture switches the cache off for the
training step (as HF's gradient checkpointing does), restores the config, and says so once in
the plan's message. Tensors that forward creates (the cache's, T5's shifted labels) are lifted
constants: resident values every schedule has from the start. Tiny sizes, default everything
else (dropout included: the same seed gives the same masks under a plan and under eager).
"""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import hf_step, max_relative_error, tiny_gpt2

from frontends.capture.step import CaptureError, capture
from frontends.guards.hf_training import USE_CACHE_NOTE
from optimizer import optimize
from solvers import get_solver
from solvers.base import SolverOptions
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph
from solvers.ir.simulator import simulate

VOCAB = 128
TIME_LIMIT = 2.0


@pytest.fixture(scope="module")
def transformers():
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()  # tiny vocabularies make the configs warn about token ids
    return module


def _tokens(batch: int = 4, seq: int = 64) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def _t5(transformers):
    torch.manual_seed(0)
    # decoder_start_token_id: t5-small's value; transformers 5's T5Config has no default for it,
    # and eager T5 cannot shift the labels into decoder inputs without one.
    config = transformers.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                                   vocab_size=VOCAB, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(config).double().train()


def _use_cache_settings(model: torch.nn.Module) -> list:
    return [getattr(m.config, "use_cache", None) for m in model.modules() if hasattr(m, "config")]


def _check_plan(rm) -> None:
    plan = rm.plan
    assert plan.recomputed, "the budget should force recomputation"
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    assert plan.message.count(USE_CACHE_NOTE) == 1


class _LossAndLogits(torch.nn.Module):
    """A training step called with positional tensors, as a training loop writes it."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor):
        out = self.model(input_ids=input_ids, labels=labels)
        return out.loss, out.logits


# ------------------------------------------------------------------ lifted constants
class _ScaledByConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.linear(x)) * torch.tensor([2.0], dtype=x.dtype)  # a lifted constant
        return (h * h).sum()


def test_a_lifted_constant_is_resident_and_read_wherever_the_schedule_recomputes():
    torch.manual_seed(0)
    model, x = _ScaledByConstant().double(), torch.randn(4, 8, dtype=torch.float64)
    graph = capture(model, (x,)).graph
    constants = [n for n in graph.nodes if n.op == "get_attr"]
    assert [(n.kind, n.bytes) for n in constants] == [(NodeKind.PARAMETER, 8)]
    assert graph.users[constants[0].name], "its readers list it as an input"
    assert graph.resident_bytes == graph.parameter_bytes + graph.input_bytes
    _, _, ref = hf_step(model, model, x)
    for solver in ("store-all", "recompute-all"):
        rm = optimize(model, (x,), "100%", solver=solver)
        _, _, grads = hf_step(rm, model, x)
        assert max_relative_error(grads, ref) <= 1e-10, solver
    # recompute-all copies the constant's reader into backward: backward reads the constant
    assert "_tensor_constant0" in rm.backward_graph.code


def test_a_constant_read_in_backward_only_plans_on_the_ir():
    f, b = Phase.FORWARD, Phase.BACKWARD

    def op(name, phase, nbytes, inputs):
        return Node(name, NodeKind.OP, phase, nbytes, tuple(inputs), group=name, cost=1.0, flops=1.0)

    nodes = (Node("w", NodeKind.PARAMETER, f, 100), Node("x", NodeKind.INPUT, f, 10),
             Node("c", NodeKind.PARAMETER, f, 4, op="get_attr"),  # a lifted constant
             op("a", f, 20, ["x", "w"]), op("bb", f, 20, ["a"]), op("loss", f, 1, ["bb"]),
             Node("t", NodeKind.TANGENT, b, 1), op("gb", b, 20, ["t", "a", "c"]),
             op("gw", b, 100, ["gb", "x"]))
    graph = RematGraph(nodes, forward_outputs=("loss",), user_outputs=("loss",), backward_outputs=("gw",))
    for solver in ("store-all", "recompute-all", "greedy", "chen", "auto"):
        result = get_solver(solver)(graph, 10_000, SolverOptions(time_limit_s=TIME_LIMIT))
        steps = result.schedule.steps
        assert all(s.node != "c" for s in steps), solver  # never computed, never freed
        assert simulate(graph, result.schedule).peak_bytes >= 100 + 10 + 4


# ------------------------------------------------------------------ GPT-2 and T5
def test_gpt2_positional_inputs_plan_and_train_like_eager(transformers):
    model = tiny_gpt2(transformers)
    step = _LossAndLogits(model).train()
    ids = _tokens()
    settings = _use_cache_settings(model)
    rm = optimize(step, (ids, ids), "60%", time_limit=TIME_LIMIT)
    assert _use_cache_settings(model) == settings == [True] * len(settings)
    _check_plan(rm)
    (_, logits), loss, grads = hf_step(rm, model, ids, ids)
    (_, ref_logits), ref_loss, ref = hf_step(step, model, ids, ids)  # eager, use_cache=True
    assert torch.equal(loss, ref_loss)
    assert torch.allclose(logits.detach(), ref_logits.detach(), rtol=1e-12, atol=1e-14)
    assert max_relative_error(grads, ref) <= 1e-10


def test_gpt2_keyword_inputs_return_the_model_output(transformers):
    model = tiny_gpt2(transformers)
    ids = _tokens()
    kwargs = {"input_ids": ids, "labels": ids, "use_cache": True}  # traced and run as False
    rm = optimize(model, (), "60%", example_kwargs=kwargs, time_limit=TIME_LIMIT)
    _check_plan(rm)
    out, loss, grads = hf_step(rm, model, **kwargs)
    ref_out, ref_loss, ref = hf_step(model, model, **kwargs)
    assert type(out) is type(ref_out) and out.past_key_values is None  # no cache in training
    assert torch.equal(loss, ref_loss)
    assert max_relative_error(grads, ref) <= 1e-10
    rm.eval()  # the original model, its config untouched: generation still gets its cache
    with torch.no_grad():
        assert isinstance(rm(input_ids=ids).past_key_values, transformers.Cache)


def test_t5_plans_and_trains_like_eager(transformers):
    model = _t5(transformers)
    ids = _tokens()
    kwargs = {"input_ids": ids, "labels": ids}  # the decoder's inputs are the shifted labels
    settings = _use_cache_settings(model)
    rm = optimize(model, (), "60%", example_kwargs=kwargs, time_limit=TIME_LIMIT)
    assert _use_cache_settings(model) == settings
    _check_plan(rm)
    assert "_tensor_constant" in rm.forward_graph.code  # shift_right's decoder start token
    out, loss, grads = hf_step(rm, model, **kwargs)
    ref_out, ref_loss, ref = hf_step(model, model, **kwargs)
    assert type(out) is type(ref_out) and out.past_key_values is None
    # float64, one ulp apart with transformers 5.24 (bit-equal with earlier releases)
    assert abs(loss.item() - ref_loss.item()) <= 1e-12 * abs(ref_loss.item())
    assert max_relative_error(grads, ref) <= 1e-10


# ------------------------------------------------------------------ mixture of experts
def _mixtral(transformers, **extra):
    torch.manual_seed(0)
    config = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, max_position_embeddings=64,
                                        num_local_experts=4, num_experts_per_tok=2, **extra)
    return transformers.MixtralForCausalLM(config).train()


def test_mixtral_plans_and_trains_like_eager(transformers):
    model = _mixtral(transformers)  # float32: the default grouped_mm experts take no float64
    ids = _tokens(4, 32)
    kwargs = {"input_ids": ids, "labels": ids}
    rm = optimize(model, (), "96%", example_kwargs=kwargs, time_limit=TIME_LIMIT)
    assert rm.plan.predicted_peak_bytes <= rm.plan.budget_bytes
    _, loss, grads = hf_step(rm, model, **kwargs)
    _, ref_loss, ref = hf_step(model, model, **kwargs)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    assert max_relative_error(grads, ref) <= 1e-5  # measured 3.5e-7: store-all gives the same


# ------------------------------------------------------------------ what cannot be planned
def test_unsupported_constructs_are_named_in_one_line(transformers):
    model = _mixtral(transformers, experts_implementation="eager")
    ids = _tokens(2, 8)
    with pytest.raises(CaptureError, match='experts_implementation="grouped_mm"') as caught:
        optimize(model, (), "100%", example_kwargs={"input_ids": ids, "labels": ids})
    assert "\n" not in str(caught.value)
    gpt2 = tiny_gpt2(transformers)
    cache = transformers.DynamicCache(config=gpt2.config)
    with pytest.raises(CaptureError, match="DynamicCache.*use_cache=False") as caught:
        optimize(gpt2, (), "100%", example_kwargs={"input_ids": ids, "past_key_values": cache})
    assert "\n" not in str(caught.value)
