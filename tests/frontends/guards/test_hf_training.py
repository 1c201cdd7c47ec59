"""Hugging Face training setups as users run them: the input-require-grads hook that PEFT and
gradient checkpointing register, PEFT LoRA adapters (frozen base), gradient checkpointing already
on, bf16 weights, and both attention implementations. Each plans below store-all and trains with
eager's gradients (same seed, dropout on). Tiny configs; no downloads.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from e2e_helpers import hf_step, max_relative_error, tiny_gpt2

from frontends.capture.step import UnreplayableForwardError
from optimizer import apply_checkpointing, optimize, remove_checkpointing

VOCAB = 128
TIME_LIMIT = 5.0


@pytest.fixture(scope="module")
def transformers():
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module


def _tokens() -> torch.Tensor:
    return torch.randint(1, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))


def _llama(transformers, dtype=torch.float64, **config):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=64, attention_dropout=0.1, **config)
    return transformers.LlamaForCausalLM(config).to(dtype).train()


def _grads(module, params: torch.nn.Module, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    return hf_step(module, params, tokens, labels=tokens)[2]


def _trains_like_eager(model, tolerance: float = 1e-10) -> None:
    """Graph runtime at 60%: recomputes something, fits, and gives eager's gradients."""
    tokens = _tokens()
    expected = _grads(model, model, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rm = optimize(model, (tokens,), example_kwargs={"labels": tokens}, budget="60%", time_limit=TIME_LIMIT)
    assert rm.plan.recomputed and rm.plan.predicted_peak_bytes <= rm.plan.budget_bytes
    got = _grads(rm, model, tokens)
    assert got.keys() == expected.keys() and expected
    assert max_relative_error(got, expected) < tolerance


def _lora(transformers, base, targets):
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=targets,
                             fan_in_fan_out=isinstance(base, transformers.GPT2LMHeadModel))
    model = peft.get_peft_model(base, config)
    for name, p in model.named_parameters():  # LoRA's B starts at zero: make A's gradient non-zero
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    return model


def test_enable_input_require_grads_is_accepted_and_trains_like_eager(transformers):
    model = tiny_gpt2(transformers)
    model.enable_input_require_grads()
    _trains_like_eager(model)


def test_the_hook_left_by_gradient_checkpointing_disable_is_accepted(transformers):
    model = tiny_gpt2(transformers)
    model.gradient_checkpointing_enable()
    model.gradient_checkpointing_disable()
    assert model.transformer.wte._forward_hooks  # transformers leaves make_inputs_require_grads
    _trains_like_eager(model)


@pytest.mark.parametrize("build", [tiny_gpt2, _llama], ids=["gpt2", "llama"])
def test_gradient_checkpointing_already_on_trains_like_eager(transformers, build):
    model = build(transformers)
    model.gradient_checkpointing_enable()
    _trains_like_eager(model)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "hf-checkpointing"])
@pytest.mark.parametrize("build,targets", [(tiny_gpt2, ["c_attn", "c_proj"]),
                                           (_llama, ["q_proj", "v_proj", "down_proj"])], ids=["gpt2", "llama"])
def test_peft_lora_trains_only_the_adapters_like_eager(transformers, build, targets, checkpointing):
    base = build(transformers)
    if checkpointing:
        base.gradient_checkpointing_enable()
    model = _lora(transformers, base, targets)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    _trains_like_eager(model)


def test_peft_lora_under_the_eager_runtime_trains_like_eager(transformers):
    model = _lora(transformers, _llama(transformers), ["q_proj", "v_proj", "down_proj"])
    model.enable_input_require_grads()
    tokens = _tokens()
    expected = _grads(model, model, tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = apply_checkpointing(model, (tokens,), {"labels": tokens}, budget="70%", time_limit=TIME_LIMIT,
                                   compare=False)
    try:
        assert plan.regions and plan.predicted_peak_bytes <= plan.budget_bytes
        assert max_relative_error(_grads(model, model, tokens), expected) < 1e-10
    finally:
        remove_checkpointing(model)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("build", [tiny_gpt2, _llama], ids=["gpt2", "llama"])
def test_both_attention_implementations_train_like_eager(transformers, build, attention):
    _trains_like_eager(build(transformers, attn_implementation=attention))


@pytest.mark.parametrize("build", [tiny_gpt2, _llama], ids=["gpt2", "llama"])
def test_bf16_weights_train_like_eager(transformers, build):
    """bf16 has 8 bits of mantissa (ulp 7.8e-3 relative): the tolerance is a few ulps, not
    float64's (2.8e-2 seen on GPT-2 under xdist; the graph's ops round differently from eager's)."""
    _trains_like_eager(build(transformers, dtype=torch.bfloat16), tolerance=5e-2)


def test_a_requires_grad_hook_on_a_model_with_nothing_to_train_is_still_refused(transformers):
    model = tiny_gpt2(transformers)
    model.enable_input_require_grads()
    model.requires_grad_(False)
    tokens = _tokens()
    with pytest.raises(UnreplayableForwardError, match="make_inputs_require_grads"):
        optimize(model, (tokens,), example_kwargs={"labels": tokens}, budget="60%", time_limit=TIME_LIMIT)


def test_a_hook_that_does_more_than_mark_requires_grad_is_still_refused(transformers):
    model = tiny_gpt2(transformers)

    def scale_and_mark(module, inputs, output):
        output.requires_grad_(True)
        return output * 2

    model.transformer.wte.register_forward_hook(scale_and_mark)
    tokens = _tokens()
    with pytest.raises(UnreplayableForwardError, match="scale_and_mark"):
        optimize(model, (tokens,), example_kwargs={"labels": tokens}, budget="60%", time_limit=TIME_LIMIT)
