"""``apply_checkpointing(offload="auto")`` (issue 39): the eager runtime's planner chooses, per
module region, keep, recompute (checkpoint) or offload (saved-tensor hooks), and the simulator
predicts what the runtime holds.

On the CPU the copy to host is made outside dispatch modes (`frontends.graph_runtime.offload_ops`),
so the live-memory tracker counts what a GPU would hold on the device: the predicted peak is
checked against it to the byte, and the bytes the planner says leave the device against the
bytes the runtime brings back.
"""

from __future__ import annotations

import copy
import gc
from types import SimpleNamespace

import pytest
import torch
from e2e_helpers import load_example, max_relative_error, measured_peak, tiny_llama, train_step

from frontends.eager_runtime.eager_checkpoint import apply_regions, load_checkpointing
from frontends.eager_runtime.eager_offload import OffloadedForward, offload_session
from frontends.eager_runtime.split_capture import on_cpu
from frontends.measure.loop import measure_training_loop
from frontends.measure.memory_tracker import track_live_memory
from frontends.measure.step import measure_step
from optimizer import apply_checkpointing
from optimizer.checkpointing import _capture_step, _policies, checkpointed_modules, remove_checkpointing
from solvers.base import InfeasibleBudgetError
from solvers.ir.link import Link
from solvers.planning.eager_plan import OFFLOAD, OFFLOAD_PREFETCH, OFFLOADS, RegionModel
from solvers.planning.request import PlanRequest

FAST = Link("test-fast", 1e15, 1e15, 0.0)
"""A link whose copies cost nothing: offloading wins wherever it saves memory."""
SLOW = Link("test-slow", 1e8, 1e8)


def _grads(model: torch.nn.Module, inputs: tuple) -> dict[str, torch.Tensor]:
    return train_step(model, inputs)[1]


@pytest.fixture(scope="module")
def gpt():
    model, inputs = load_example("gpt", dropout=0.0)
    return model, inputs, _grads(copy.deepcopy(model), inputs)


@pytest.mark.parametrize("link, budget", [(FAST, "70%"), (SLOW, "60%"), (SLOW, "62%")])
def test_offloading_plan_runs_at_its_predicted_peak_with_plain_gradients(gpt, link, budget):
    base, inputs, reference = gpt
    model = copy.deepcopy(base)
    plan = apply_checkpointing(model, inputs, budget=budget, offload="auto", link=link, compare=False)
    offloaded = [r for r in plan.regions if r.option in OFFLOADS]
    assert offloaded and plan.plan.offloaded and plan.plan.link
    assert plan.predicted_peak_bytes <= plan.budget_bytes
    assert set(checkpointed_modules(model)) == {r.path for r in plan.regions}
    assert measured_peak(model, inputs) == plan.predicted_peak_bytes
    counts = offload_session(model).counts
    # exactly the values the plan sends to host come back (one copy per storage)
    assert counts.reloaded_bytes == sum(b for _, b in plan.plan.offloaded) > 0
    assert max_relative_error(_grads(model, inputs), reference) <= 1e-10
    if link is SLOW:  # copies that compute cannot hide are charged as extra time
        assert plan.plan.stall_time_s > 0 and plan.extra_time_s >= plan.plan.stall_time_s
    assert "offloaded" in plan.plan.message


def test_budget_below_the_recompute_only_floor_fits_with_offload(gpt):
    base, inputs, _ = gpt
    with pytest.raises(InfeasibleBudgetError, match="no schedule fits"):
        apply_checkpointing(copy.deepcopy(base), inputs, budget="60%", compare=False)
    plan = apply_checkpointing(copy.deepcopy(base), inputs, budget="60%", offload="auto", link=SLOW,
                               compare=False)
    assert "no recompute-only selection fits" in plan.plan.message
    assert plan.plan.offloaded and plan.predicted_peak_bytes <= plan.budget_bytes


def test_mixed_checkpoint_and_offload_regions_are_predicted_to_the_byte(gpt):
    """Checkpointed modules beside offloaded ones, with and without prefetch, chosen by hand."""
    base, inputs, reference = gpt
    model = copy.deepcopy(base)
    request = PlanRequest.of("100%", "test")
    step = _capture_step(model, inputs, None, 1, (request.cost_model, request.grad_outputs,
                                                   request.python_side_effects), on_cpu(model, inputs))
    regions = RegionModel(step.graph, step.found, step.labels.chunks, SLOW)
    wanted = {"blocks.0": OFFLOAD_PREFETCH, "blocks.1.attn": "none", "blocks.1.mlp": OFFLOAD,
              "blocks.2": OFFLOAD_PREFETCH}
    choices = [o for path, option in wanted.items() for o in regions.options[path] if o.option == option]
    assert len(choices) == len(wanted)
    predicted = regions.evaluate(choices)
    apply_regions(model, _policies(SimpleNamespace(choices=tuple(choices)), step.graph, step.trace, list(step.found)))
    assert measured_peak(model, inputs) == predicted.peak_bytes
    assert offload_session(model).counts.reloaded_bytes == sum(step.graph[v].bytes for v in predicted.offloaded)
    assert max_relative_error(_grads(model, inputs), reference) <= 1e-10


def test_offloading_plan_saves_loads_and_copies(gpt, tmp_path):
    base, inputs, reference = gpt
    model = copy.deepcopy(base)
    plan = apply_checkpointing(model, inputs, budget="70%", offload="auto", link=FAST, compare=False)
    path = tmp_path / "plan.json"
    plan.save(path)
    fresh = copy.deepcopy(base)
    loaded = load_checkpointing(fresh, path)
    assert [(r.path, r.option) for r in loaded.regions] == [(r.path, r.option) for r in plan.regions]
    assert measured_peak(fresh, inputs) == plan.predicted_peak_bytes
    clone = copy.deepcopy(model)  # a copied model's wrappers share a session of their own
    assert offload_session(clone) is not offload_session(model)
    assert max_relative_error(_grads(clone, inputs), reference) <= 1e-10
    assert remove_checkpointing(model) == len(plan.regions)
    assert not any(isinstance(m.__dict__.get("forward"), OffloadedForward) for m in model.modules())


def test_offload_false_plans_recomputation():
    model, inputs = load_example("gpt", dropout=0.0)
    plan = apply_checkpointing(model, inputs, budget="70%", offload=False, compare=False)
    assert plan.runtime == "eager" and not plan.plan.offloaded and checkpointed_modules(model)
    assert all(r.option not in OFFLOADS for r in plan.regions)


def test_link_without_offload_is_refused():
    model, inputs = load_example("gpt", dropout=0.0)
    with pytest.raises(ValueError, match="offload='auto'"):
        apply_checkpointing(model, inputs, budget="70%", link="pcie4", compare=False)
    assert not checkpointed_modules(model)


def test_host_budget_bounds_what_the_offloading_plan_keeps_on_host(gpt):
    base, inputs, _ = gpt
    free = apply_checkpointing(copy.deepcopy(base), inputs, budget="70%", offload="auto", link=FAST, compare=False)
    limit = free.plan.host_peak_bytes * 3 // 4
    bounded = apply_checkpointing(copy.deepcopy(base), inputs, budget="70%", offload="auto", link=FAST,
                                  host_budget=limit, compare=False)
    assert 0 < bounded.plan.host_peak_bytes <= limit < free.plan.host_peak_bytes
    assert bounded.predicted_peak_bytes <= bounded.budget_bytes
    # below the recompute-only floor, a host budget too small for any fitting offload plan is named
    with pytest.raises(InfeasibleBudgetError, match="within the host budget of") as refused:
        apply_checkpointing(copy.deepcopy(base), inputs, budget="60%", offload="auto", link=SLOW,
                            host_budget=2**20, compare=False)
    assert "no schedule fits" in str(refused.value)


@pytest.mark.parametrize("k", [1, 2])
def test_offloading_plan_holds_its_predicted_peak_over_adamw_iterations_with_accumulation(k):
    """The whole iteration (issue 41) with offloaded regions: AdamW state, accumulated gradients
    and the copies, three iterations measured against the plan (to the byte with accumulation;
    without it, 256 B over: the optimizer step's accounting, as in the recompute-only eager plans)."""
    model, inputs = load_example("gpt", torch.float32)
    plan = apply_checkpointing(model, inputs, budget="85%", optimizer="adamw", grad_accumulation=k, compare=False,
                               time_limit=5, offload="auto", link=FAST).plan
    assert plan.offloaded
    measured = measure_training_loop(model, inputs, None, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                     grad_accumulation=k)
    assert measured.peak_bytes <= plan.predicted_peak_bytes <= plan.budget_bytes
    assert plan.predicted_peak_bytes - measured.peak_bytes <= 0.001 * plan.predicted_peak_bytes


def test_values_several_offloaded_layers_save_go_to_host_once_and_are_predicted():
    """transformers Llama: every decoder layer saves the rotary cos/sin tables. With the layers
    offloaded, the tables leave the device once (one host copy per storage for the session) and
    come back once, as the schedule says: measured peak = predicted, bytes brought back = planned.
    At 75% both layers' attention is offloaded. (Where a layer that reads the tables is not
    offloaded, at 70%, the runtime still sends them to host and brings them back after that
    layer's backward frees its copy, while the schedule keeps them on the device: docs/limits.md.)"""
    model, tokens = tiny_llama(256)
    kwargs = {"labels": tokens}
    reference = copy.deepcopy(model)
    torch.manual_seed(1)
    reference(tokens, **kwargs).loss.backward()
    plan = apply_checkpointing(model, (tokens,), kwargs, budget="75%", offload="auto", link=FAST, compare=False)
    layers = [r.path for r in plan.regions if r.option in OFFLOADS and r.path.count(".") >= 2]
    assert plan.plan.offloaded and {f"model.layers.{i}.self_attn" for i in (0, 1)} <= set(layers)
    model.zero_grad(set_to_none=True)
    resident = sum(t.untyped_storage().nbytes() for t in (*model.parameters(), *model.buffers(), tokens))
    with track_live_memory() as tracker:
        torch.manual_seed(1)
        out = model(tokens, **kwargs)
        out.loss.backward()
        del out
    assert tracker.result.peak_bytes + resident == plan.predicted_peak_bytes
    assert offload_session(model).counts.reloaded_bytes == sum(b for _, b in plan.plan.offloaded)
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert max_relative_error(grads, {n: p.grad for n, p in reference.named_parameters()}) <= 1e-10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the copies run on side CUDA streams into pinned memory")
def test_offloading_plan_on_cuda_holds_its_predicted_peak_with_plain_gradients():
    """On a GPU the device peak is the allocator's (issue 39: within 3% of predicted)."""
    model, inputs = load_example("gpt", dropout=0.0)
    model, inputs = model.cuda(), tuple(t.cuda() for t in inputs)
    other = copy.deepcopy(model)
    reference = {n: g.cpu() for n, g in _grads(other, inputs).items()}
    del other
    gc.collect()
    plan = apply_checkpointing(model, inputs, budget="70%", offload="auto", link=FAST, compare=False)
    assert plan.plan.offloaded
    measured = measure_step(model, inputs, warmup=1, repeats=1)
    assert abs(measured.peak_bytes - plan.predicted_peak_bytes) <= 0.03 * plan.predicted_peak_bytes
    grads = {n: g.cpu() for n, g in _grads(model, inputs).items()}
    assert max_relative_error(grads, reference) <= 1e-10


def test_torch_compile_runs_offloaded_modules_eagerly_with_their_hooks(gpt):
    """Under ``torch.compile`` each offloaded module is a graph break (dynamo would trace into the
    hooks' storage copies and recompile per shape): it runs eagerly, its copies as planned."""
    base, inputs, reference = gpt
    model = copy.deepcopy(base)
    plan = apply_checkpointing(model, inputs, budget="70%", offload="auto", link=FAST, compare=False)
    compiled = torch.compile(model, backend="aot_eager")
    grads = {n.removeprefix("_orig_mod."): g for n, g in _grads(compiled, inputs).items()}
    assert max_relative_error(grads, reference) <= 1e-10
    assert offload_session(model).counts.reloaded_bytes == sum(b for _, b in plan.plan.offloaded)


def test_fsdp2_per_block_runs_an_offloading_plan_like_plain_fsdp(tmp_path):
    """A plan that offloads, loaded before ``fully_shard`` on every block and the root (two gloo
    ranks, two SGD steps): FSDP2 gathers each block's parameters before its forward and frees
    them after, while the offloaded regions' hooks copy what autograd saves; losses and gradients
    equal plain FSDP2's."""
    from eager_ranks import run_fsdp_ranks  # a light module: each spawned rank imports it

    model, inputs = load_example("gpt", torch.float64, dropout=0.0)
    plan = apply_checkpointing(model, inputs, budget="70%", offload="auto", link=FAST, compare=False)
    assert any(r.option in OFFLOADS for r in plan.regions)
    path = tmp_path / "plan.json"
    plan.save(path)
    offloaded = sum(b for _, b in plan.plan.offloaded)
    for result in run_fsdp_ranks(str(path)):
        (plain_losses, plain_grads, _, _), (losses, grads, wrapped, reloaded) = result[False], result[True]
        assert wrapped == sorted(r.path for r in plan.regions)
        assert reloaded == 2 * offloaded  # two steps, each bringing back what the plan offloads
        for a, b in zip(losses, plain_losses):
            assert a.item() == pytest.approx(b.item(), rel=1e-12)
        for g, h in zip(grads, plain_grads):
            assert max_relative_error(g, h) < 1e-10
