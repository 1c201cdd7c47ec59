"""The command line: runs on every example, JSON parses, every bad input is one line + exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from e2e_helpers import ROOT, example_path

from optimizer.cli import EXIT_INFEASIBLE, EXIT_MODEL_FILE, EXIT_OUTPUT, EXIT_SOLVER, EXIT_TRACE, EXIT_USAGE, main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "optimizer.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("remat-opt: error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.mark.parametrize("name", ["mlp", "gpt", "convnet"])
def test_cli_plans_each_example_and_writes_json(name, tmp_path):
    out = tmp_path / "plan.json"
    graphs = tmp_path / "graphs"
    result = run_cli(example_path(name), "--budget", "90%", "--time-limit", "10",
                     "--json", str(out), "--save-graphs", str(graphs))
    assert result.returncode == 0, result.stderr
    assert "planned peak" in result.stdout and "store-all peak" in result.stdout
    plan = json.loads(out.read_text())
    for field in ("status", "solver", "cost_model", "budget_bytes", "predicted_peak_bytes",
                  "store_all_peak_bytes", "extra_flops", "extra_time_s", "objective", "bound",
                  "gap", "solve_time_s", "breakdown"):
        assert field in plan, field
    assert plan["predicted_peak_bytes"] <= plan["budget_bytes"]
    assert plan["budget_bytes"] == int(0.9 * plan["store_all_peak_bytes"])
    assert "def forward" in (graphs / "forward.py").read_text()
    assert "def forward" in (graphs / "backward.py").read_text()


@pytest.mark.parametrize("budget", ["abc", "0", "-5GB", "12XB", "%"])
def test_bad_budget_strings_are_one_line_errors(budget, capsys):
    code = main([example_path("mlp"), f"--budget={budget}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_USAGE
    assert len(err) == 1 and err[0].startswith("remat-opt: error: invalid budget")


def test_missing_model_file(capsys):
    assert main(["/no/such/model.py", "--budget", "1GB"]) == EXIT_MODEL_FILE
    assert "not found" in capsys.readouterr().err


def test_model_file_without_entry_points(tmp_path, capsys):
    path = tmp_path / "empty.py"
    path.write_text("x = 1\n")
    assert main([str(path), "--budget", "1GB"]) == EXIT_MODEL_FILE
    assert "get_model() and get_inputs()" in capsys.readouterr().err


def test_model_file_that_raises(tmp_path, capsys):
    path = tmp_path / "boom.py"
    path.write_text("raise RuntimeError('boom')\n")
    assert main([str(path), "--budget", "1GB"]) == EXIT_MODEL_FILE
    err = capsys.readouterr().err
    assert "boom" in err and "line 1" in err


MODEL_TEMPLATE = textwrap.dedent('''
    import torch
    from torch import nn

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            h = self.l(x)
            {line_12}
            return h.sum()

    def get_model():
        return M()

    def get_inputs():
        return (torch.randn(3, 4),)
''')
UNTRACEABLE = MODEL_TEMPLATE.format(line_12="h = h * 2 if h.sum() > 0 else h")
DATA_DEPENDENT = MODEL_TEMPLATE.format(line_12="h = h[h > 0]")


def test_untraceable_model_names_the_source_line(tmp_path):
    path = tmp_path / "branchy.py"
    path.write_text(UNTRACEABLE)
    result = run_cli(str(path), "--budget", "1MB")
    assert result.returncode == EXIT_TRACE
    line = one_line_error(result)
    assert f'{path}", line 12' in line  # the `if h.sum() > 0` line


def test_unmeetable_budget_names_a_feasible_one():
    result = run_cli(example_path("convnet"), "--budget", "1KB", "--time-limit", "5")
    assert result.returncode == EXIT_INFEASIBLE
    line = one_line_error(result)
    assert "too small: try --budget" in line


def test_refuses_to_overwrite_a_file_it_did_not_write(tmp_path, capsys):
    precious = tmp_path / "notes.json"
    precious.write_text("my notes")
    assert main([example_path("mlp"), "--budget", "1GB", "--json", str(precious)]) == EXIT_OUTPUT
    assert precious.read_text() == "my notes"
    assert "not written by remat-opt" in capsys.readouterr().err


def test_verify_passes_on_the_gpt_example():
    result = run_cli("verify", example_path("gpt"), "--budget", "70%", "--time-limit", "10")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout


def test_device_what_if_with_measurement():
    result = run_cli(example_path("gpt"), "--device", "h100", "--budget", "80%", "--measure",
                     "--time-limit", "10")
    assert result.returncode == 0, result.stderr
    assert "cost model roofline:h100" in result.stdout
    assert "allocator          blocks of 512 B" in result.stdout
    measured = [line for line in result.stdout.splitlines() if "measured" in line]
    assert measured and "vs planned" in measured[0]


def test_unknown_device_is_a_usage_error(capsys):
    assert main([example_path("mlp"), "--device", "tpu9"]) == EXIT_USAGE
    assert "known devices are" in capsys.readouterr().err


def test_missing_solver_back_end_gives_an_install_hint(monkeypatch, capsys):
    import solvers.checkmate.milp_engines as engines
    from solvers.backends import Backend

    monkeypatch.setattr(engines, "highspy_backend", lambda: Backend(None, None))  # as if not installed
    code = main([example_path("mlp"), "--budget", "85%", "--solver", "milp", "--milp-engine", "highs"])
    assert code == EXIT_SOLVER
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install highspy" in err[0]


def test_op_with_data_dependent_output_is_a_trace_error(tmp_path):
    path = tmp_path / "masked.py"
    path.write_text(DATA_DEPENDENT)
    result = run_cli(str(path), "--budget", "1MB")
    assert result.returncode == EXIT_TRACE
    line = one_line_error(result)
    assert f'{path}", line 12' in line


def test_internal_errors_are_one_line_with_a_way_to_the_traceback(monkeypatch, capsys):
    import optimizer.api

    def broken(*args, **kwargs):
        raise RuntimeError("something deep inside\nwith a second line")

    monkeypatch.setattr(optimizer.api, "optimize", broken)
    assert main([example_path("mlp"), "--budget", "1GB"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "internal error (RuntimeError: something deep inside)" in err[0]
    assert "REMAT_OPT_DEBUG=1" in err[0]
    monkeypatch.setenv("REMAT_OPT_DEBUG", "1")
    with pytest.raises(RuntimeError, match="something deep inside"):
        main([example_path("mlp"), "--budget", "1GB"])


def test_meta_plans_from_shapes_alone_with_the_same_bytes_as_a_real_capture(tmp_path, capsys):
    real, meta = tmp_path / "real.json", tmp_path / "meta.json"
    assert main([example_path("gpt2"), "--budget", "85%", "--solver", "greedy", "--json", str(real)]) == 0
    assert main([example_path("gpt2"), "--budget", "85%", "--solver", "greedy", "--meta",
                 "--json", str(meta)]) == 0
    assert "nothing was allocated or run" in capsys.readouterr().out
    planned_real, planned_meta = json.loads(real.read_text()), json.loads(meta.read_text())
    for field in ("store_all_peak_bytes", "predicted_peak_bytes", "graph_values", "extra_flops"):
        assert planned_meta[field] == planned_real[field], field
    assert main([example_path("gpt2"), "--budget", "85%", "--meta", "--measure"]) == EXIT_USAGE
    assert "--measure needs a model that runs" in capsys.readouterr().err


def test_split_flag_bad_value_and_a_model_without_a_head_are_usage_errors(capsys):
    """``--split x`` and a split asked of a model with no LM head + loss chain (the MLP example)
    are one-line usage errors, before or instead of a plan."""
    assert main([example_path("mlp"), "--budget", "90%", "--split", "x"]) == EXIT_USAGE
    assert "--split takes a positive number" in capsys.readouterr().err
    assert main([example_path("mlp"), "--budget", "90%", "--split", "2"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "--split:" in err and "Traceback" not in err


def test_split_mlp_flag_plans_chunked_mlps_and_bad_uses_are_usage_errors(capsys, tmp_path):
    """``--split-mlp 2`` reaches ``optimize(split_mlp=2)`` (the plan names the MLPs it split); a
    bad value (checked before the model file is read), a model with no MLP chain, and a mode that
    would plan the step unsplit are one-line usage errors."""
    out = tmp_path / "plan.json"
    assert main([example_path("mlp"), "--budget", "90%", "--split-mlp", "2", "--time-limit", "5",
                 "--json", str(out)]) == 0
    assert "split 3 MLPs" in capsys.readouterr().out
    assert "into 2 row chunks" in json.loads(out.read_text())["message"]
    for value in ("x", "0", "-2", "1.5"):
        assert main(["/no/such/model.py", "--budget", "90%", "--split-mlp", value]) == EXIT_USAGE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--split-mlp takes a positive number of row chunks or 'auto'" in err[0]
    assert main([example_path("convnet"), "--budget", "90%", "--split-mlp", "2"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remat-opt: error: --split-mlp: split_mlp=2: no linear")
    assert main([example_path("mlp"), "--budget", "90%", "--split-mlp", "2", "--world-size", "2", "--strategy",
                 "ddp"]) == EXIT_USAGE  # --meta splits too (tests/optimizer/test_cli_offload.py)
    assert "planned by the graph runtime only" in capsys.readouterr().err
    for flags in (["--split", "2"], ["--split-mlp", "auto"]):  # the eager runtime splits MLP modules only
        assert main([example_path("mlp"), "--budget", "90%", "--runtime", "eager", *flags]) == EXIT_USAGE
        assert "planned by the graph runtime only" in capsys.readouterr().err
    # the MLP example's chains have no module of their own (F.gelu in the parent): eager refuses
    assert main([example_path("mlp"), "--budget", "90%", "--runtime", "eager", "--split-mlp", "2"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("remat-opt: error: --split-mlp: ") and "eager runtime" in err[0]
