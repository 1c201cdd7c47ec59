"""Models from their configuration alone (frontends.capture.config_model): built on meta, planned
with the optimizer from shapes, offline, with the configs shipped in examples/configs."""

from __future__ import annotations

import json

import pytest
import torch
from e2e_helpers import ROOT

from frontends.capture.config_model import ConfigModelError, hf_config_model
from frontends.measure.optimizer_memory import optimizer_memory
from optimizer.cli import main as cli_main
from optimizer.meta_plan import plan_without_hardware

LLAMA3_8B = f"{ROOT}/examples/configs/llama3-8b.json"
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
              "max_position_embeddings": 128, "torch_dtype": "bfloat16"}


@pytest.fixture(autouse=True)
def _transformers():
    pytest.importorskip("transformers").logging.set_verbosity_error()


def test_llama3_8b_builds_on_meta_with_the_parameters_and_adamw_state_accelerate_counts():
    """accelerate's estimate for an 8B model in bf16: parameters 14.96 GiB and, training with
    Adam, four times that (parameters, gradients, two moments) -- the same figures here."""
    model, (tokens,) = hf_config_model(LLAMA3_8B, batch=4, seq=4096)
    params = list(model.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    n = sum(p.numel() for p in params)
    assert n == 8_030_261_248  # Llama-3-8B's published parameter count
    assert tokens.shape == (4, 4096) and tokens.is_meta
    state = optimizer_memory("adamw-fused", params, device="cuda")
    # bf16 moments and, fused, a float32 step counter per parameter on the device; no temporaries
    assert state.state_bytes == 2 * 2 * n + 4 * len(params) and state.step_bytes == 0
    foreach = optimizer_memory("adamw", params, device="cuda")
    assert foreach.step_bytes == 2 * n  # the foreach path's sqrt of every moment at once


def test_a_config_file_plans_the_whole_iteration_from_shapes(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(TINY_LLAMA))
    model, inputs = hf_config_model(str(tmp_path), batch=2, seq=32)
    planned = plan_without_hardware(model, inputs, "90%", optimizer="adamw", device="cuda", time_limit=5)
    b = planned.plan.breakdown
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert b.optimizer == "adamw (foreach)" and b.optimizer_bytes == 2 * params
    assert planned.plan.predicted_peak_bytes <= planned.plan.budget_bytes
    assert "state of adamw (foreach)" in planned.report


def test_the_cli_plans_a_config_on_meta(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LLAMA))
    assert cli_main(["--hf-config", str(path), "--batch", "2", "--seq", "32", "--optimizer", "adamw",
                     "--budget", "90%", "--time-limit", "5"]) == 0
    out = capsys.readouterr().out
    assert "planned from shapes alone" in out and "state of adamw" in out


@pytest.mark.parametrize("config, message", [
    ({"hidden_size": 8}, "names no model_type"),
    ({"model_type": "no-such-model"}, "no-such-model"),
])
def test_a_bad_config_is_refused_saying_what_to_give(tmp_path, config, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigModelError, match=message):
        hf_config_model(str(path), batch=1, seq=8)


def test_the_cli_wants_exactly_one_model(capsys, tmp_path):
    assert cli_main(["--budget", "1GB"]) == 2
    assert "give one model" in capsys.readouterr().err
    assert cli_main(["--hf-config", str(tmp_path / "missing.json"), "--budget", "1GB"]) == 3
    assert "not found" in capsys.readouterr().err


def test_max_batch_answers_none_when_the_optimizer_step_alone_does_not_fit(tmp_path, capsys, monkeypatch):
    """The report still prints, with one row: no batch, because of the optimizer step, and the
    lighter optimizers whose step fits (measured the same way, on FakeTensors)."""
    monkeypatch.setenv("COLUMNS", "400")  # the note in one table line, whatever the terminal
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LLAMA))
    model, inputs = hf_config_model(str(path), batch=1, seq=32)
    params = list(model.parameters())
    foreach_peak = plan_without_hardware(model, inputs, "100%", optimizer="adamw", device="cuda",
                                         time_limit=5).plan.breakdown.optimizer_step_peak_bytes
    foreach, fused = (optimizer_memory(name, params, device="cuda") for name in ("adamw", "adamw-fused"))
    lighter = foreach.state_bytes + foreach.step_bytes - fused.state_bytes - fused.step_bytes
    assert lighter > 0
    budget = foreach_peak - lighter // 2  # below foreach's step, above the fused one's
    assert cli_main(["--hf-config", str(path), "--batch", "1", "--seq", "32", "--optimizer", "adamw",
                     "--device", "h100", "--max-batch", "--strategies", "remat-opt,store-all",
                     "--budget", str(budget)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps the note
    assert "every strategy" in out and "optimizer step alone peaks at" in out
    assert "these fit: adamw-fused" in out and "time limit 15 s per budget" in out


def test_batch_sizes_are_fitted_from_two_and_five_when_the_example_batch_is_one(tmp_path):
    """At batch 1 a transposed Llama activation is contiguous, so its reshape is a view: the
    graph has one value fewer than at any larger batch, and a fit from batch 1 fails."""
    from frontends.capture.meta_capture import MetaCapturer

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LLAMA))
    model, inputs = hf_config_model(str(path), batch=1, seq=32)
    capturer = MetaCapturer(model, inputs, cost_model="roofline:h100")
    assert len(capturer.at(1).graph.ops) < len(capturer.at(2).graph.ops)
    assert capturer.fit_scaling(), capturer.scaling_note
    assert capturer.scaling.checked == (2, 5) and not capturer.scaling.covers(1)
    predicted, captured = capturer.predicted_at(9), capturer.at(9).graph
    assert [(n.name, n.bytes) for n in predicted.ops] == [(n.name, n.bytes) for n in captured.ops]


def test_max_batch_with_torchs_partitioner_from_an_example_batch_of_one(tmp_path, capsys):
    """torch's partitions at batch 1 name values a batch of 2 or more names differently (one
    copy fewer): the stand-in that judges them on other batches takes that batch's own."""
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LLAMA))
    assert cli_main(["--hf-config", str(path), "--batch", "1", "--seq", "32", "--optimizer", "adamw-fused",
                     "--device", "h100", "--max-batch", "--strategies", "remat-opt,torch-min-cut",
                     "--budget", "8MiB", "--batch-limit", "64", "--time-limit", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "torch-min-cut" in out and "internal error" not in out
