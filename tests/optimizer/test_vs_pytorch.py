"""The vs-PyTorch benchmark's machinery (benchmarks/vs_pytorch*.py) with both remat-opt objectives.

A tiny model where the two objectives must disagree: each block is ``Linear(8 -> 256)``, GELU,
``Linear(256 -> 8)`` on a batch of 256. To drop one of a block's two 256-wide activations,
remat-opt either recomputes the GELU from the kept matmul output (no FLOPs that
``FlopCounterMode`` counts, but 1 MiB of memory traffic) or the narrow matmul from the block's
8-wide input (1 MFLOP, about half the traffic). The time objective (``flops`` cost model) takes
the matmul, the FLOP objective (``flop-count``) the GELU; both run for real and are measured as
the benchmark measures them.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(ROOT, "benchmarks"))

from vs_pytorch import ModelBench, Row, load_saved, parse_args  # noqa: E402
from vs_pytorch_report import FLOP_OBJECTIVE, NO_FLOP_ROWS, TIME_OBJECTIVE, check_targets, write_report  # noqa: E402

BUDGETS = (80, 65)
"""% of plain autograd's simulated peak; at both the objectives choose different recomputations."""


class WideBlocks(nn.Module):
    """Three blocks of narrow -> wide matmul, GELU, wide -> narrow matmul; MSE loss."""

    def __init__(self) -> None:
        super().__init__()
        self.ups = nn.ModuleList(nn.Linear(8, 256) for _ in range(3))
        self.downs = nn.ModuleList(nn.Linear(256, 8) for _ in range(3))

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for up, down in zip(self.ups, self.downs):
            x = down(F.gelu(up(x)))
        return F.mse_loss(x, target)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    """plain autograd, then remat-opt at each budget under each objective, measured."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WideBlocks().double()
        inputs = (torch.randn(256, 8, dtype=torch.float64), torch.randn(256, 8, dtype=torch.float64))
    args = parse_args(["--quick"])
    args.percentages, args.time_limit = BUDGETS, 20.0  # the exact solver stops at its optimum
    bench = ModelBench("wide", args, model, inputs)
    bench.run_plain()
    bench.remat_opt({budget: label for budget, label in bench.budgets().items() if label.endswith("% of plain")})
    return bench.rows


def _by_setting(rows: list[Row], strategy: str) -> dict[str, Row]:
    return {r.setting: r for r in rows if r.strategy == strategy}


def test_each_objective_wins_at_its_own_measure(rows):
    plain = rows[0].metrics
    time_rows, flop_rows = _by_setting(rows, TIME_OBJECTIVE), _by_setting(rows, FLOP_OBJECTIVE)
    settings = [f"{p}% of plain" for p in BUDGETS]
    assert set(settings) <= time_rows.keys() and set(settings) <= flop_rows.keys()
    for setting in settings:
        fast, frugal = time_rows[setting].metrics, flop_rows[setting].metrics
        assert fast is not None and frugal is not None, (time_rows[setting].error, flop_rows[setting].error)
        assert frugal.flops <= fast.flops, setting      # FlopCounterMode's count: the FLOP objective's
        assert fast.modelled_s <= frugal.modelled_s, setting  # modelled time: the time objective's
    # they really differ: at 80% the FLOP objective recomputes only GELUs, the time objective a matmul
    assert flop_rows["80% of plain"].metrics.flops == plain.flops
    assert time_rows["80% of plain"].metrics.flops > plain.flops


def test_both_objectives_fit_their_budgets_and_match_plain_gradients(rows):
    ours = [r for r in rows if r.strategy in (TIME_OBJECTIVE, FLOP_OBJECTIVE)]
    assert len(ours) == 2 * len(BUDGETS)
    for row in ours:
        assert row.metrics is not None, row.error
        assert row.metrics.peak_bytes <= row.budget_bytes, row  # the seed gradient held back: measured fits
        assert row.predicted_peak_bytes <= row.budget_bytes - row.seed_bytes and row.seed_bytes == 8
        assert row.metrics.peak_bytes < rows[0].metrics.peak_bytes
        assert row.metrics.grad_error < 1e-10, row
        assert row.planned_extra_flops == row.metrics.flops - rows[0].metrics.flops  # predicted = measured


def test_report_checks_flops_on_the_flop_objective_and_time_on_the_time_objective(rows, tmp_path):
    frugal = _by_setting(rows, FLOP_OBJECTIVE)["80% of plain"]
    fast = _by_setting(rows, TIME_OBJECTIVE)["80% of plain"]
    # a peer with the time objective's memory and FLOPs: only the FLOP objective beats it on FLOPs
    peer = Row("wide", "sac", "", fast.metrics, 0.0)
    verdicts = {v.what: v for v in check_targets([*rows, peer])}
    flops_check, time_check = verdicts["1: FLOPs vs sac"], verdicts["1t: modelled time vs sac"]
    assert flops_check.ok and "FLOP objective" in flops_check.detail and "+0.00 M" in flops_check.detail
    assert time_check.ok and "time objective" in time_check.detail
    for objective in ("time objective", "FLOP objective"):
        assert verdicts[f"2: peak monotone in budget, never above it (remat-opt, {objective})"].ok
    path = tmp_path / "report.md"
    run = {"command": "test", "device": "cpu", "dtype": "float64", "elapsed_s": 1.0, "load": (0, 0, 0), "when": "now"}
    write_report([*rows, peer], str(path), run=run, plot_name="plot.png")
    text = path.read_text()
    assert "Summary: extra FLOPs (FLOP objective)" in text and "Summary: extra modelled time (time objective)" in text
    assert f"| {FLOP_OBJECTIVE} | 80% of plain |" in text and f"| {TIME_OBJECTIVE} | 80% of plain |" in text
    assert frugal.metrics.peak_bytes <= peer.metrics.peak_bytes


def test_a_run_without_flop_objective_rows_still_renders_with_the_flop_targets_not_applicable(rows, tmp_path):
    fast = _by_setting(rows, TIME_OBJECTIVE)["80% of plain"]
    old = [r for r in rows if r.strategy != FLOP_OBJECTIVE] + [Row("wide", "per-block", "", fast.metrics, 0.0)]
    verdicts = {v.what: v for v in check_targets(old)}
    assert verdicts["1: FLOPs vs per-block"].ok is None and verdicts["1: FLOPs vs per-block"].detail == NO_FLOP_ROWS
    assert verdicts["1t: modelled time vs per-block"].ok is True
    path = tmp_path / "old.md"
    run = {"command": "old", "device": "cpu", "dtype": "float64", "elapsed_s": 1.0, "load": (0, 0, 0), "when": "then"}
    write_report(old, str(path), run=run, plot_name="plot.png")
    assert "has no remat-opt, FLOP objective rows" in path.read_text()


def test_unknown_objective_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--objectives", "time,speed"])
    assert "choose one or both of time, flop-count" in capsys.readouterr().err


def test_saved_rows_read_back_equal_and_a_wrong_file_is_a_one_line_exit(rows, tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"run": {"command": "x"}, "rows": [asdict(r) for r in rows]}))
    assert load_saved(str(path)) == (rows, {"command": "x"})
    path.write_text(json.dumps({"rows": [asdict(r) for r in rows]}))
    with pytest.raises(SystemExit, match="cannot read .*KeyError: 'run'.*give a file written by --json"):
        load_saved(str(path))
