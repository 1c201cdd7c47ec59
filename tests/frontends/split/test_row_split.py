"""Splitting the LM head and its loss into row chunks (`frontends.split.row_split`): the split step is
the same function (float64 gradients to 1e-10, eager and through a remat plan), it lowers the
smallest feasible budget below what any unsplit schedule needs, and chains that mix rows are
refused with `RowSplitError`."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from frontends.capture.step import capture
from frontends.split.row_split import RowSplitError, split_rows
from optimizer import optimize
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.checkmate.min_budget import peak_lower_bound, smallest_feasible_budget
from solvers.ir.simulator import simulate
from tests.e2e_helpers import ROOT, clone, load_example, max_relative_error, train_step

TOLERANCE = 1e-10


def _gpt_module():
    spec = importlib.util.spec_from_file_location("_gpt_for_row_split", f"{ROOT}/examples/gpt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LossOnly(nn.Module):
    """The model's loss alone: nothing but the loss is returned, so no logits stay whole."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model(idx, targets)[0]


@pytest.fixture(scope="module")
def wide_vocab():
    """A GPT whose logits dominate: width 32, vocab 4096, 2 x 64 tokens, float64."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = _gpt_module().GPT(vocab_size=4096, seq_len=64, d_model=32, n_heads=2, n_layers=2,
                                  dropout=0.0).double()
        idx, targets = torch.randint(0, 4096, (2, 64)), torch.randint(0, 4096, (2, 64))
    return model, (idx, targets)


class Heads(nn.Module):
    """Every loss form the split handles: ignore_index, label smoothing, class weights,
    log_softmax + nll_loss with reduction sum, a dtype cast, a scalar scale and tanh, a bias."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.head = nn.Linear(8, 40)
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, 40))

    def forward(self, x, targets):
        logits = self.head(torch.tanh(self.body(x)))
        flat, flat_targets = logits.view(-1, 40), targets.view(-1)
        a = F.cross_entropy(flat, flat_targets, ignore_index=3, label_smoothing=0.1)
        b = F.cross_entropy(flat.to(torch.float64), flat_targets, weight=self.class_weight, ignore_index=5)
        c = F.nll_loss(F.log_softmax(torch.tanh(logits / 4.0) * 4.0, -1).view(-1, 40), flat_targets,
                       reduction="sum")
        return a + b + 0.01 * c


def _heads_inputs():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        targets = torch.randint(0, 40, (3, 7))
        targets[0, :3] = 3  # ignored by the first loss
        return torch.randn(3, 7, 6, dtype=torch.float64), targets


def _exported(model: nn.Module, inputs: tuple) -> torch.fx.GraphModule:
    return torch.export.export(model, inputs, strict=False).module()


def _eager_grads(module: nn.Module, inputs: tuple) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    for p in module.parameters():
        p.grad = None
    out = module(*inputs)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in module.named_parameters()}


def test_finds_the_lm_head_and_loss_of_the_gpt_example() -> None:
    model, inputs = load_example("gpt", dropout=0.0)
    gm = _exported(model, inputs)
    (split,) = split_rows(gm, 4)
    assert (split.module, split.rows, split.width, split.chunks) == ("lm_head", 4 * 32, 256, 4)
    assert split.logits_bytes == 4 * 32 * 256 * 8 and split.chunk_bytes == split.logits_bytes // 4
    assert split.whole_outputs  # the example returns its logits: they are rebuilt whole
    linears = [n for n in gm.graph.nodes if n.target is torch.ops.aten.linear.default
               and n.args[1].target == "lm_head.weight"]
    losses = [n for n in gm.graph.nodes if n.target is torch.ops.aten.cross_entropy_loss.default]
    assert len(linears) == len(losses) == 4
    assert all(n.meta["val"].shape == (32, 256) for n in linears)
    # chunk by chunk: each chunk's loss runs before the next chunk's linear
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    assert all(order[loss] < order[nxt] for loss, nxt in zip(losses, linears[1:]))


@pytest.mark.parametrize("chunks", [2, 4])
@pytest.mark.parametrize("case", ["gpt", "heads"])
def test_the_split_forward_has_the_same_gradients(case: str, chunks: int) -> None:
    model, inputs = load_example("gpt", dropout=0.0) if case == "gpt" else (Heads().double(), _heads_inputs())
    expected_loss, expected = _eager_grads(model, inputs)
    gm = _exported(clone(model), inputs)
    splits = split_rows(gm, chunks)
    assert len(splits) == 1 and len(splits[0].losses) == (1 if case == "gpt" else 3)
    loss, grads = _eager_grads(gm, inputs)
    assert float((loss - expected_loss).abs() / expected_loss.abs()) <= TOLERANCE
    assert max_relative_error(grads, {n: expected[n] for n in grads}) <= TOLERANCE
    if case == "gpt":  # the logits the caller receives are the whole, unchanged logits
        torch.testing.assert_close(gm(*inputs)[1], model(*inputs)[1], rtol=0, atol=1e-12)


def test_transformers_gpt2_loss_splits_exactly() -> None:
    """transformers' causal-LM loss (``.float()`` cast, padded shifted labels, ignore_index -100).
    That cast computes the loss in float32 even in a float64 model: agreement is float32's."""
    transformers = pytest.importorskip("transformers")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=300,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
        model = transformers.GPT2LMHeadModel(config).double()
        ids = torch.randint(0, 300, (2, 12))

    class LossAndLogits(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = model

        def forward(self, ids):
            out = self.lm(input_ids=ids, labels=ids, use_cache=False)
            return out.loss, out.logits

    wrapped = LossAndLogits()
    expected_loss, expected = _eager_grads(wrapped, (ids,))
    gm = _exported(clone(wrapped), (ids,))
    (split,) = split_rows(gm, 4)
    assert split.module == "lm.lm_head" and split.rows == 24
    loss, grads = _eager_grads(gm, (ids,))
    assert loss.dtype == torch.float32
    assert float((loss - expected_loss).abs() / expected_loss.abs()) <= 1e-6
    assert max_relative_error(grads, {n: expected[n] for n in grads}) <= 1e-5


@pytest.fixture(scope="module")
def wide_captures(wide_vocab):
    """(unsplit, split into 4) captures of the wide-vocabulary GPT, per what it returns."""
    model, inputs = wide_vocab
    models = {"loss": LossOnly(model), "loss and logits": model}
    return {name: (capture(clone(m), inputs), capture(clone(m), inputs, split_rows=4))
            for name, m in models.items()}


@pytest.mark.parametrize("returns", ["loss", "loss and logits"])
def test_splitting_lowers_the_smallest_feasible_budget(wide_captures, returns: str) -> None:
    unsplit, split = wide_captures[returns]
    assert [s.chunks for s in split.row_splits] == [4] and split.notes
    assert bool(split.row_splits[0].whole_outputs) == (returns != "loss")
    every_unsplit_schedule_needs = peak_lower_bound(unsplit.graph)
    found = smallest_feasible_budget(split.graph, SolverOptions(time_limit_s=5))
    assert simulate(split.graph, found.schedule).peak_bytes <= found.smallest_bytes
    assert found.smallest_bytes < every_unsplit_schedule_needs
    # splitting alone costs no memory either: store-all of the split step is no higher
    assert (simulate(split.graph, store_all_schedule(split.graph)).peak_bytes
            <= simulate(unsplit.graph, store_all_schedule(unsplit.graph)).peak_bytes)


def test_a_plan_below_the_unsplit_floor_has_the_eager_gradients(wide_vocab, wide_captures) -> None:
    model, inputs = wide_vocab
    model = LossOnly(model)
    unsplit, split = wide_captures["loss"]
    store_all = simulate(split.graph, store_all_schedule(split.graph)).peak_bytes
    budget = min(peak_lower_bound(unsplit.graph) - 1,  # no unsplit schedule fits
                 (smallest_feasible_budget(split.graph).smallest_bytes + store_all) // 2)
    rm = optimize(clone(model), inputs, budget, split=4, solver="greedy", time_limit=5)
    assert rm.plan.recomputed and rm.plan.predicted_peak_bytes <= budget
    assert "4 row chunks" in rm.plan.message
    (loss, *_), grads = train_step(rm, inputs)
    (expected_loss, *_), expected = train_step(model, inputs)
    assert float((loss - expected_loss).abs() / expected_loss.abs()) <= TOLERANCE
    assert max_relative_error(grads, expected) <= TOLERANCE


def test_auto_chooses_a_split_where_unsplit_cannot_fit(wide_vocab, wide_captures) -> None:
    model, inputs = wide_vocab
    floor = peak_lower_bound(wide_captures["loss"][0].graph)
    rm = optimize(LossOnly(clone(model)), inputs, floor - 1, split="auto", solver="greedy", time_limit=5)
    assert "split='auto' chose" in rm.plan.message and "k=1: infeasible" in rm.plan.message
    assert rm.plan.predicted_peak_bytes < floor


class Mixing(nn.Module):
    """A head whose logits meet what the split does not chunk (``how`` says what)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.head, self.how = nn.Linear(8, 30), how

    def forward(self, x, targets):
        logits = self.head(x).view(-1, 30)
        t = targets.view(-1)
        if self.how == "log_softmax over tokens":
            return F.nll_loss(F.log_softmax(logits, dim=0), t)
        if self.how == "per-token losses":
            return F.cross_entropy(logits, t, reduction="none").max()
        return F.cross_entropy(logits, t) + 1e-4 * logits.logsumexp(-1).pow(2).mean()  # z-loss


@pytest.mark.parametrize("how,why", [
    ("log_softmax over tokens", "normalizes across tokens"),
    ("per-token losses", "reduction='none'"),
    ("z-loss", "cannot chunk row by row"),
])
def test_a_chain_the_split_cannot_chunk_is_refused(how: str, why: str) -> None:
    inputs = (torch.randn(2, 5, 8, dtype=torch.float64), torch.randint(0, 30, (2, 5)))
    with pytest.raises(RowSplitError, match=why):
        capture(Mixing(how).double(), inputs, split_rows=2)


def test_a_split_without_a_head_is_refused() -> None:
    model, inputs = load_example("mlp")
    with pytest.raises(RowSplitError, match="no linear -> cross_entropy"):
        capture(clone(model), inputs, split_rows=2)
    with pytest.raises(ValueError, match="split must be"):
        optimize(clone(model), inputs, "80%", split="some")


def test_auto_plans_unsplit_where_the_chain_is_refused_and_says_why() -> None:
    inputs = (torch.randn(2, 5, 8, dtype=torch.float64), torch.randint(0, 30, (2, 5)))
    rm = optimize(Mixing("z-loss").double(), inputs, "90%", split="auto", time_limit=5)
    assert rm.plan.extra_time_s > 0  # else auto stops before trying a split
    assert "chose 1 row chunk" in rm.plan.message and "k=2: not split" in rm.plan.message
