"""The eager runtime's token-chunked MLPs: ``apply_checkpointing(..., split_mlp=m)``.

Checked on CPU: float64 gradients equal the unsplit model's (examples/gpt.py, dropout under the
same seed), with the chunks under their own checkpoints and under a region's; on a GPT with a
wide MLP the measured peak is below the unsplit eager plan's at the same budget, equals the
prediction within the eager tests' 2%, and the leanest plan is lower; a plan file keeps the
split and `remove_checkpointing` undoes it; a model with no MLP module, an MLP with dropout
inside (in the chain or after it) and ``split`` (the LM head) are refused with one clear error,
the model left unchanged; the CLI plans ``--runtime eager --split-mlp 2``.
"""

from __future__ import annotations

import copy

import pytest
import torch
from e2e_helpers import example_path, load_example, max_relative_error, measured_peak, tiny_llama
from torch import nn

from frontends.eager_runtime.eager_checkpoint import (
    RegionPolicy,
    SplitPolicy,
    apply_regions,
    apply_splits,
    checkpointed_modules,
    load_checkpointing,
    remove_checkpointing,
    save_checkpointing_plan,
    split_modules,
)
from frontends.eager_runtime.eager_split import EagerSplitError
from frontends.split.mlp_split import MlpSplitError
from frontends.split.row_split import RowSplitError
from optimizer.checkpointing import apply_checkpointing
from optimizer.cli import main
from solvers.base import InfeasibleBudgetError
from solvers.planning.split_search import SplitInfeasibleError

pytestmark = pytest.mark.usefixtures("one_thread")

PEAK_TOLERANCE = 0.02  # as tests/frontends/eager_runtime/test_eager_runtime.py
GPT_MLPS = {"blocks.0.mlp", "blocks.1.mlp", "blocks.2.mlp"}


def _grads(model: nn.Module, inputs: tuple, seed: int = 0):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    loss = model(*inputs)[0]
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _gpt(mlp: callable | None = None, mult: int = 4, dropout: float = 0.0, layers: int = 2):
    """examples/gpt.py's GPT in float64 (d 32, seq 64, batch 8, vocab 128), its MLPs replaced by
    ``mlp(d, mult * d)`` when given."""
    model, _ = load_example("gpt", torch.float64)
    gpt_class = type(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = gpt_class(vocab_size=128, seq_len=64, d_model=32, n_heads=2, n_layers=layers, dropout=dropout)
        if mlp is not None:
            for block in model.blocks:
                block.mlp = mlp(32, mult * 32)
        tokens = torch.randint(0, 128, (8, 65))
    return model.double(), (tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())


def _wide(d: int, hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))


# ------------------------------------------------------------------ same function
@pytest.mark.parametrize("budget", ["100%", "62%"])
def test_gpt_gradients_equal_the_unsplit_model_float64(budget):
    """examples/gpt.py (dropout 0.1, same seed): loss and every gradient equal plain autograd's."""
    model, inputs = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, inputs, budget=budget, split_mlp=4, compare=False, time_limit=2)
    assert {s.path for s in plan.splits} == GPT_MLPS and set(split_modules(model)) == GPT_MLPS
    assert "in 4 row chunks" in plan.plan.message
    unsplit_peak = dict(plan.summary)["unsplit_store_all_peak_bytes"]  # a percentage is of the unsplit step
    assert abs(plan.budget_bytes - float(budget[:-1]) / 100 * unsplit_peak) <= 1
    loss, grads = _grads(model, inputs)
    ref_loss, ref_grads = _grads(reference, inputs)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert max_relative_error(grads, ref_grads) < 1e-10


def test_chunks_under_their_own_checkpoints_run_each_chunk_twice_and_equal_unsplit():
    """The runtime half alone: each chunk's forward runs once in forward and once more in its
    backward (its own checkpoint), the gradients those of the whole MLP."""
    model, inputs = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    apply_splits(model, (SplitPolicy("blocks.1.mlp", 3),))
    rows = []
    handle = model.blocks[1].mlp[0].register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    loss, grads = _grads(model, inputs)
    handle.remove()
    ref_loss, ref_grads = _grads(reference, inputs)
    assert rows == [43, 43, 42, 42, 43, 43]  # 128 token rows: forward 0, 1, 2; backward 2, 1, 0
    assert torch.equal(loss, ref_loss) or loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert max_relative_error(grads, ref_grads) < 1e-10
    with torch.no_grad():  # without grad the module runs whole
        model(*inputs)
    assert remove_checkpointing(model) == 1 and "forward" not in model.blocks[1].mlp.__dict__


def test_a_region_around_a_split_mlp_runs_its_chunks_without_their_own_checkpoints():
    """A checkpointed region around the split MLP reruns the chunks itself: each chunk runs once
    in forward and once in the region's recomputation (nested checkpoints would run it thrice)."""
    model, inputs = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    region = RegionPolicy(path="blocks.1.mlp", option="none", save=(), expected_ops=())
    apply_regions(model, (region,), (SplitPolicy("blocks.1.mlp", 3),))
    calls = []
    handle = model.blocks[1].mlp[0].register_forward_hook(lambda *_: calls.append(1))
    loss, grads = _grads(model, inputs)
    handle.remove()
    assert len(calls) == 6
    assert max_relative_error(grads, _grads(reference, inputs)[1]) < 1e-10
    assert remove_checkpointing(model) == 2


# ------------------------------------------------------------------ memory
@pytest.fixture(scope="module")
def wide():
    """A GPT whose MLP is 16x wide (its intermediate dominates): the leanest eager plan unsplit
    and with split_mlp=4, both planned and measured at the unsplit one's leanest budget, and
    split_mlp=4 measured halfway between the two leanest budgets."""
    torch.set_num_threads(1)
    model, inputs = _gpt(_wide, mult=16)
    leanest, plans = {}, {}
    for split in (1, 4):  # 1: never split (None would split where nothing fits)
        with pytest.raises(InfeasibleBudgetError) as err:
            apply_checkpointing(model, inputs, budget=1, split_mlp=split, compare=False, time_limit=2)
        leanest[split] = err.value.smallest_feasible_bytes
        assert not checkpointed_modules(model) and not split_modules(model)  # nothing applied
    budgets = {"same": leanest[1], "between": (leanest[4] + leanest[1]) // 2}
    for split, budget in ((1, "same"), (4, "same"), (4, "between")):
        plan = apply_checkpointing(model, inputs, budget=budgets[budget], split_mlp=split, compare=False,
                                   time_limit=2)
        plans[split, budget] = (plan, measured_peak(model, inputs))
        remove_checkpointing(model)
    return model, inputs, leanest, budgets, plans


def test_split_lowers_the_measured_peak_at_the_same_budget(wide):
    *_, plans = wide
    (unsplit, unsplit_peak), (split, split_peak) = plans[1, "same"], plans[4, "same"]
    for plan, peak in ((unsplit, unsplit_peak), (split, split_peak)):
        assert plan.predicted_peak_bytes <= plan.budget_bytes
        assert peak == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)
    assert split_peak < 0.9 * unsplit_peak
    assert all(sp.checkpoint for sp in split.splits)


def test_split_reaches_budgets_the_unsplit_eager_plan_cannot(wide):
    """The leanest plan with the MLPs split is lower than without, and a budget between them
    plans, runs and peaks as predicted."""
    model, inputs, leanest, budgets, plans = wide
    assert leanest[4] < 0.85 * leanest[1]
    with pytest.raises(InfeasibleBudgetError):
        apply_checkpointing(model, inputs, budget=budgets["between"], split_mlp=1, compare=False, time_limit=2)
    plan, peak = plans[4, "between"]
    assert any(sp.checkpoint for sp in plan.splits)
    assert peak == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE) and peak <= budgets["between"]


def test_without_split_mlp_the_mlps_are_split_where_no_whole_plan_fits(wide):
    """``split_mlp`` left at None: where no plan with whole MLPs fits (the budget between the
    two leanest plans), the planner splits the MLPs itself, says so, and the step peaks as
    predicted with the unsplit model's float64 gradients. Below the split's leanest plan too,
    `SplitInfeasibleError` names both floors."""
    model, inputs, leanest, budgets, _ = wide
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, inputs, budget=budgets["between"], compare=False, time_limit=2)
    try:
        assert plan.splits and all(sp.chunks > 1 for sp in plan.splits)
        assert "no whole-tensor plan fits" in plan.plan.message and "split=1 never splits" in plan.plan.message
        assert "split_mlp='auto' chose" in plan.plan.message
        assert plan.predicted_peak_bytes <= budgets["between"]
        peak = measured_peak(model, inputs)
        assert peak == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE) and peak <= budgets["between"]
        assert max_relative_error(_grads(model, inputs)[1], _grads(reference, inputs)[1]) < 1e-10
    finally:
        remove_checkpointing(model)
    with pytest.raises(SplitInfeasibleError) as err:
        apply_checkpointing(model, inputs, budget=leanest[4] // 2, compare=False, time_limit=2)
    assert err.value.split_chunks == (1, 8) and err.value.unsplit_smallest_bytes == leanest[1]
    assert err.value.smallest_feasible_bytes == err.value.split_smallest_bytes < leanest[1]
    assert "the MLPs in 8 row chunks" in str(err.value) and not checkpointed_modules(model)


# ------------------------------------------------------------------ plans as files, undo
def test_a_saved_plan_keeps_the_split_and_remove_undoes_it(tmp_path):
    model, inputs = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, inputs, budget="70%", split_mlp=2, compare=False, time_limit=2)
    path = tmp_path / "plan.json"
    save_checkpointing_plan(plan, path)
    fresh = copy.deepcopy(reference)
    loaded = load_checkpointing(fresh, path)
    assert loaded.splits == plan.splits and set(split_modules(fresh)) == GPT_MLPS
    assert max_relative_error(_grads(fresh, inputs)[1], _grads(reference, inputs)[1]) < 1e-10
    for m in (model, fresh):
        remove_checkpointing(m)
        assert not split_modules(m) and not checkpointed_modules(m)
        assert all("forward" not in sub.__dict__ for sub in m.modules())


# ------------------------------------------------------------------ refusals
def test_a_model_without_an_mlp_module_is_refused():
    """The MLP example's chains have no module of their own (``F.gelu`` in the parent)."""
    model, inputs = load_example("mlp", torch.float64)
    with pytest.raises(EagerSplitError, match="split_mlp=2") as err:
        apply_checkpointing(model, inputs, budget="90%", split_mlp=2, compare=False)
    assert isinstance(err.value, MlpSplitError)
    assert all("forward" not in m.__dict__ for m in model.modules())


class DropMlp(nn.Sequential):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__(nn.Linear(d, hidden), nn.GELU(), nn.Dropout(0.1), nn.Linear(hidden, d))


class DropAfterMlp(nn.Sequential):
    """GPT-2's MLP shape: dropout after the down projection (outside the chain, inside the module)."""

    def __init__(self, d: int, hidden: int) -> None:
        super().__init__(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d), nn.Dropout(0.1))


@pytest.mark.parametrize("mlp", [DropMlp, DropAfterMlp])
def test_an_mlp_with_dropout_inside_is_refused(mlp):
    model, inputs = _gpt(mlp)
    with pytest.raises(MlpSplitError, match="dropout|random") as err:
        apply_checkpointing(model, inputs, budget="90%", split_mlp=2, compare=False)
    assert "blocks.0.mlp" in str(err.value)
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_splitting_the_lm_head_is_the_graph_runtimes():
    model, inputs = load_example("gpt", torch.float64)
    with pytest.raises(RowSplitError, match="graph runtime"):
        apply_checkpointing(model, inputs, budget="90%", split=4)


def test_cli_plans_eager_split_mlp(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main([example_path("gpt"), "--budget", "70%", "--runtime", "eager", "--split-mlp", "2",
                 "--emit", str(out), "--time-limit", "1"]) == 0
    assert "3 MLPs in 2 row chunks" in capsys.readouterr().out
    model, _ = load_example("gpt", torch.float32)
    assert {s.path for s in load_checkpointing(model, out).splits} == GPT_MLPS


class LossOnly(nn.Module):
    """A transformers causal LM as a step: its loss of ids -> ids."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        return (self.model(input_ids=ids, labels=labels).loss,)


def test_transformers_llama_swiglu_mlps_split():
    """LlamaMLP (``down(silu(gate(x)) * up(x))``, no biases): every layer's MLP is split, the
    gradients equal the unsplit model's, and the prediction is within the eager tests' Llama
    tolerance (2.5%: traced, transformers builds causal masks that eager skips, see
    tests/frontends/eager_runtime/test_eager_runtime.py)."""
    llama, ids = tiny_llama(intermediate_size=512)
    model = LossOnly(llama)
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, (ids, ids), budget="65%", split_mlp=4, compare=False, time_limit=2)
    assert {s.path for s in plan.splits} == {"model.model.layers.0.mlp", "model.model.layers.1.mlp"}
    measured = measured_peak(model, (ids, ids))
    assert measured == pytest.approx(plan.predicted_peak_bytes, rel=0.025)
    assert max_relative_error(_grads(model, (ids, ids))[1], _grads(reference, (ids, ids))[1]) < 1e-10
