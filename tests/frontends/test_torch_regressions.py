"""Regressions of torch releases, each fixed in `frontends.torch_compat`; the suite runs on torch
2.13.0 and 2.14.1 (.ci/run), so each test here guards both.

- 2.14 AOTAutograd counts saved values by FakeTensor type: dropout's saved RNG state, a plain
  tensor in the joint's meta, failed every dropout model at compile ("expected one
  saved_tensor_is_graph_input entry per saved tensor, got 58 != 61").
- 2.14 makes ``torch.autograd.Function.apply`` a C ``classmethod_descriptor``: capture's guard
  against user autograd Functions called ``__func__`` on it, and every torch-internal Function
  (custom ops with ``register_autograd``, as transformers' MoE ``grouped_mm_fallback``) failed.
"""

from __future__ import annotations

import torch
from e2e_helpers import load_example, max_relative_error, train_step

from frontends.capture.step import capture
from frontends.graph_runtime.rng_replay import RNG_STATE_OP
from frontends.torch_compat import FakeTensor
from optimizer import optimize


def test_a_dropout_model_compiles_and_trains_like_eager_below_store_all():
    model, inputs = load_example("gpt")  # dropout 0.1 on attention and residuals
    torch.manual_seed(3)
    _, expected = train_step(model, inputs)
    rm = optimize(model, inputs, budget="60%", time_limit=10)
    assert rm.plan.recomputed
    torch.manual_seed(3)
    _, got = train_step(rm, inputs)
    assert max_relative_error(got, expected) < 1e-10


def test_the_saved_rng_state_is_a_fake_tensor_of_the_joint():
    model, inputs = load_example("gpt")
    joint = capture(model, inputs).joint.graph_module
    states = [n for n in joint.graph.nodes if n.target is RNG_STATE_OP]
    assert states
    assert all(isinstance(n.meta["val"], FakeTensor) for n in states)


@torch.library.custom_op("remat_opt_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


@scaled_tanh.register_fake
def _(x):
    return torch.empty_like(x)


def _scaled_tanh_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * 2 * (1 - torch.tanh(x) ** 2)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


scaled_tanh.register_autograd(_scaled_tanh_backward, setup_context=_save_input)


class _CustomOpNet(torch.nn.Module):
    """A custom op with its own autograd (torch wraps it in an internal autograd Function)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(6))

    def forward(self, x):
        for layer in self.layers:
            x = scaled_tanh(layer(x))
        return x.pow(2).mean()


def test_a_custom_op_with_its_own_autograd_captures_and_trains_like_eager():
    torch.manual_seed(0)
    model = _CustomOpNet().double()
    inputs = (torch.randn(256, 64, dtype=torch.float64),)
    _, expected = train_step(model, inputs)
    rm = optimize(model, inputs, budget="80%", time_limit=10)
    _, got = train_step(rm, inputs)
    assert max_relative_error(got, expected) < 1e-10
