"""Per-rank training memory from a model's config alone (issue 41 item 3): ``--meta`` /
``--hf-config`` with ``--world-size N --strategy ddp|fsdp``, and the largest micro-batch per rank."""

from __future__ import annotations

import json
import math

import pytest

from frontends.capture.config_model import hf_config_model
from optimizer.cli import main as cli_main
from optimizer.meta_plan import _search_offloads_above

TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
              "max_position_embeddings": 128, "torch_dtype": "bfloat16"}
WORLD = 8

MODEL_FILE = '''
import torch
import transformers

from frontends.capture.config_model import CausalLMStep

CONFIG = {config}


def get_model():
    config = transformers.AutoConfig.for_model("llama", **CONFIG)
    config.use_cache = False
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    return CausalLMStep(model.train())


def get_inputs():
    return (torch.zeros(2, 32, dtype=torch.long),)
'''


@pytest.fixture(autouse=True)
def _transformers():
    pytest.importorskip("transformers").logging.set_verbosity_error()


@pytest.fixture
def config_path(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY_LLAMA))
    return str(path)


def _rank_json(capsys, tmp_path, name: str, *argv: str) -> tuple[dict, str]:
    out = tmp_path / f"{name}.json"
    assert cli_main([*argv, "--json", str(out)]) == 0, capsys.readouterr().err
    return json.loads(out.read_text()), capsys.readouterr().out


def test_fsdp_rank_from_a_config_shards_parameters_and_optimizer_state(config_path, tmp_path, capsys):
    common = ["--hf-config", config_path, "--batch", "2", "--seq", "32", "--meta", "--device", "h100",
              "--optimizer", "adamw", "--budget", "40GB", "--time-limit", "5", "--world-size", str(WORLD)]
    fsdp, report = _rank_json(capsys, tmp_path, "fsdp", *common, "--strategy", "fsdp")
    ddp, _ = _rank_json(capsys, tmp_path, "ddp", *common, "--strategy", "ddp")
    f, d = fsdp["rank"], ddp["rank"]
    assert f["strategy"] == "fsdp" and d["strategy"] == "ddp" and f["world_size"] == WORLD
    model, _ = hf_config_model(config_path, batch=2, seq=32)
    params = list(model.parameters())
    # AdamW on CUDA (foreach): two moments per parameter, step counters on the host. DDP steps the
    # full replica; FSDP2 steps rank 0's shards, ceil(dim0 / N) rows of each parameter.
    full = sum(2 * p.numel() * p.element_size() for p in params)
    shards = sum(2 * math.ceil(p.shape[0] / WORLD) * (p.numel() // p.shape[0]) * p.element_size() for p in params)
    assert d["optimizer_bytes"] == full
    assert f["optimizer_bytes"] == shards
    assert full <= WORLD * f["optimizer_bytes"] < full + full // 20  # 1/N of DDP's, padded
    # Parameters and gradients: the trained bytes sharded, buffers whole; DDP keeps full replicas.
    trained, buffers = d["gradients_bytes"], d["parameters_bytes"] - d["gradients_bytes"]
    assert f["gradients_bytes"] == math.ceil(trained / WORLD)
    assert f["parameters_bytes"] == math.ceil(trained / WORLD) + buffers
    assert f["communication_bytes"] > 0 and d["communication_bytes"] == trained  # the all-gather; the buckets
    assert f["predicted_rank_peak_bytes"] <= f["budget_bytes"] == 40 * 10**9
    assert f["predicted_rank_peak_bytes"] < d["predicted_rank_peak_bytes"]
    assert "per rank           fsdp on 8 ranks" in report and "over the shards" in report
    assert "planned from shapes alone" in report


def test_a_meta_rank_has_the_terms_of_the_model_file_captured_for_real(config_path, tmp_path, capsys):
    model_file = tmp_path / "tiny_llama.py"
    model_file.write_text(MODEL_FILE.format(config={k: v for k, v in TINY_LLAMA.items()
                                                   if k not in ("model_type", "torch_dtype")}))
    common = ["--optimizer", "adamw", "--grad-accumulation", "2", "--budget", "900KB", "--time-limit", "5",
              "--world-size", str(WORLD), "--strategy", "fsdp"]
    meta, _ = _rank_json(capsys, tmp_path, "meta", "--hf-config", config_path, "--batch", "2", "--seq", "32",
                         *common)
    real, _ = _rank_json(capsys, tmp_path, "real", str(model_file), *common)
    # parameters, gradients, communication, optimizer, accumulation, the rank's and the step's peaks
    assert meta["rank"] == real["rank"]
    assert meta["rank"]["accumulated_gradients_bytes"] > 0
    assert meta["store_all_peak_bytes"] == real["store_all_peak_bytes"]
    assert meta["rank"]["predicted_rank_peak_bytes"] <= 900_000
    assert meta["extra_time_s"] > 0  # the budget is below plain autograd's rank peak: it recomputes


def test_max_batch_per_rank_is_the_largest_micro_batch_that_fits(config_path, tmp_path, capsys):
    budget = 850_000
    answer, report = _rank_json(
        capsys, tmp_path, "batch", "--hf-config", config_path, "--batch", "1", "--seq", "32", "--device", "h100",
        "--optimizer", "adamw", "--world-size", str(WORLD), "--strategy", "fsdp", "--budget", str(budget),
        "--max-batch", "--time-limit", "1")
    found = answer["max_batch"]
    batch = found["max_batch"]
    assert batch >= 1 and not found["capped"]
    probes = {b: fits for b, fits in found["probes"]}
    assert probes[batch] and probes[batch + 1] is False  # the next micro-batch was tried and does not fit
    assert answer["rank"]["predicted_rank_peak_bytes"] <= budget == answer["rank"]["budget_bytes"]
    assert answer["rank"]["strategy"] == "fsdp"
    assert f"largest batch      {batch} per rank" in report and f"global batch {batch * WORLD}" in report
    assert "extra time" in report


@pytest.mark.parametrize("argv, message", [
    (["--meta", "--world-size", "8", "--budget", "1GB"], "go together"),
    (["--max-batch", "--world-size", "8", "--strategy", "ddp", "--budget", "50%"], "budget in bytes"),
    (["--sweep", "50%,80%", "--world-size", "8", "--strategy", "ddp", "--budget", "1GB"], "not per rank"),
])
def test_per_rank_what_ifs_refuse_what_they_cannot_answer(config_path, capsys, argv, message):
    assert cli_main(["--hf-config", config_path, "--seq", "16", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("recompute_only, offloaded", [(5, 5), (5, 9), (0, 3), (0, 0)])
def test_the_offload_search_probes_only_above_the_recompute_only_answer(recompute_only, offloaded):
    """`_search_offloads_above` with a monotone stand-in for the rank plans: it finds the offload
    answer, never probes at or below the recompute-only one, and replans the answer with offloads."""
    calls: list[tuple[int, bool]] = []

    def fits_graph(batch: int, graph: str, offloads: bool = False) -> bool:
        assert graph == f"graph {batch}" and offloads
        calls.append((batch, batch <= offloaded))
        return batch <= offloaded

    found, capped, probes = _search_offloads_above(fits_graph, lambda b: f"graph {b}", recompute_only, False,
                                                   (("earlier", True),), limit=64)
    assert (found, capped) == (offloaded, False)
    assert probes[0] == ("earlier", True) and all(b > recompute_only for b, _ in probes[1:])
    probed = calls[:-1] if found == recompute_only else calls  # the last call replans that answer
    assert all(b > recompute_only for b, _ in probed)
    if found:  # the plan kept at the answer was made with offloads, once
        assert [ok for b, ok in calls if b == found] == [True]
    replanned: list[int] = []
    at_limit = _search_offloads_above(lambda b, _graph, offloads=False: replanned.append(b) is None,
                                      lambda b: f"graph {b}", 64, True, (), limit=64)
    assert at_limit == (64, True, ()) and replanned == [64]  # the limit fits: no probe, the plan redone there
