"""One request object for every entry point: settings checked once, unknown ones refused by name."""

from __future__ import annotations

import pytest

from solvers.base import SolverOptions
from solvers.ir.allocator import AllocatorModel
from solvers.ir.budget import Budget, BudgetError
from solvers.planning.request import SETTINGS, PlanRequest, SettingsError


def test_the_request_parses_the_budget_and_carries_the_solver_options() -> None:
    request = PlanRequest.of("60%", "optimize", solver="greedy", time_limit=5, threads=2, milp_engine="cbc")
    assert request.budget == Budget.of("60%")
    assert request.solver_options == SolverOptions(time_limit_s=5.0, threads=2, milp_engine="cbc")
    assert request.replace(budget="1MB").budget.size_bytes == 10**6
    with pytest.raises(AttributeError):
        request.solver = "milp"  # frozen


def test_an_unknown_setting_is_refused_with_the_ones_the_entry_point_takes() -> None:
    with pytest.raises(SettingsError, match=r"optimize\(\) got an unknown setting 'time_limt': it takes solver, "):
        PlanRequest.of("1MB", "optimize", time_limt=5)
    with pytest.raises(SettingsError, match=r"apply_checkpointing\(\) got an unknown setting 'threads': it takes "
                                            r"solver, time_limit\b"):
        PlanRequest.of("1MB", "apply_checkpointing", ("solver", "time_limit"), threads=2)


def test_a_whole_request_passes_through_but_not_with_settings_or_settings_the_caller_ignores() -> None:
    request = PlanRequest.of("1MB", "remat-opt", solver="greedy", allocator=AllocatorModel())
    assert PlanRequest.of(request, "optimize") is request
    with pytest.raises(SettingsError, match="put them in the request"):
        PlanRequest.of(request, "optimize", solver="milp")
    with pytest.raises(SettingsError, match="'allocator'"):  # set in the request, not honoured there
        PlanRequest.of(request, "apply_checkpointing", ("solver", "time_limit"))


@pytest.mark.parametrize(("settings", "message"), [
    ({"solver": "gurobi"}, "unknown solver 'gurobi'"),
    ({"time_limit": 0}, "time_limit must be a positive number"),
    ({"time_limit": "60"}, "time_limit must be a positive number"),
    ({"threads": 0}, "threads must be a positive integer"),
    ({"milp_engine": "gurobi"}, "unknown milp_engine"),
    ({"allocator": "cuda"}, "allocator must be an AllocatorModel"),
])
def test_bad_settings_fail_when_the_request_is_made(settings, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        PlanRequest.of("1MB", "optimize", **settings)


def test_a_bad_budget_fails_when_the_request_is_made() -> None:
    with pytest.raises(BudgetError):
        PlanRequest.of("16 parsecs", "optimize")
    with pytest.raises(SettingsError, match="PlanRequest.of"):
        PlanRequest(budget="1MB")


def test_settings_list_every_field_but_the_budget() -> None:
    assert SETTINGS[:3] == ("solver", "time_limit", "threads")
    assert "budget" not in SETTINGS and "split_mlp" in SETTINGS
