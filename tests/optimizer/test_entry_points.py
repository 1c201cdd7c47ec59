"""Every entry point takes one `PlanRequest` (or its settings as keywords) and refuses a setting
it does not honour, by name, before anything is captured."""

from __future__ import annotations

import pytest
import torch
from e2e_helpers import clone, max_relative_error, small_mlp, train_step

from optimizer import apply_checkpointing, optimize, plan_only, remat_backend
from optimizer.ranks import plan_model_for_rank
from solvers.planning.distributed_budget import DataParallelConfig
from solvers.planning.request import PlanRequest, SettingsError

pytestmark = pytest.mark.usefixtures("one_thread")


def _model():
    model, inputs = small_mlp()
    return model.double(), tuple(t.double() for t in inputs)


def test_a_request_and_its_keywords_make_the_same_plan_and_gradients() -> None:
    model, inputs = _model()
    request = PlanRequest.of("70%", "test", solver="greedy", time_limit=10)
    by_request = optimize(clone(model), inputs, request)
    by_keywords = optimize(clone(model), inputs, "70%", solver="greedy", time_limit=10)
    assert by_request.plan.schedule == by_keywords.plan.schedule
    assert by_request.plan.budget_bytes == by_keywords.plan.budget_bytes
    assert plan_only(model, inputs, request).predicted_peak_bytes == by_request.plan.predicted_peak_bytes
    _, expected = train_step(model, inputs)
    _, got = train_step(by_request, inputs)
    assert max_relative_error(got, expected) < 1e-10


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, x: optimize(m, x, "70%", time_limt=5), r"optimize\(\) got an unknown setting 'time_limt'"),
    (lambda m, x: plan_only(m, x, "70%", fullgraph=True), r"plan_only\(\) got an unknown setting 'fullgraph'"),
    (lambda m, x: apply_checkpointing(m, x, budget="70%", threads=2),
     r"apply_checkpointing\(\) got an unknown setting 'threads': it takes solver, time_limit"),
    (lambda m, x: apply_checkpointing(m, x, budget=PlanRequest.of("70%", "t", milp_engine="cbc")),
     r"apply_checkpointing\(\) got an unknown setting 'milp_engine'"),
    (lambda m, x: remat_backend("70%", outputs="loss"), r"remat_backend\(\) got an unknown setting 'outputs'"),
    (lambda m, x: plan_model_for_rank(m, x, "70%", DataParallelConfig(world_size=2, strategy="ddp"), split=2),
     r"plan_model_for_rank\(\) got an unknown setting 'split'"),
])
def test_a_setting_the_entry_point_does_not_honour_is_refused_by_name(call, message) -> None:
    model, inputs = _model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(SettingsError, match=message):
        call(model, inputs)
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())  # nothing was touched
    assert not any(type(m).__name__.startswith("Checkpoint") for m in model.modules())


def test_a_rank_plan_takes_offload_as_optimize_does() -> None:
    """``plan_model_for_rank(..., offload="auto", link=...)``: the rank's plan may send saved values
    to host memory, and its rank peak still fits the per-rank budget."""
    from e2e_helpers import load_example

    from solvers.ir.link import Link

    model, inputs = load_example("gpt", dropout=0.0)
    config = DataParallelConfig(world_size=2, strategy="ddp")
    free_copies = Link("test-fast", 1e15, 1e15, 0.0)
    plain = plan_model_for_rank(model, inputs, "80%", config, solver="greedy", time_limit=10)
    ranked = plan_model_for_rank(model, inputs, "80%", config, solver="greedy", time_limit=10,
                                 offload="auto", link=free_copies)
    assert not plain.plan.offloaded and ranked.plan.offloaded
    assert ranked.predicted_rank_peak_bytes <= ranked.breakdown.budget_bytes == plain.breakdown.budget_bytes
    assert ranked.plan.extra_time_s < plain.plan.extra_time_s
