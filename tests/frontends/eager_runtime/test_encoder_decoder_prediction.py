"""The eager runtime's predicted peak on transformers encoder-decoders (BART, T5), one region at a
time: the coverage sweep (`benchmarks/coverage.py --runtime eager`) found BART's plan 16.8%
above its measured peak and T5's 1.6% below.

BART: the capture gave ``nll_loss_backward`` the module of the ``detach`` after the loss op (the
encoder state returned beside the loss shares its autograd sequence number), so the last encoder
layer's backward seemed to start at the loss's gradient and its checkpoint seemed to save
nothing.

T5: a checkpoint holds its call's arguments until its frame dies, and one of a later decoder
block's is a zero position bias that the captured graph does not have (the capture folds the
addition of zeros away): 32 KiB held that no graph value stood for
(`solvers.planning.eager_plan.with_argument_holds`)."""

from __future__ import annotations

import copy

import pytest
import torch

import optimizer.checkpointing as checkpointing
from frontends.capture.step import capture
from frontends.measure.step import measure_step
from optimizer.checkpointing import apply_checkpointing
from solvers.ir.graph import Phase
from solvers.planning.eager_plan import fixed_choice_solution

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _bart():
    transformers.logging.set_verbosity_error()
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).double().train()
    ids = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


def _t5():
    transformers.logging.set_verbosity_error()
    config = transformers.T5Config(vocab_size=VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8,
                                   decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).double().train()
    ids = torch.randint(3, VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    return model, {"input_ids": ids, "labels": ids}


def _one_region(monkeypatch, model, kwargs, path: str, option: str = "none"):
    """``model`` checkpointed at ``path`` alone; (predicted, measured) peak bytes."""
    monkeypatch.setattr(checkpointing, "solve_eager",
                        lambda graph, found, budget, **_: fixed_choice_solution(graph, found, [path], option))
    plan = apply_checkpointing(model, (), kwargs, budget="100%", compare=False)
    assert [(r.path, r.option) for r in plan.regions] == [(path, option)]
    return plan, measure_step(model, (), kwargs, warmup=0, repeats=1).peak_bytes


def test_the_losss_gradient_is_labelled_with_the_loss_not_an_output_returned_beside_it():
    model, kwargs = _bart()
    graph = capture(model, (), kwargs).graph
    loss_grads = [n for n in graph.ops if n.phase is Phase.BACKWARD and n.op.startswith("aten.nll_loss_backward")]
    assert loss_grads and all(n.module == "" for n in loss_grads)


def test_checkpointing_barts_last_encoder_layer_saves_what_it_is_predicted_to(monkeypatch):
    model, kwargs = _bart()
    plain = measure_step(copy.deepcopy(model), (), kwargs, warmup=0, repeats=1).peak_bytes
    plan, measured = _one_region(monkeypatch, model, kwargs, "model.encoder.layers.1")
    assert measured < plain - 100_000  # it saves memory (217 KB here) ...
    # ... and the plan says so: 1,032 B (0.06%) above the measured peak (it was 217 KB above)
    assert abs(measured - plan.predicted_peak_bytes) <= 0.0006 * measured


@pytest.mark.parametrize("path", ["decoder.block.1", "decoder.block.1.layer.1"])
def test_a_checkpoint_holds_an_argument_the_captured_graph_does_not_have(monkeypatch, path):
    """Measured 33,752 B (1.0%) above the prediction before; 984 B (0.03%) now, a few small
    tensors the capture and eager make differently, also without any checkpoint."""
    model, kwargs = _t5()
    plan, measured = _one_region(monkeypatch, model, kwargs, path)
    assert abs(measured - plan.predicted_peak_bytes) <= 0.0005 * measured
