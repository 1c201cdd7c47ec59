"""The token-chunked MLP (`frontends.split.mlp_split`): the split step is the same function (float64
gradients to 1e-10 on the GPT example, transformers' GPT-2 (Conv1D) and Llama (SwiGLU), eager and through a
plan that recomputes MLP chunks), it lowers the smallest feasible budget below what any unsplit
schedule needs, ``split="auto"`` searches it, and chains it cannot split exactly are skipped and
named (dropout inside, an intermediate read elsewhere)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontends.capture.step import capture
from frontends.graph_runtime.remat_module import RematModule
from frontends.split.mlp_split import split_mlps
from frontends.split.row_split import RowSplitError, split_rows
from optimizer import optimize
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.checkmate.min_budget import peak_lower_bound, smallest_feasible_budget
from solvers.ir.simulator import simulate
from solvers.planning.planner import plan_graph
from tests.e2e_helpers import clone, load_example, max_relative_error

TOLERANCE = 1e-10


class TokenMLP(nn.Module):
    """One residual MLP (GELU, or SwiGLU ``silu(gate(x)) * up(x)``) whose 4 x 128 x 128
    intermediate dominates, and an MSE loss (no LM head: ``split="auto"`` finds none to split)."""

    def __init__(self, swiglu: bool = False, dropout: float = 0.0, leak: bool = False) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(8, 128), nn.Linear(128, 8)
        self.gate = nn.Linear(8, 128, bias=False) if swiglu else None
        self.drop, self.leak = nn.Dropout(dropout), leak

    def forward(self, x, target):
        hidden = F.silu(self.gate(x)) * self.up(x) if self.gate is not None else F.gelu(self.up(x), approximate="tanh")
        loss = F.mse_loss(x + self.down(self.drop(hidden)), target)
        return (loss, hidden.detach().sum()) if self.leak else loss


def _inputs():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return torch.randn(4, 128, 8, dtype=torch.float64), torch.randn(4, 128, 8, dtype=torch.float64)


def _seeded(factory):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return factory()


def _grads(module: nn.Module, inputs: tuple, kwargs: dict | None = None) -> dict[str, torch.Tensor]:
    params = module.model if hasattr(module, "plan") else module
    for p in params.parameters():
        p.grad = None
    out = module(*inputs, **(kwargs or {}))
    loss = out if isinstance(out, torch.Tensor) else out[0] if isinstance(out, (tuple, list)) else out["loss"]
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in params.named_parameters()}


def test_the_gpt_example_mlps_split_exactly() -> None:
    model, inputs = load_example("gpt", dropout=0.0)
    expected = _grads(model, inputs)
    gm = torch.export.export(clone(model), inputs, strict=False).module()
    mlps = split_mlps(gm, 4)
    layers = len(model.blocks)
    assert [s.module for s in mlps.splits] == [f"blocks.{i}.mlp" for i in range(layers)] and not mlps.skipped
    first = mlps.splits[0]
    assert (first.rows, first.width, first.chunks) == (4 * 32, 256, 4)
    assert first.chunk_bytes * 4 == first.intermediate_bytes
    gelus = [n for n in gm.graph.nodes if n.target is torch.ops.aten.gelu.default]
    assert len(gelus) == 4 * layers and all(n.meta["val"].shape == (32, 256) for n in gelus)
    split_rows(gm, 2)  # the head and loss split on top
    assert max_relative_error(_grads(gm, inputs), expected) <= TOLERANCE


def test_a_llama_swiglu_step_planned_with_mlp_chunks_has_the_eager_gradients() -> None:
    """... and, with ``outputs="loss"``, returns its ``ModelOutput`` with only ``loss`` set."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=48, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=64,
                                      max_position_embeddings=64)
    model = _seeded(lambda: transformers.LlamaForCausalLM(config).double())
    ids = _seeded(lambda: torch.randint(0, 64, (2, 24)))
    kwargs = {"labels": ids}
    expected = _grads(model, (ids,), kwargs)
    captured = capture(clone(model), (ids,), kwargs, split_rows=2, split_mlp=4, outputs="loss")
    assert "split 1 MLP (model.layers.0.mlp) into 4 row chunks" in captured.notes[-1]
    store_all = simulate(captured.graph, store_all_schedule(captured.graph)).peak_bytes
    plan = plan_graph(captured.graph, int(0.9 * store_all), "greedy")
    modules = {n.name: n.module for n in captured.graph.nodes}
    assert any(".mlp" in modules[name] for name, _ in plan.recomputed)  # MLP chunks recomputed
    rm = RematModule(clone(model), captured, plan, (ids,), kwargs)
    out = rm(ids, **kwargs)
    assert type(out).__name__ == "CausalLMOutputWithPast" and list(out.keys()) == ["loss"] and out.logits is None
    assert max_relative_error(_grads(rm, (ids,), kwargs), expected) <= TOLERANCE


def test_transformers_gpt2_conv1d_mlps_split_exactly() -> None:
    """GPT-2's ``Conv1D`` exports as ``view -> addmm -> view`` and its GELU as pointwise ops."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=16, vocab_size=50,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                                     eos_token_id=0, loss_type="ForCausalLM")
    model = _seeded(lambda: transformers.GPT2LMHeadModel(config).double())
    ids = _seeded(lambda: torch.randint(0, 50, (2, 12)))
    kwargs = {"labels": ids, "use_cache": False}
    expected = _grads(model, (ids,), kwargs)
    gm = torch.export.export(clone(model), (ids,), kwargs, strict=False).module()
    mlps = split_mlps(gm, 4)
    assert [s.module for s in mlps.splits] == ["transformer.h.0.mlp", "transformer.h.1.mlp"]
    assert sum(n.target is torch.ops.aten.addmm.default for n in gm.graph.nodes) == 2 * 4 * 2 + 2 * 2  # + attn
    assert max_relative_error(_grads(gm, (ids,), kwargs), expected) <= TOLERANCE


@pytest.fixture(scope="module")
def token_mlp_captures():
    model, inputs = _seeded(lambda: TokenMLP(swiglu=True).double()), _inputs()
    return model, inputs, capture(clone(model), inputs), capture(clone(model), inputs, split_mlp=8)


def test_splitting_the_mlp_lowers_the_smallest_feasible_budget(token_mlp_captures) -> None:
    _, _, unsplit, split = token_mlp_captures
    (mlp,) = split.mlp_splits.splits
    assert (mlp.rows, mlp.width, mlp.chunks) == (512, 128, 8) and "split 1 MLP" in split.notes[-1]
    every_unsplit_schedule_needs = peak_lower_bound(unsplit.graph)
    found = smallest_feasible_budget(split.graph, SolverOptions(time_limit_s=5))
    assert simulate(split.graph, found.schedule).peak_bytes <= found.smallest_bytes
    assert found.smallest_bytes < every_unsplit_schedule_needs - 2 * mlp.intermediate_bytes
    assert split.graph.base_flops == unsplit.graph.base_flops  # the same matmuls, in chunks


def test_auto_searches_the_mlp_split(token_mlp_captures) -> None:
    model, inputs, unsplit, _ = token_mlp_captures
    budget = peak_lower_bound(unsplit.graph) - 1  # no unsplit schedule fits
    rm = optimize(clone(model), inputs, budget, split="auto", solver="greedy", time_limit=1)
    assert "k=1: infeasible" in rm.plan.message and "k=2: not split" in rm.plan.message  # no LM head
    assert "for the MLPs" in rm.plan.message and "k=1/mlp=2: " in rm.plan.message
    assert rm.plan.predicted_peak_bytes <= budget
    assert max_relative_error(_grads(rm, inputs), _grads(model, inputs)) <= TOLERANCE


@pytest.mark.parametrize("how,why", [
    ({"dropout": 0.1}, "dropout.default inside"),
    ({"leak": True}, "also read outside the MLP"),
])
def test_an_mlp_the_split_cannot_chunk_exactly_is_skipped_and_named(how: dict, why: str) -> None:
    inputs = _inputs()
    with pytest.raises(RowSplitError, match=why):
        capture(TokenMLP(**how).double(), inputs, split_mlp=2)
    gm = torch.export.export(TokenMLP(**how).double(), inputs, strict=False).module()
    with pytest.raises(RowSplitError, match="no linear -> activation -> linear chain"):
        split_mlps(gm, 2)
