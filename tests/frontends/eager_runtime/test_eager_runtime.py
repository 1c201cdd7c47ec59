"""The eager runtime: remat-opt plans, torch.utils.checkpoint runs it, on the user's own model.

Checked on CPU: the simulated peak matches the measured one within 2%, gradients equal plain
autograd (float64; dropout under the same seed too), the model stays the user's (state dict,
hooks, eval, deepcopy) and `remove_checkpointing` undoes everything, a smaller batch runs with a
smaller peak, autocast runs, a saved plan applies to a fresh model without capture and refuses
another one in one line, transformers' GPT-2 plans and trains, transformers' Llama's predicted
peak is within 2% of the measured one, and the CLI emits a plan.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json

import pytest
import torch
from e2e_helpers import example_path, load_example, max_relative_error, measured_peak, tiny_llama
from torch import nn

import optimizer.checkpointing as checkpointing_module
from frontends.eager_runtime import eager_checkpoint
from frontends.eager_runtime.eager_checkpoint import apply_regions, recomputes_batch_norm
from frontends.eager_runtime.eager_ops import (
    candidates,
    capture_for_eager,
    eager_graph,
    held_values,
    region_policy,
    trace_eager,
)
from optimizer.checkpointing import (
    CheckpointPlanError,
    apply_checkpointing,
    checkpointed_modules,
    load_checkpointing,
    remove_checkpointing,
    save_checkpointing_plan,
)
from optimizer.cli import EXIT_USAGE, main
from solvers.base import InfeasibleBudgetError
from solvers.baselines import store_all_schedule
from solvers.ir.graph import Node, NodeKind, Phase, RematGraph
from solvers.ir.simulator import simulate
from solvers.planning.eager_plan import (
    RegionCandidate,
    RegionModel,
    fixed_choice_solution,
    solve_eager,
    with_autograd_node_holds,
    with_holds,
)

pytestmark = pytest.mark.usefixtures("one_thread")

PEAK_TOLERANCE = 0.02


class Gate(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.proj(x)) * x


class ToyBlock(nn.Module):
    """Residual block with submodules of several shapes (norm, gate, feed-forward)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.gate = Gate(d)
        self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.Tanh(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate(self.norm(x))
        return x + self.ffn(h)


class ToyNet(nn.Module):
    def __init__(self, d: int = 32, depth: int = 3) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.stem = nn.Linear(d, d)
            self.blocks = nn.ModuleList(ToyBlock(d) for _ in range(depth))
            self.head = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return nn.functional.mse_loss(self.head(x), target)


def toy_inputs(dtype: torch.dtype, batch: int = 256, d: int = 32) -> tuple:
    g = torch.Generator().manual_seed(1)
    return torch.randn(batch, d, generator=g, dtype=dtype), torch.randn(batch, d, generator=g, dtype=dtype)


@pytest.fixture(scope="module")
def gpt_plan(tmp_path_factory):
    """examples/gpt.py in float64 with dropout, planned once at 65% (comparisons included)."""
    torch.set_num_threads(1)
    model, inputs = load_example("gpt", torch.float64)
    plan = apply_checkpointing(model, inputs, budget="65%", time_limit=2)
    path = tmp_path_factory.mktemp("eager") / "plan.json"
    save_checkpointing_plan(plan, path)
    return model, inputs, plan, path


def _grads(model: nn.Module, inputs: tuple, seed: int = 0):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    out = model(*inputs)
    loss = out[0] if isinstance(out, (tuple, list)) else out
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


# ------------------------------------------------------------------ the plan and its peak
def test_plan_is_eager_feasible_and_compared(gpt_plan):
    _, _, plan, _ = gpt_plan
    assert plan.runtime == "eager"
    assert plan.regions, "a 65% budget needs checkpointing"
    assert plan.predicted_peak_bytes <= plan.budget_bytes < plan.store_all_peak_bytes
    assert plan.plan.schedule is not None
    assert plan.bound is None or plan.bound <= plan.plan.objective + 1e-12
    summary = dict(plan.summary)
    for key in ("per_block_extra_flops", "per_block_peak_bytes"):
        assert key in summary
    assert "graph_runtime_extra_flops" in summary or "graph_runtime_error" in summary
    # regions are any submodules, not only the repeated blocks
    assert any(r.path.count(".") >= 2 for r in plan.regions)


def test_predicted_peak_matches_measured_gpt(gpt_plan):
    model, inputs, plan, _ = gpt_plan
    measured = measured_peak(model, inputs)
    assert measured == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)
    assert measured < 0.7 * plan.store_all_peak_bytes


@pytest.mark.parametrize("budget", ["90%", "70%"])
def test_predicted_peak_matches_measured_toy(budget):
    model, inputs = ToyNet().double(), toy_inputs(torch.float64)
    plan = apply_checkpointing(model, inputs, budget=budget, compare=False)
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    assert measured_peak(model, inputs) == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)


def test_gradients_equal_plain_autograd_float64():
    model, inputs = ToyNet().double(), toy_inputs(torch.float64)
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, inputs, budget="70%", compare=False)
    assert plan.regions
    loss, grads = _grads(model, inputs)
    ref_loss, ref_grads = _grads(reference, inputs)
    assert torch.equal(loss, ref_loss)
    assert max_relative_error(grads, ref_grads) < 1e-10


def test_batch_norm_blocks_are_checkpointed_and_update_statistics_once():
    """examples/convnet.py (conv-BN-ReLU residual blocks, train mode) at 85%: regions rerun
    their batch norms with the statistics frozen (momentum 0) and keep ``num_batches_tracked``'s
    ``add_``, so gradients, running statistics and the batch count equal plain autograd's after
    a step, bit for bit; the prediction holds."""
    model, inputs = load_example("convnet")
    model = model.double().train()
    inputs = tuple(i.double() if i.is_floating_point() else i for i in inputs)
    reference = copy.deepcopy(model)
    plan = apply_checkpointing(model, inputs, budget="85%", compare=False, time_limit=5)
    assert any(recomputes_batch_norm(r.save, r.expected_ops) for r in plan.regions)
    assert any(op == "aten.add_.Tensor" for r in plan.regions for op, _ in r.save)
    loss, grads = _grads(model, inputs)
    ref_loss, ref_grads = _grads(reference, inputs)
    assert torch.equal(loss, ref_loss)
    assert max_relative_error(grads, ref_grads) < 1e-10
    for (name, buf), ref in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(buf, ref), name
    compiled, twin = torch.compile(copy.deepcopy(model), backend="aot_eager"), copy.deepcopy(reference)
    assert torch.equal(_grads(compiled, inputs)[0], _grads(twin, inputs)[0])
    for (name, buf), ref in zip(compiled.named_buffers(), twin.buffers()):
        assert torch.equal(buf, ref), name  # compiled, statistics are still updated once
    assert measured_peak(model, inputs) == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_regions_keeping_only_batch_norm_counters_run_plain_checkpoint(monkeypatch, momentum):
    """examples/resnet.py with the outermost regions whose saved set is only their BatchNorms' step
    counters (the stem's norm; all blocks as one Sequential, 14 counters) checkpointed: plain
    checkpoint (no policy, so no dispatch mode), the norms frozen by attribute on the rerun. After
    two steps the gradients, running statistics, batch counts and momentum equal plain
    autograd's, bit for bit (momentum None: the cumulative average reads the count)."""
    model, inputs = load_example("resnet")
    model = model.double().train()
    inputs = tuple(i.double() if i.is_floating_point() else i for i in inputs)
    captured = capture_for_eager(model, inputs, None)  # momentum None reads the count: not traceable
    graph = eager_graph(captured.graph, captured.gm, True)
    trace = trace_eager(model, inputs)
    found = candidates(graph, trace, model)
    regions = RegionModel(with_holds(graph, held_values(graph, trace, found)), found)
    chosen = []
    for cand in sorted(found, key=lambda c: c.path.count(".")):
        option = {o.option: o for o in regions.options.get(cand.path, ())}.get("none")
        if cand.counters_run_plain and option is not None and set(option.saved) <= regions.run_once \
                and not any(cand.path.startswith(c.path + ".") for c in chosen):
            chosen.append(region_policy(option, regions.graph, trace, cand.mappable))
    assert {"stem.1", "blocks"} <= {r.path for r in chosen} and all(r.save for r in chosen)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.momentum = momentum
    reference = copy.deepcopy(model)
    apply_regions(model, tuple(chosen))
    modules = dict(model.named_modules())
    assert all(eager_checkpoint.keeps_only_batch_norm_counters(modules[r.path], r.save, r.expected_ops)
               for r in chosen)
    policies = []
    real = eager_checkpoint._policy_contexts
    monkeypatch.setattr(eager_checkpoint, "_policy_contexts",
                        lambda *args, **kwargs: policies.append(args[0]) or real(*args, **kwargs))
    for _ in range(2):
        loss, grads = _grads(model, inputs)
        ref_loss, ref_grads = _grads(reference, inputs)
        assert torch.equal(loss, ref_loss)
        assert max_relative_error(grads, ref_grads) < 1e-10
    assert policies == []
    for (name, buf), ref in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(buf, ref), name
    assert all(m.momentum == momentum for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_only_batch_norm_counters_means_nothing_else_kept_or_written():
    block = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.BatchNorm1d(8))
    counters = (("aten.add_.Tensor", (0, 1)),)
    ops = (("aten.addmm.default", 1), ("aten.add_.Tensor", 2), ("aten.native_batch_norm.default", 2),
           ("aten.relu.default", 1))
    keeps = eager_checkpoint.keeps_only_batch_norm_counters
    assert keeps(block, counters, ops)
    assert not keeps(block, (*counters, ("aten.addmm.default", (0,))), ops)  # keeps a matmul too
    assert not keeps(block, (("aten.add_.Tensor", (0,)),), ops)  # one counter would rerun
    assert not keeps(block, counters, (*ops, ("aten.relu_.default", 1)))  # another in-place write
    assert not keeps(nn.Sequential(nn.Linear(8, 8)), (), (("aten.addmm.default", 1),))  # no norm
    untracked = nn.Sequential(nn.BatchNorm1d(8, track_running_stats=False))
    assert not keeps(untracked, (("aten.add_.Tensor", (0,)),), (("aten.add_.Tensor", 1),
                                                                  ("aten.native_batch_norm.default", 1)))


def test_keeping_only_batch_norm_counters_is_charged_no_policy():
    """The planner charges the policy to options that keep more than the counters, not to one
    that keeps only them, where the runtime runs plain checkpoint."""
    model, inputs = load_example("convnet")
    captured = capture_for_eager(model, inputs, None)
    graph = eager_graph(captured.graph, captured.gm, True)
    trace = trace_eager(model, inputs)
    found = candidates(graph, trace, model)
    assert any(c.counters_run_plain for c in found)
    graph = with_holds(graph, held_values(graph, trace, found))
    charged = RegionModel(graph, [dataclasses.replace(c, policy_s=1.0) for c in found])
    free = RegionModel(graph, [dataclasses.replace(c, policy_s=0.0) for c in found])
    counters_only = 0
    for path, options in charged.options.items():
        for plain, option in zip(free.options[path], options):
            if charged.counters_run_plain[path] and set(option.saved) <= charged.run_once:
                counters_only += 1
                assert option.saved and option.extra_cost == plain.extra_cost
            elif option.saved:
                assert option.extra_cost > plain.extra_cost + 1.0
    assert counters_only


def test_the_eager_graph_writes_nothing_in_place_by_the_graph_runtime_rule():
    """Eager autograd accumulates by its own rules: the capture's in-place candidates
    (`solvers.ir.inplace`, the graph runtime's) are dropped, or a residual network's eager plan
    is predicted 32 KiB under what it measures (examples/resnet.py at per-block's peak)."""
    model, inputs = load_example("convnet")
    captured = capture_for_eager(model, inputs, None)
    assert any(n.reuses for n in captured.graph.ops)
    assert not any(n.reuses for n in eager_graph(captured.graph, captured.gm, True).ops)


class InPlaceBlock(nn.Module):
    """BatchNorm followed by an in-place ReLU (as timm's and torchvision's ResNets write it), then
    a linear layer (``end_relu=False``) or not: SAC could not keep the batch norm's step counter
    safely beside the ``relu_``."""

    def __init__(self, end_relu: bool = True) -> None:
        super().__init__()
        self.lin, self.bn, self.act = nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(inplace=True)
        self.out = nn.Identity() if end_relu else nn.Linear(32, 32)

    def forward(self, x):
        return self.out(self.act(self.bn(self.lin(x))))


class MeanOf(nn.Module):
    def forward(self, x):
        return x.mean()


def _in_place_blocks(end_relu: bool):
    torch.manual_seed(0)
    blocks = [InPlaceBlock(end_relu) for _ in range(3)]
    return nn.Sequential(*blocks, nn.Linear(32, 1), MeanOf()).double(), torch.randn(64, 32, dtype=torch.float64)


def test_a_block_with_other_in_place_ops_is_checkpointed_plain_keeping_nothing():
    """Its counters cannot be named by a policy, so it offers only saved sets a policy would
    not name a value of: plain checkpoint, the norms frozen on the rerun (`counters_run_plain`)."""
    model, x = _in_place_blocks(end_relu=False)
    captured = capture_for_eager(model, (x,), None)
    graph = eager_graph(captured.graph, captured.gm, True)
    found = {c.path: c for c in candidates(graph, trace_eager(model, (x,)), model)}
    region_model = RegionModel(graph, list(found.values()))
    assert "0" in region_model.plain_only and found["0"].counters_run_plain
    assert region_model.options["0"]
    assert all(not set(o.saved) & found["0"].mappable for o in region_model.options["0"])
    assert "0.lin" in region_model.regions  # the rest stays plannable


@pytest.mark.parametrize("end_relu", [False, True])
def test_blocks_with_in_place_ops_train_like_plain_autograd_checkpointed(monkeypatch, end_relu):
    """Two such blocks checkpointed: gradients, running statistics and batch counts equal plain
    autograd's after a step, bit for bit, no policy runs, and the peak is predicted to the byte.
    Where a block ends in its in-place ReLU, the next block's checkpoint holds that output as its
    argument: a storage the norm made and the ReLU wrote over, so it is the ReLU's value, matched by
    size, not the norm's (held as an extra 16 KiB before, 1% of timm's resnet18)."""
    model, x = _in_place_blocks(end_relu)
    reference = copy.deepcopy(model)
    monkeypatch.setattr(checkpointing_module, "solve_eager",
                        lambda graph, found, budget, **_: fixed_choice_solution(graph, found, ["0", "1"], "none"))
    plan = apply_checkpointing(model, (x,), budget="100%", compare=False)
    assert [(r.path, r.save) for r in plan.regions] == [("0", ()), ("1", ())]
    measured = measured_peak(model, (x,))
    assert measured == plan.predicted_peak_bytes
    with torch.no_grad():
        for buf, ref in zip(model.buffers(), reference.buffers()):
            buf.copy_(ref)  # the measured step counted a batch
    policies = []
    real = eager_checkpoint._policy_contexts
    monkeypatch.setattr(eager_checkpoint, "_policy_contexts",
                        lambda *args, **kwargs: policies.append(args[0]) or real(*args, **kwargs))
    loss, grads = _grads(model, (x,))
    ref_loss, ref_grads = _grads(reference, (x,))
    assert torch.equal(loss, ref_loss) and max_relative_error(grads, ref_grads) < 1e-10
    assert policies == []
    for (name, buf), ref in zip(model.named_buffers(), reference.buffers()):
        assert torch.equal(buf, ref), name


def test_dropout_replays_under_the_same_seed(gpt_plan, tmp_path):
    _, inputs, _, path = gpt_plan
    model, _ = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    load_checkpointing(model, path)
    assert any("drop" in name for name, m in model.named_modules() if m.training)
    for seed in (0, 1):
        loss, grads = _grads(model, inputs, seed)
        ref_loss, ref_grads = _grads(reference, inputs, seed)
        assert torch.equal(loss, ref_loss)
        assert max_relative_error(grads, ref_grads) < 1e-10


# ------------------------------------------------------------------ the user's model stays theirs
def test_remove_checkpointing_restores_the_model(gpt_plan):
    _, inputs, _, path = gpt_plan
    model, _ = load_example("gpt", torch.float64)
    calls = []
    hook = model.blocks[1].register_forward_hook(lambda m, a, o: calls.append(1))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    with torch.no_grad():
        eval_out = model(*inputs)[0]
    model.train()
    plan = load_checkpointing(model, path)
    assert set(checkpointed_modules(model)) == {r.path for r in plan.regions}
    assert model.state_dict().keys() == before.keys()
    model(*inputs)[0].backward()  # hooks of wrapped modules still fire
    model.eval()
    with torch.no_grad():  # eval: the original forward, the same outputs
        assert torch.equal(model(*inputs)[0], eval_out)
    model.train()
    assert len(calls) == 3
    assert remove_checkpointing(model) >= len(plan.regions)
    assert not checkpointed_modules(model)
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    model(*inputs)
    assert len(calls) == 4
    hook.remove()


def test_deepcopy_and_eval_of_a_checkpointed_model(gpt_plan):
    _, inputs, _, path = gpt_plan
    model, _ = load_example("gpt", torch.float64, dropout=0.0)
    load_checkpointing(model, path)
    twin = copy.deepcopy(model)
    assert checkpointed_modules(twin) == checkpointed_modules(model)
    for m in twin.modules():
        forward = m.__dict__.get("forward")
        if forward is not None:
            assert forward.module is m  # the copy's wrappers run the copy
    loss, grads = _grads(model, inputs)
    twin_loss, twin_grads = _grads(twin, inputs)
    assert torch.equal(loss, twin_loss)
    assert max_relative_error(grads, twin_grads) < 1e-12
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(*inputs)[0])


def test_a_smaller_batch_runs_and_peaks_lower(gpt_plan):
    model, inputs, _, _ = gpt_plan
    small = tuple(t[:2] for t in inputs)
    full_peak = measured_peak(model, inputs)
    small_peak = measured_peak(model, small)
    assert small_peak <= full_peak

def test_autocast_runs():
    model, inputs = ToyNet(), toy_inputs(torch.float32)
    reference = copy.deepcopy(model)
    apply_checkpointing(model, inputs, budget="70%", compare=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, grads = _grads(model, inputs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss, ref_grads = _grads(reference, inputs)
    assert torch.isfinite(loss)
    assert torch.equal(loss, ref_loss)
    assert max_relative_error(grads, ref_grads) < 1e-6


# ------------------------------------------------------------------ plans as files
def test_load_checkpointing_on_another_model_is_one_line_and_applies_nothing(gpt_plan):
    _, _, _, path = gpt_plan
    model, _ = load_example("gpt", torch.float64)
    model.blocks = model.blocks[:2]  # another layer count
    with pytest.raises(CheckpointPlanError) as caught:
        load_checkpointing(model, path)
    assert "\n" not in str(caught.value) and "apply_checkpointing" in str(caught.value)
    assert not checkpointed_modules(model)
    with pytest.raises(CheckpointPlanError, match="cannot read checkpointing plan"):
        load_checkpointing(model, example_path("gpt"))


def test_saved_plan_round_trips(gpt_plan):
    _, _, plan, path = gpt_plan
    data = json.loads(path.read_text())
    assert data["schema"] == "remat-opt/eager-plan/1" and data["runtime"] == "eager"
    model, _ = load_example("gpt", torch.float64)
    loaded = load_checkpointing(model, path)
    assert loaded.regions == plan.regions
    assert loaded.predicted_peak_bytes == plan.predicted_peak_bytes
    with pytest.raises(CheckpointPlanError, match="already checkpointed"):
        load_checkpointing(model, path)


# ------------------------------------------------------------------ the planner alone (IR)
def test_planner_schedules_simulate_within_budget():
    model, inputs = ToyNet().double(), toy_inputs(torch.float64)
    captured = capture_for_eager(model, inputs, None)
    graph = eager_graph(captured.graph, captured.gm, True)
    trace = trace_eager(model, inputs)
    found = candidates(graph, trace, model)
    graph = with_holds(graph, held_values(graph, trace, found))
    everything = solve_eager(graph, found, "100%")
    assert everything.choices == () and everything.extra_cost == 0
    previous = 0.0
    for budget in ("90%", "80%", "70%"):
        solution = solve_eager(graph, found, budget)
        sim = simulate(RegionModel(graph, found).graph, solution.schedule)
        assert sim.peak_bytes == solution.simulation.peak_bytes <= solution.budget_bytes
        assert solution.bound is None or solution.bound <= solution.extra_cost + 1e-15
        assert solution.extra_cost >= previous - 1e-15
        previous = solution.extra_cost
    assert all(isinstance(c, RegionCandidate) for c in found)


def test_a_policy_is_charged_per_op_only_where_a_region_keeps_something():
    """A region that keeps nothing runs plain checkpoint (no dispatch mode): its options cost the
    same with or without a policy charge; one that keeps something costs its forward's charge
    plus the rerun's share more."""
    model, inputs = ToyNet().double(), toy_inputs(torch.float64)
    captured = capture_for_eager(model, inputs, None)
    graph = eager_graph(captured.graph, captured.gm, True)
    trace = trace_eager(model, inputs)
    found = candidates(graph, trace, model)
    assert all(c.policy_s == 0 for c in found)  # priced in FLOPs: no Python overhead to charge
    graph = with_holds(graph, held_values(graph, trace, found))
    free = [dataclasses.replace(c, policy_s=0.0) for c in found]
    charged = [dataclasses.replace(c, policy_s=1.0) for c in found]
    without, with_policy = RegionModel(graph, free), RegionModel(graph, charged)
    kept_something = 0
    for path, options in with_policy.options.items():
        for plain, option in zip(without.options[path], options):
            assert (plain.option, plain.saved) == (option.option, option.saved)
            if option.saved:
                kept_something += 1
                share = len(option.recompute_groups) / len(with_policy.regions[path])
                assert option.extra_cost == pytest.approx(plain.extra_cost + 1.0 + share)
            else:
                assert option.extra_cost == plain.extra_cost
    assert kept_something


def test_an_autograd_node_frees_what_it_read_when_it_returns():
    """y = a * b: MulBackward0 makes grad_a = g * b and grad_b = g * a. Op by op, ``b`` dies
    after grad_a (1,000 B); eager autograd frees it with the Node, after grad_b, so the peak
    holds it too. The gradient accumulation ``add`` that follows carries the same seq_nr but is
    not consecutive with the Node's ops, so it is no part of it."""
    f, bw = Phase.FORWARD, Phase.BACKWARD

    def op(name, phase, size, inputs):
        return Node(name, NodeKind.OP, phase, size, inputs, group=name, cost=1.0)

    graph = RematGraph((
        Node("x", NodeKind.INPUT, f, 8), Node("w", NodeKind.PARAMETER, f, 8),
        op("a", f, 1000, ("x", "w")), op("b", f, 1000, ("x", "w")), op("y", f, 8, ("a", "b")),
        Node("g", NodeKind.TANGENT, bw, 8),
        op("grad_a", bw, 1000, ("g", "b")), op("grad_b", bw, 1000, ("g", "a")),
        op("other", bw, 8, ("grad_a",)), op("acc", bw, 8, ("other", "grad_b")),
    ), ("y",), ("y",), ("acc",))
    node_of = {"grad_a": 7, "grad_b": 7, "other": 3, "acc": 7}
    held = with_autograd_node_holds(graph, node_of)
    assert [n.name for n in held.nodes if n.name.startswith("eager_node::")] == ["eager_node::7.0"]
    assert held["eager_node::7.0"].inputs == ("b",)
    plain, eager = (simulate(g, store_all_schedule(g)).peak_bytes for g in (graph, held))
    assert eager == plain + 1000


# ------------------------------------------------------------------ transformers and the CLI
class LossAndLogits(nn.Module):
    """A transformers causal LM as a step the benchmarks measure: (loss, logits) of ids -> ids."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        out = self.model(input_ids=ids, labels=labels)
        return out.loss, out.logits


def test_transformers_gpt2_plans_and_trains():
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64)
    torch.manual_seed(0)
    model = LossAndLogits(transformers.GPT2LMHeadModel(config).double().train())
    reference = copy.deepcopy(model)
    ids = torch.randint(1, 128, (4, 16), generator=torch.Generator().manual_seed(0))
    plan = apply_checkpointing(model, (ids, ids), budget="75%", compare=False)
    assert plan.regions and "use_cache=False" in plan.message
    measured = measured_peak(model, (ids, ids))
    # GPT-2's gelu_new is Python arithmetic, whose MulBackward0 nodes hold both factors until
    # both gradients exist, and CPU dropout keeps a float mask: both modelled (`eager_graph`),
    # the prediction is within 1 KiB here (it was 4.3% below before).
    assert measured == pytest.approx(plan.predicted_peak_bytes, rel=PEAK_TOLERANCE)
    assert measured < 0.85 * plan.store_all_peak_bytes
    losses = []
    for m in (model, reference):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        run = []
        for step in range(2):
            opt.zero_grad(set_to_none=True)
            torch.manual_seed(step)
            loss = m(ids, ids)[0]
            loss.backward()
            opt.step()
            run.append(loss.item())
        losses.append(run)
    assert losses[0] == pytest.approx(losses[1], rel=1e-10)
    assert model.model.config.use_cache is True  # the config is the user's, unchanged


def test_transformers_llama_predicted_peak_within_tolerance():
    """A small transformers Llama (SDPA attention, SwiGLU MLP, RMSNorm): the eager runtime's
    prediction is within 0.05% of the measured peak. Measured on CPU in float64: equal at 85% and at
    plain autograd, 256 B below at 80% (4 B more before schedules held the loss's gradient seed
    to the end of backward, as ``loss.backward()`` does). Until
    capture called attention as eager does (`attention_masks_as_eager`), the prediction was 2.09%
    *above*: the traced step built two causal masks (32 KiB each) that eager never makes.
    (Before eager autograd's release points were modelled, `with_autograd_node_holds`, it was
    1.1% below: SwiGLU's ``MulBackward0`` holds both factors until both gradients exist.)"""
    llama, ids = tiny_llama(intermediate_size=128)
    model = LossAndLogits(llama)
    plan = apply_checkpointing(model, (ids, ids), budget="85%", compare=False, time_limit=2)
    assert plan.regions and plan.predicted_peak_bytes <= plan.budget_bytes
    measured = measured_peak(model, (ids, ids))
    assert abs(plan.predicted_peak_bytes - measured) <= 0.0005 * measured
    assert measured < 0.9 * plan.store_all_peak_bytes


def test_cli_emits_an_eager_plan(tmp_path):
    out = tmp_path / "plan.json"
    assert main([example_path("gpt"), "--budget", "70%", "--runtime", "eager", "--emit", str(out),
                 "--time-limit", "1"]) == 0
    model, _ = load_example("gpt", torch.float32)
    plan = load_checkpointing(model, out)
    assert plan.regions and plan.runtime == "eager"
    assert main([example_path("gpt"), "--budget", "70%", "--emit", str(out)]) == EXIT_USAGE


def test_regions_that_save_nothing_run_without_a_policy(gpt_plan, monkeypatch):
    """Plain checkpoint for a region that keeps nothing: no selective-checkpoint policy, whose
    dispatch mode would see every op of the region (its Python cost is per op). Regions that
    keep something still get one policy per call; gradients stay eager's."""
    _, inputs, plan, path = gpt_plan
    saving = [r for r in plan.regions if r.save]
    assert saving and len(saving) < len(plan.regions), "the 65% plan should mix both kinds of region"
    policies = []
    real = eager_checkpoint._policy_contexts
    monkeypatch.setattr(eager_checkpoint, "_policy_contexts",
                        lambda *args, **kwargs: policies.append(args[0]) or real(*args, **kwargs))
    model, _ = load_example("gpt", torch.float64)
    reference = copy.deepcopy(model)
    load_checkpointing(model, path)
    loss, grads = _grads(model, inputs)
    assert sorted(policies) == sorted(r.save for r in saving)
    ref_loss, ref_grads = _grads(reference, inputs)
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert max_relative_error(grads, ref_grads) < 1e-10


def test_torch_compile_runs_the_checkpointed_model(gpt_plan):
    _, inputs, plan, path = gpt_plan
    assert any(r.save for r in plan.regions), "the plan keeps some ops (MUST_SAVE)"
    model, _ = load_example("gpt", torch.float64, dropout=0.0)
    reference = copy.deepcopy(model)
    load_checkpointing(model, path)
    compiled = torch.compile(model, backend="aot_eager")
    try:
        loss, _ = _grads(compiled, inputs)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        ref_loss, ref_grads = _grads(reference, inputs)
    finally:
        torch._dynamo.reset()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-12)
    assert max_relative_error(grads, ref_grads) < 1e-10


def test_fsdp2_per_block_on_two_ranks_trains_like_plain_fsdp(gpt_plan):
    from eager_ranks import run_fsdp_ranks  # a light module: each spawned rank imports it

    _, _, plan, path = gpt_plan
    ranks = run_fsdp_ranks(str(path))
    for result in ranks:
        (plain_losses, plain_grads, none, _), (losses, grads, wrapped, _) = result[False], result[True]
        assert none == [] and wrapped == sorted(r.path for r in plan.regions)
        for a, b in zip(losses, plain_losses):
            assert a.item() == pytest.approx(b.item(), rel=1e-12)
        for g, h in zip(grads, plain_grads):
            assert max_relative_error(g, h) < 1e-10


def test_hf_trainer_example_trains_like_without_checkpointing():
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")  # Trainer's requirement; the example says how to install it
    spec = importlib.util.spec_from_file_location("_hf_trainer_example", example_path("hf_trainer"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--steps", "3", "--budget", "65%"]) == 0


def test_an_unreachable_budget_names_the_leanest_plan_and_changes_nothing():
    model, inputs = load_example("mlp", torch.float32)  # F.gelu between the layers: no region helps
    with pytest.raises(InfeasibleBudgetError) as caught:
        apply_checkpointing(model, inputs, budget="80%", compare=False)
    assert "optimize()" in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.smallest_feasible_bytes is not None
    assert not checkpointed_modules(model)


class NormSiLU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.bn, self.act = nn.Linear(32, 32), nn.BatchNorm1d(32), nn.SiLU(inplace=True)

    def forward(self, x):
        return self.act(self.bn(self.lin(x)))


def test_an_in_place_silus_backward_is_labelled_with_its_module(monkeypatch):
    """An in-place SiLU's backward carries an autograd number no forward op carries (its clone and
    silu carry the next); unlabelled, the clone it reads seemed read outside the module, and a
    checkpoint of the block seemed to keep it: two activations high (timm's MobileViT 18%)."""
    torch.manual_seed(0)
    model = nn.Sequential(NormSiLU(), NormSiLU(), NormSiLU(), nn.Linear(32, 1), MeanOf()).double()
    x = torch.randn(64, 32, dtype=torch.float64)
    graph = capture_for_eager(model, (x,), None).graph
    assert {n.module for n in graph.ops if n.op.startswith("aten.silu_backward")} == {"0.act", "1.act", "2.act"}
    monkeypatch.setattr(checkpointing_module, "solve_eager",
                        lambda graph, found, budget, **_: fixed_choice_solution(graph, found, ["0", "1"], "none"))
    plan = apply_checkpointing(model, (x,), budget="100%", compare=False)
    # 768 B below, as plain autograd's step is without any checkpoint (was 33,536 B)
    assert abs(measured_peak(model, (x,)) - plan.predicted_peak_bytes) <= 1024


class GrowingFeatures(nn.Module):
    """DenseNet's pattern: every layer gets the block's feature list, which grows after the call."""

    def __init__(self, width: int = 16, depth: int = 3) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(width * (i + 1), width), nn.Tanh())
                                    for i in range(depth))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1).pow(2).mean()


class ListInput(nn.Module):
    def forward(self, features):
        return torch.cat(features, 1)


def test_a_checkpointed_module_reruns_on_the_argument_list_it_was_called_with(monkeypatch):
    """checkpoint keeps the call's arguments; the caller appends to the list afterwards, so a
    rerun on that list object saw more tensors than forward did (a shape error in timm's
    DenseNet). The rerun now gets the containers as they were at the call."""
    torch.manual_seed(0)
    model = GrowingFeatures().double()
    for layer in model.layers:
        layer.insert(0, ListInput())
    x = torch.randn(64, 16, dtype=torch.float64)
    reference = copy.deepcopy(model)
    monkeypatch.setattr(checkpointing_module, "solve_eager",
                        lambda graph, found, budget, **_: fixed_choice_solution(
                            graph, found, ["layers.0", "layers.1"], "none"))
    plan = apply_checkpointing(model, (x,), budget="100%", compare=False)
    assert [r.path for r in plan.regions] == ["layers.0", "layers.1"]
    loss, grads = _grads(model, (x,))
    ref_loss, ref_grads = _grads(reference, (x,))
    assert torch.equal(loss, ref_loss) and max_relative_error(grads, ref_grads) < 1e-10


class SqueezeExciteLike(nn.Module):
    """timm's squeeze-excite: a projection, then ``ReLU(inplace=True)`` writing over it."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.reduce, self.act, self.expand = nn.Linear(width, 8), nn.ReLU(inplace=True), nn.Linear(8, width)

    def forward(self, x):
        return x * torch.sigmoid(self.expand(self.act(self.reduce(x))))


def test_a_policy_never_keeps_an_output_a_later_in_place_op_writes(monkeypatch):
    """SAC refuses a cached tensor that was mutated ("Tensor cached during selective activation
    checkpoint has been mutated": timm's GhostNet at 60% of its activations). The eager trace
    marks ops whose output an in-place op writes later; they are not mappable, so no saved set
    keeps them, and the plan that keeps everything else runs."""
    torch.manual_seed(0)
    model = nn.Sequential(SqueezeExciteLike(), SqueezeExciteLike(), nn.Linear(32, 1), MeanOf()).double()
    x = torch.randn(64, 32, dtype=torch.float64)
    captured = capture_for_eager(model, (x,), None)
    graph = eager_graph(captured.graph, captured.gm, True)
    found = {c.path: c for c in candidates(graph, trace_eager(model, (x,)), model)}
    reduce_out = [n.name for n in graph.ops if n.module == "0.reduce" and n.phase is Phase.FORWARD]
    expand_out = [n.name for n in graph.ops if n.module == "0.expand" and n.phase is Phase.FORWARD]
    assert reduce_out and expand_out
    assert not set(reduce_out) & found["0"].mappable and set(expand_out) <= found["0"].mappable
    reference = copy.deepcopy(model)
    monkeypatch.setattr(checkpointing_module, "solve_eager",
                        lambda graph, found, budget, **_: fixed_choice_solution(graph, found, ["0", "1"], "all"))
    plan = apply_checkpointing(model, (x,), budget="100%", compare=False)
    assert all(r.save for r in plan.regions)
    loss, grads = _grads(model, (x,))
    ref_loss, ref_grads = _grads(reference, (x,))
    assert torch.equal(loss, ref_loss) and max_relative_error(grads, ref_grads) < 1e-10
