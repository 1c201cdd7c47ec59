"""``apply_checkpointing(offload=...)`` (issue 39): the eager runtime plans recomputation only.

Its region planner does not choose offloads, so ``offload="auto"`` is refused before anything is
captured or applied, with the entry points that do plan offloads named; ``offload=False`` plans
as without it.
"""

from __future__ import annotations

import pytest
from e2e_helpers import load_example, small_mlp

from optimizer import apply_checkpointing
from optimizer.checkpointing import EAGER_OFFLOAD_REFUSED, checkpointed_modules
from solvers.planning.request import PlanRequest


@pytest.mark.parametrize("how", ["keyword", "request"])
def test_offload_auto_is_refused_naming_the_runtimes_that_plan_it(how):
    model, inputs = small_mlp()
    settings = {"offload": "auto", "link": "pcie4"}
    with pytest.raises(ValueError, match="optimize.*offload='auto'.*remat_backend") as refused:
        if how == "keyword":
            apply_checkpointing(model, inputs, budget="70%", **settings)
        else:
            apply_checkpointing(model, inputs, budget=PlanRequest.of("70%", "test", **settings))
    assert str(refused.value) == EAGER_OFFLOAD_REFUSED and "apply_offloading" in EAGER_OFFLOAD_REFUSED
    assert not checkpointed_modules(model)  # nothing applied


def test_offload_false_plans_recomputation():
    model, inputs = load_example("gpt", dropout=0.0)
    plan = apply_checkpointing(model, inputs, budget="70%", offload=False, compare=False)
    assert plan.runtime == "eager" and not plan.plan.offloaded and checkpointed_modules(model)
