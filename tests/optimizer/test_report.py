"""What-if reports: timeline, plots, JSON, HTML (rendered in headless Chromium), Markdown, CLI."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import textwrap

import pytest
from e2e_helpers import small_mlp
from graphs import chain
from PIL import Image

from optimizer.cli import EXIT_USAGE, main
from optimizer.plots import REMAT_OPT_COLOR, STORE_ALL_COLOR
from optimizer.report import JSON_SCHEMA, render_html, render_markdown, render_terminal, to_json
from optimizer.whatif import WhatIfRequest, what_if
from solvers.base import SolverOptions
from solvers.baselines import store_all_schedule
from solvers.ir.schedule import StepKind
from solvers.ir.simulator import simulate
from solvers.ir.timeline import memory_timeline
from solvers.planning.sweep import REMAT_OPT, run_sweep

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
STRATEGIES = (REMAT_OPT, "store-all", "recompute-all", "chen", "chen-greedy", "torch-min-cut")
TINY_MODEL_FILE = textwrap.dedent('''
    import torch
    from torch import nn


    class Regression(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))

        def forward(self, x, y):
            return nn.functional.mse_loss(self.net(x), y)


    def get_model():
        torch.manual_seed(0)
        return Regression()


    def get_inputs():
        torch.manual_seed(1)
        return torch.randn(32, 16), torch.randn(32, 1)
''')


@pytest.fixture(scope="module")
def report():
    """A report on a narrow MLP; remat-opt runs its greedy solver here (the report is under test,
    not the solver: tests/solvers/planning/test_sweep.py holds the default solver to its claims)."""
    model, inputs = small_mlp()
    request = WhatIfRequest(model_name="small mlp", budget="85%", sweep=("70%", "80%", "90%", "100%"),
                            max_batch=True, strategies=STRATEGIES, solver="greedy",
                            options=SolverOptions(time_limit_s=5), batch_limit=128,
                            torch_fractions=(0.0, 0.5, 1.0))
    return what_if(model, inputs, request)


def rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


def pixels_near(image: Image.Image, color: str, tolerance: int = 40) -> int:
    target = rgb(color)
    return sum(count for count, px in image.convert("RGB").getcolors(1 << 24)
               if sum(abs(a - b) for a, b in zip(px, target)) <= tolerance)


def test_timeline_matches_the_simulator():
    graph = chain(8)
    plan = run_sweep(graph, ["70%"], strategies=(REMAT_OPT,)).points[0]
    for schedule in (store_all_schedule(graph), plan.schedule):
        sim, line = simulate(graph, schedule), memory_timeline(graph, schedule, "x")
        assert line.peak_bytes == sim.peak_bytes == max(line.live_bytes)
        assert len(line.live_bytes) == len(sim.live_curve) and line.forward_steps == len(schedule.forward)
        for step, during, after in zip(schedule.steps, line.live_bytes, sim.live_curve):
            assert during == after if step.kind is StepKind.FREE else during >= after
        sizes = [t.bytes for t in line.largest_at_peak]
        assert sizes == sorted(sizes, reverse=True) and sizes[0] > 0
        assert all(t.kind != "parameter" and t.kind != "input" for t in line.largest_at_peak)


def test_report_parts_are_computed(report):
    assert {p.strategy for p in report.sweep.points} == set(STRATEGIES)
    assert [t.label.split(" ")[0] for t in report.timelines] == ["store-all", "remat-opt"]
    assert report.timelines[1].peak_bytes <= report.settings.budget_bytes < report.timelines[0].peak_bytes
    assert report.timelines[1].budget_bytes == report.settings.budget_bytes
    fits = {f.strategy: f for f in report.max_batch.fits}
    assert fits["recompute-all"].max_batch >= fits["store-all"].max_batch >= 1
    assert fits[REMAT_OPT].max_batch >= fits["store-all"].max_batch
    assert set(report.plots) == {"pareto", "timeline", "max_batch"}


def test_png_plots_open_and_are_not_blank(report):
    for name, png in report.plots.items():
        image = Image.open(io.BytesIO(png))
        image.load()
        assert image.format == "PNG" and image.width > 300 and image.height > 200, name
        colors = image.convert("RGB").getcolors(1 << 24)
        assert len(colors) > 50, name  # not a blank canvas
    assert pixels_near(Image.open(io.BytesIO(report.plots["pareto"])), REMAT_OPT_COLOR) > 200
    assert pixels_near(Image.open(io.BytesIO(report.plots["timeline"])), STORE_ALL_COLOR) > 200


def test_json_follows_the_schema(report):
    data = json.loads(json.dumps(to_json(report)))
    assert data["generated_by"] == "remat-opt" and data["schema"] == JSON_SCHEMA
    assert set(data) >= {"settings", "graph", "sweep", "max_batch", "timelines", "plan"}
    points = data["sweep"]["points"]
    assert len(points) == len(report.sweep.points)
    assert {"strategy", "status", "budget_bytes", "setting", "peak_bytes", "extra_time_s", "extra_percent",
            "pareto", "message"} <= set(points[0])
    assert any(p["pareto"] for p in points)
    assert all(p["peak_bytes"] <= p["budget_bytes"] for p in points if p["status"] == "ok" and p["budget_bytes"])
    assert len(data["sweep"]["cheapest_at_budget"]) == len(data["sweep"]["budgets_bytes"]) == 4
    assert {s["strategy"] for s in data["max_batch"]["strategies"]} == set(STRATEGIES)
    assert data["timelines"][0]["peak_bytes"] == max(data["timelines"][0]["live_bytes"])


def test_html_and_markdown_are_self_contained(report):
    page = render_html(report)
    assert "generated by remat-opt" in page and "<table>" in page
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # nothing fetched from anywhere
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 3 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    markdown = render_markdown(report)
    assert markdown.count("](data:image/png;base64,") == 3 and "| strategy |" in markdown and "| cheapest |" in markdown
    text = render_terminal(report)
    assert "Extra compute at each budget" in text and "Largest batch within" in text


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it "
                                              "with apt-get; without apt it cannot render HTML here)")
def test_html_report_renders_in_headless_chromium_with_the_plot(report, tmp_path):
    def screenshot(page: str, name: str) -> Image.Image:
        html_path, png_path = tmp_path / f"{name}.html", tmp_path / f"{name}.png"
        html_path.write_text(page)
        subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={tmp_path / ('profile-' + name)}",
                        f"--screenshot={png_path}", "--window-size=1200,2000", f"file://{html_path}"],
                       capture_output=True, timeout=120, check=False)
        assert png_path.exists(), f"chromium wrote no screenshot for {name}"
        return Image.open(png_path)

    page = render_html(report)
    shot = screenshot(page, "report")
    assert shot.size == (1200, 2000)
    assert len(shot.convert("RGB").getcolors(1 << 24)) > 100  # text, tables and plots: not blank
    red = pixels_near(shot, REMAT_OPT_COLOR)
    assert red > 300  # remat-opt's curve (and the timeline's plan) drawn on screen
    without_plots = re.sub(r"<img [^>]*>", "", page)
    assert pixels_near(screenshot(without_plots, "control"), REMAT_OPT_COLOR) < red / 20


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny_model.py"
    path.write_text(TINY_MODEL_FILE)
    return str(path)


def test_cli_whatif_writes_json_report_and_plots(model_file, tmp_path, capsys):
    out_json, out_html, plots = tmp_path / "w.json", tmp_path / "w.html", tmp_path / "plots"
    code = main([model_file, "--sweep", "70%:100%:15", "--budget", "85%", "--strategies",
                 "remat-opt,store-all,chen", "--time-limit", "5", "--json", str(out_json),
                 "--report", str(out_html), "--plots", str(plots)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Extra compute at each budget" in captured.out
    data = json.loads(out_json.read_text())
    assert data["schema"] == JSON_SCHEMA and data["model"] == model_file
    assert data["settings"]["budget_bytes"] == int(0.85 * data["graph"]["store_all_peak_bytes"])
    assert "<img" in out_html.read_text()
    assert sorted(os.listdir(plots)) == ["pareto.png", "timeline.png"]
    # a second run may overwrite what remat-opt wrote, PNGs included
    assert main([model_file, "--sweep", "100%", "--strategies", "store-all", "--json", str(out_json),
                 "--plots", str(plots), "--report", str(tmp_path / "w.md")]) == 0
    assert (tmp_path / "w.md").read_text().startswith("<!-- generated by remat-opt -->")


def test_cli_dtype_and_device_change_the_report_without_hardware(model_file, tmp_path):
    peaks = {}
    for name, extra in (("fp32", []), ("bf16", ["--dtype", "bf16", "--device", "h100"])):
        out = tmp_path / f"{name}.json"
        assert main([model_file, "--sweep", "100%", "--strategies", "store-all", "--json", str(out), *extra]) == 0
        peaks[name] = json.loads(out.read_text())
    fp32, bf16 = peaks["fp32"], peaks["bf16"]
    assert bf16["graph"]["parameters_bytes"] * 2 == fp32["graph"]["parameters_bytes"]
    assert bf16["settings"]["cost_model"] == "roofline:h100" and bf16["settings"]["dtype"] == "bf16"
    assert bf16["settings"]["allocator"] != "none" and fp32["settings"]["cost_model"] == "flops"
    assert bf16["graph"]["step_time_s"] < fp32["graph"]["step_time_s"]


@pytest.mark.parametrize("args, message", [
    (["--sweep", "abc"], "invalid sweep"),
    (["--sweep", "50%", "--report", "out.txt"], ".html or .md"),
    (["--max-batch"], "needs --budget"),
    (["--sweep", "50%", "--measure"], "--measure and --save-graphs"),
    (["--sweep", "50%", "--cost-model", "profile"], "meta device"),
    (["--sweep", "50%", "--strategies", "store-all,magic"], "unknown strategies magic"),
    (["--sweep", "50%", "--torch-budgets", "0,2"], "within [0, 1]"),
])
def test_cli_whatif_bad_input_is_one_line(model_file, capsys, args, message):
    assert main([model_file, *args]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remat-opt: error: ") and message in err[0]


def test_cli_refuses_to_overwrite_a_png_it_did_not_write(model_file, tmp_path, capsys):
    (tmp_path / "pareto.png").write_bytes(b"\x89PNG\r\n\x1a\n someone else's picture")
    assert main([model_file, "--sweep", "100%", "--plots", str(tmp_path)]) == 7
    assert "was not written by remat-opt" in capsys.readouterr().err


def test_cli_dtype_also_casts_a_single_plan(model_file, tmp_path):
    plans = {}
    for dtype in ("fp32", "fp64"):
        out = tmp_path / f"{dtype}.json"
        assert main([model_file, "--budget", "100%", "--dtype", dtype, "--json", str(out)]) == 0
        plans[dtype] = json.loads(out.read_text())
    assert plans["fp64"]["breakdown"]["parameters_bytes"] == 2 * plans["fp32"]["breakdown"]["parameters_bytes"]
