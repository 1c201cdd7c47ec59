"""Issue 39, item 5: with ``split`` and ``split_mlp`` left at None, `optimize` splits the step
itself where no whole-tensor plan fits, says so in the plan, and otherwise pays nothing for it.

The issue's case: transformers' GPT-2 (2 x 256, vocab 50257, 4 x 256 tokens, loss and logits
returned) at 50% of its store-all peak, where no unsplit schedule exists (the least one found
needs ~94%). Float32: transformers computes the loss of ``logits.float()``, so a float64 model
agrees with its split only to float32's precision anyway (tests/frontends/split/test_row_split.py),
and float32 halves the time of a 1024 x 50257 head on a 2-core CPU. At 10% no split fits either:
`SplitInfeasibleError` names both floors. ``split=1`` opts out. The CLI prints the plan's message.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from e2e_helpers import ROOT, clone, load_example, max_relative_error, measured_peak, train_step
from torch import nn

import optimizer.api as api
from frontends.capture.step import capture
from optimizer import optimize
from optimizer.api import plan_only
from optimizer.cli import main as cli_main
from solvers.base import InfeasibleBudgetError
from solvers.checkmate.min_budget import peak_lower_bound
from solvers.planning.split_search import SplitInfeasibleError

pytestmark = pytest.mark.usefixtures("one_thread")

PEAK_TOLERANCE = 0.02


class LossAndLogits(nn.Module):
    """transformers' causal LM as a step: ``(loss, logits)`` of ids -> labels."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids, labels):
        out = self.lm(input_ids=ids, labels=labels)
        return out.loss, out.logits


@pytest.fixture(scope="module")
def gpt2():
    """The issue's GPT-2 in float32, train mode, dropout off (so the steps compare exactly)."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=50257, n_positions=256,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                         loss_type="ForCausalLM")
        model = LossAndLogits(transformers.GPT2LMHeadModel(config)).train()
        ids = torch.randint(0, 50257, (4, 256))
    return model, (ids, ids)


def test_gpt2_at_half_its_store_all_peak_plans_without_split(gpt2):
    model, inputs = gpt2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rm = optimize(clone(model), inputs, "50%", time_limit=10)
    plan = rm.plan
    assert "no whole-tensor plan fits" in plan.message and "so the planner split the step" in plan.message
    assert "split=1 never splits" in plan.message and "k=1: infeasible" in plan.message
    assert "split lm.lm_head + loss into" in plan.message
    k = int(re.search(r"split='auto' chose (\d+) row chunks", plan.message).group(1))
    assert k > 1 and f"into {k} row chunks" in plan.message
    assert sum(n.target is torch.ops.aten._log_softmax.default for n in rm.forward_graph.graph.nodes) == k
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    (loss, logits), grads = train_step(rm, inputs)
    (expected_loss, expected_logits), expected = train_step(model, inputs)
    assert float((loss - expected_loss).abs() / expected_loss.abs()) <= 1e-6
    assert float((logits - expected_logits).abs().max() / expected_logits.abs().max()) <= 1e-6
    assert max_relative_error({n.removeprefix("model."): g for n, g in grads.items()}, expected) <= 1e-5
    peak = measured_peak(rm, inputs)
    assert peak == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)
    assert peak <= plan.budget_bytes


def test_gpt2_where_no_split_fits_either_names_both_floors(gpt2):
    model, inputs = gpt2
    with pytest.raises(SplitInfeasibleError) as err:
        plan_only(model, inputs, "10%", time_limit=10)
    error = err.value
    assert error.split_chunks == (8, 8)
    assert error.split_smallest_bytes < error.unsplit_smallest_bytes
    assert error.smallest_feasible_bytes == error.split_smallest_bytes > error.budget_bytes
    text = str(error)
    assert f"unsplit (whole tensors): the least plan found needs {error.unsplit_smallest_bytes} bytes" in text
    assert "the LM head + loss in 8 row chunks and the MLPs in 8 row chunks" in text
    assert f"at a budget of {error.split_smallest_bytes} bytes the step is split by itself" in text


def test_gpt2_split_1_never_splits(gpt2):
    model, inputs = gpt2
    with pytest.raises(InfeasibleBudgetError) as err:
        plan_only(model, inputs, "50%", split=1, time_limit=10)
    assert not isinstance(err.value, SplitInfeasibleError) and "split" not in str(err.value)


def test_a_fitting_budget_captures_the_step_once(monkeypatch):
    """Where the unsplit plan fits, the fallback costs nothing: one capture, no split tried."""
    model, inputs = load_example("gpt", dropout=0.0)
    calls = []
    original = api.capture_with_costs

    def counting(*args, **kwargs):
        calls.append((kwargs.get("split_rows"), kwargs.get("split_mlp")))
        return original(*args, **kwargs)

    monkeypatch.setattr(api, "capture_with_costs", counting)
    plan = plan_only(clone(model), inputs, "70%", time_limit=5)
    assert calls == [(1, 1)] and "split" not in plan.message
    calls.clear()
    with pytest.raises(InfeasibleBudgetError):
        plan_only(clone(model), inputs, "30%", split=1, time_limit=5)
    assert calls == [(1, 1)]  # split=1: refused, nothing else captured


WIDE_VOCAB_MODEL = f'''
import importlib.util, torch
spec = importlib.util.spec_from_file_location("_gpt_for_fallback_cli", "{ROOT}/examples/gpt.py")
gpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpt)


class LossOnly(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx, targets):
        return self.model(idx, targets)[0]


def get_model():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LossOnly(gpt.GPT(vocab_size=4096, seq_len=64, d_model=32, n_heads=2, n_layers=2, dropout=0.0))


def get_inputs():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return torch.randint(0, 4096, (2, 64)), torch.randint(0, 4096, (2, 64))
'''


def test_the_cli_prints_that_the_planner_split_the_step(tmp_path, capsys):
    path = tmp_path / "wide_vocab.py"
    path.write_text(WIDE_VOCAB_MODEL)
    namespace: dict = {}
    exec(compile(WIDE_VOCAB_MODEL, str(path), "exec"), namespace)
    model, inputs = namespace["get_model"](), namespace["get_inputs"]()
    floor = peak_lower_bound(capture(model, inputs).graph)  # no unsplit schedule fits below it
    assert cli_main([str(path), "--budget", str(floor - 1), "--solver", "greedy", "--time-limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "so the planner split the step" in " ".join(out.split())
