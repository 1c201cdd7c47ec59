"""The what-if report with offload (issue 39 item 4): each budget planned with and without
offload (``remat-opt`` and ``remat-opt+offload``), and keep / recompute / offload per module.

The model is four 4096-wide Linear+GELU layers at 4096 rows, priced on an H200 over PCIe Gen5:
a layer's matmul hides most of the copy of its 64 MiB activation, so offload beats recomputation
at 84% of store-all's peak (the exact offload model proves its choice there), while at 90% both
plans are nearly free.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from graphs import chain, tiny_chain
from torch import nn

from optimizer.cli import EXIT_USAGE, main
from optimizer.report import Table, render_markdown, tables, to_json
from optimizer.whatif import WhatIfRequest, what_if
from solvers.base import SolverOptions
from solvers.ir.budget import format_bytes
from solvers.ir.link import Link
from solvers.ir.plan_text import format_plan
from solvers.planning.batch_search import WhatIfError
from solvers.planning.sweep import OFFLOAD_STRATEGY, REMAT_OPT, run_sweep

ROWS, WIDTH, DEPTH = 4096, 4096, 4


class WideMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        return F.mse_loss(x, target)


def _meta_model() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    with torch.device("meta"):
        model = WideMLP()
    return model, (torch.randn(ROWS, WIDTH, device="meta"), torch.randn(ROWS, WIDTH, device="meta"))


@pytest.fixture(scope="module")
def report():
    model, inputs = _meta_model()
    request = WhatIfRequest(model_name="wide mlp", budget="84%", sweep=("84%", "90%"), strategies=(REMAT_OPT,),
                            solver="hierarchical", options=SolverOptions(time_limit_s=10),
                            cost_model="roofline:h200", device="h200", link="pcie5", plots=False)
    return what_if(model, inputs, request)


def test_every_budget_is_planned_with_and_without_offload(report):
    sweep = report.sweep
    assert sweep.strategies == (REMAT_OPT, OFFLOAD_STRATEGY) and sweep.link.startswith("pcie5")
    faster = 0
    for budget in sweep.budgets:
        plain, offloaded = sweep.best_at(REMAT_OPT, budget), sweep.best_at(OFFLOAD_STRATEGY, budget)
        assert plain is not None and offloaded is not None, f"both fit at {budget} B"
        assert offloaded.peak_bytes <= budget
        assert offloaded.extra_time_s <= plain.extra_time_s  # the planner keeps the faster of the two
        assert plain.offloaded_bytes == 0 and plain.stall_time_s == 0
        if offloaded.offloaded_bytes:
            assert offloaded.transfer_time_s > offloaded.stall_time_s >= 0
            faster += offloaded.extra_time_s < plain.extra_time_s
    assert faster >= 1, "offload beats recomputation at some budget of this sweep"
    rows = {row[0]: row for row in _table(report, "without and with offload").rows}
    assert len(rows) == len(sweep.budgets)
    matrix = _table(report, "Extra compute at each budget")
    assert [row[0] for row in matrix.rows][:2] == ["remat-opt (hierarchical)", "remat-opt (hierarchical) + offload"]


def test_per_module_offloaded_bytes_sum_to_the_plans(report):
    plain, offloaded = report.plans
    assert plain.solver == "hierarchical" and offloaded.solver == "hierarchical+offload"
    assert not plain.offloaded and all(m.offloaded_bytes == 0 for m in plain.modules)
    total = sum(nbytes for _, nbytes in offloaded.offloaded)
    assert total > 0 and sum(m.offloaded_bytes for m in offloaded.modules) == total
    assert offloaded.extra_time_s < plain.extra_time_s
    for plan in report.plans:
        assert plan.predicted_peak_bytes <= plan.budget_bytes
    per_module = [t for t in tables(report) if t.title.startswith("Per module")]
    assert [t.title.endswith("(keep, recompute, offload)") for t in per_module] == [True, True]
    by_module = {m.module: m for m in offloaded.modules}
    for row in per_module[1].rows:  # the offload plan's table names each module's offloaded bytes
        assert row[3] == format_bytes(by_module[row[0]].offloaded_bytes)
    text = format_plan(offloaded, "wide mlp")
    assert "offloaded" in text.splitlines()[-len(per_module[1].rows) - 1]  # the per-module header
    data = json.loads(json.dumps(to_json(report)))
    assert [p["solver"] for p in data["plans"]] == ["hierarchical", "hierarchical+offload"]
    assert sum(m["offloaded_bytes"] for m in data["plans"][1]["modules"]) == total
    assert {p["strategy"] for p in data["sweep"]["points"]} == {REMAT_OPT, OFFLOAD_STRATEGY}
    assert "remat-opt (hierarchical) + offload" in render_markdown(report)


def test_offload_sweep_needs_a_link():
    with pytest.raises(ValueError, match="pass link="):
        run_sweep(tiny_chain(), ["100%"], strategies=(REMAT_OPT, OFFLOAD_STRATEGY))
    model, inputs = _meta_model()
    with pytest.raises(WhatIfError, match="needs a device-host link"):
        what_if(model, inputs, WhatIfRequest(model_name="m", sweep=("90%",), strategies=(OFFLOAD_STRATEGY,)))


def test_largest_batch_with_offload_starts_at_remat_opts_and_goes_past_it():
    """With greedy, recomputation alone stops at recompute-all's largest batch; offloading the
    layers' activations fits more rows in 1 GB, and a step there costs less extra time."""
    model, inputs = _meta_model()
    request = WhatIfRequest(model_name="wide mlp", budget="1GB", max_batch=True, strategies=(REMAT_OPT,),
                            solver="greedy", cost_model="roofline:h200", device="h200", link="pcie5", plots=False)
    report = what_if(model, inputs, request)
    result = report.max_batch
    plain, offloaded = result.fits
    assert (plain.strategy, offloaded.strategy) == (REMAT_OPT, OFFLOAD_STRATEGY)
    assert offloaded.max_batch > plain.max_batch > 0
    assert offloaded.probes[0] == (plain.max_batch, True)  # searched upward from remat-opt's answer
    assert all(batch >= plain.max_batch for batch, _ in offloaded.probes)
    point = offloaded.point
    assert point.peak_bytes <= result.budget_bytes and point.offloaded_bytes > 0 and point.transfer_time_s > 0
    assert point.extra_time_s < plain.point.extra_time_s and offloaded.samples_per_s > plain.samples_per_s
    rows = _table(report, "Largest batch").rows
    assert [(row[0], row[1]) for row in rows] == [(REMAT_OPT, str(plain.max_batch)),
                                                 (OFFLOAD_STRATEGY, str(offloaded.max_batch))]
    alone = what_if(model, inputs, replace(request, strategies=(OFFLOAD_STRATEGY,))).max_batch.fits
    assert [(f.strategy, f.max_batch) for f in alone] == [(OFFLOAD_STRATEGY, offloaded.max_batch)]  # on its own


WIDE_MLP_FILE = textwrap.dedent(f'''
    import torch
    import torch.nn.functional as F
    from torch import nn


    class WideMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear({WIDTH}, {WIDTH}) for _ in range({DEPTH}))

        def forward(self, x, target):
            for layer in self.layers:
                x = F.gelu(layer(x))
            return F.mse_loss(x, target)


    def get_model():
        return WideMLP()


    def get_inputs():
        return torch.randn({ROWS}, {WIDTH}), torch.randn({ROWS}, {WIDTH})
''')


def test_cli_sweep_with_offload_writes_both_strategies(tmp_path, capsys):
    model = tmp_path / "wide_mlp.py"
    model.write_text(WIDE_MLP_FILE)
    out_json, out_md = tmp_path / "whatif.json", tmp_path / "whatif.md"
    code = main([str(model), "--meta", "--device", "h200", "--offload", "--sweep", "90%", "--budget", "90%",
                 "--strategies", "remat-opt", "--time-limit", "10", "--jobs", "1",
                 "--json", str(out_json), "--report", str(out_md)])
    assert code == 0, capsys.readouterr().err
    data = json.loads(out_json.read_text())
    assert data["sweep"]["link"].startswith("pcie5")  # --device h200: PCIe Gen5 by default
    points = {p["strategy"]: p for p in data["sweep"]["points"]}
    assert set(points) == {REMAT_OPT, OFFLOAD_STRATEGY}
    assert points[OFFLOAD_STRATEGY]["extra_time_s"] <= points[REMAT_OPT]["extra_time_s"]
    plain, offloaded = data["plans"]
    assert offloaded["solver"] == plain["solver"] + "+offload" and plain["offloaded"] == []
    assert sum(m["offloaded_bytes"] for m in offloaded["modules"]) == sum(n for _, n in offloaded["offloaded"])
    text = out_md.read_text()
    assert "without and with offload" in text and "offloaded to host" in text
    assert "+ offload" in capsys.readouterr().out


def test_cli_offload_what_if_needs_a_link_for_the_offload_strategy(tmp_path, capsys):
    model = tmp_path / "wide_mlp.py"
    model.write_text(WIDE_MLP_FILE)
    assert main([str(model), "--meta", "--sweep", "90%", "--strategies", "remat-opt+offload"]) == EXIT_USAGE
    assert "needs a device-host link" in capsys.readouterr().err


def test_cli_largest_batch_with_offload(tmp_path, capsys):
    model = tmp_path / "wide_mlp.py"
    model.write_text(WIDE_MLP_FILE)
    out_json = tmp_path / "batch.json"
    code = main([str(model), "--meta", "--device", "h200", "--offload", "--max-batch", "--budget", "1GB",
                 "--strategies", "remat-opt", "--solver", "greedy", "--jobs", "1", "--json", str(out_json)])
    assert code == 0, capsys.readouterr().err
    fits = {f["strategy"]: f for f in json.loads(out_json.read_text())["max_batch"]["strategies"]}
    assert set(fits) == {REMAT_OPT, OFFLOAD_STRATEGY}
    assert fits[OFFLOAD_STRATEGY]["max_batch"] > fits[REMAT_OPT]["max_batch"] > 0
    assert fits[OFFLOAD_STRATEGY]["offloaded_bytes"] > 0 == fits[REMAT_OPT]["offloaded_bytes"]
    assert "remat-opt+offload" in capsys.readouterr().out


def _table(report, title_part: str) -> Table:
    return next(t for t in tables(report) if title_part in t.title)


@pytest.mark.parametrize("jobs", [1, 2])
def test_offload_points_on_a_chain_never_lose_to_recomputation(jobs):
    """A chain of 1-second ops and a link that moves its 10-byte values in 10 ms: wherever the
    budget forces recomputation, offloading is faster; on forked workers (no shared seed) too."""
    graph = chain(6)
    sweep = run_sweep(graph, ["70%", "80%", "100%"], strategies=(REMAT_OPT, OFFLOAD_STRATEGY),
                      solver="greedy", link=Link("fast", 1e3, 1e3, latency_s=0.0), jobs=jobs)
    recomputing = 0
    for budget in sweep.budgets:
        plain, offloaded = sweep.best_at(REMAT_OPT, budget), sweep.best_at(OFFLOAD_STRATEGY, budget)
        assert offloaded is not None and offloaded.peak_bytes <= budget
        if plain is not None:
            assert offloaded.extra_time_s <= plain.extra_time_s
            if plain.extra_time_s > 0:
                recomputing += 1
                assert offloaded.offloaded_bytes > 0 and offloaded.extra_time_s < plain.extra_time_s
    assert recomputing >= 1
