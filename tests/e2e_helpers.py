"""Shared helpers for tests that run real models: load examples, compare gradients, measure."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
import warnings

import pytest
import torch

from frontends.measure.memory_tracker import track_live_memory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = ("mlp", "gpt", "convnet")


def example_path(name: str) -> str:
    return os.path.join(ROOT, "examples", f"{name}.py")


def small_mlp():
    """examples/mlp.py's MLP, narrowed so that the exact MILP solves each budget in about a second."""
    spec = importlib.util.spec_from_file_location("_sweep_mlp", example_path("mlp"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(0)
    return example.MLP(width=32, depth=3), (torch.randn(128, 32), torch.randn(128, 32))


def load_example(name: str, dtype: torch.dtype = torch.float64, **model_kwargs):
    """An example's model and inputs in ``dtype`` (integer inputs stay integer)."""
    spec = importlib.util.spec_from_file_location(f"_example_{name}", example_path(name))
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses in the file look their module up here
    spec.loader.exec_module(example)
    model, inputs = example.get_model(**model_kwargs), tuple(example.get_inputs())
    model = model.to(dtype)
    inputs = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    return model, inputs


def loss_of(output) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


def sgd_losses_and_grads(rm, inputs: tuple, steps: int, seed: int) -> tuple[list, list]:
    """Train the remat module ``rm`` ``steps`` SGD steps (lr 0.05) from generator seed ``seed``
    (dropout draws); each step's loss and gradients by parameter name, for bitwise comparison."""
    opt = torch.optim.SGD(rm.parameters(), lr=0.05)
    torch.manual_seed(seed)
    losses, grads = [], []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_of(rm(*inputs))
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in rm.model.named_parameters()})
        opt.step()
    return losses, grads


def train_step(module: torch.nn.Module, inputs: tuple):
    """One forward+backward; returns (outputs detached, {name: grad})."""
    for p in module.parameters():
        p.grad = None
    out = module(*inputs)
    loss_of(out).backward()
    params = module.model if hasattr(module, "plan") else module
    grads = {n: p.grad.detach().clone() for n, p in params.named_parameters()}
    flat = [o.detach() for o in (out if isinstance(out, (tuple, list)) else (out,))]
    return flat, grads


def max_relative_error(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    worst = 0.0
    for name in a:
        scale = b[name].abs().max().clamp_min(1e-300)
        worst = max(worst, float((a[name] - b[name]).abs().max() / scale))
    return worst


def resident_bytes(model: torch.nn.Module, inputs: tuple) -> int:
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    tensors.update({id(t): t for t in inputs if isinstance(t, torch.Tensor)})
    return sum(t.untyped_storage().nbytes() for t in tensors.values())


def measured_peak(module: torch.nn.Module, inputs: tuple) -> int:
    """Peak live tensor bytes of one training step, resident parameters and inputs included."""
    params = module.model if hasattr(module, "plan") else module
    for p in params.parameters():
        p.grad = None
    with track_live_memory() as tracker:
        out = module(*inputs)  # held through backward, as a training loop holds its outputs
        loss_of(out).backward()
        del out
    return tracker.result.peak_bytes + resident_bytes(params, inputs)


def clone(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model)


def tiny_llama(intermediate_size: int):
    """A 2-layer transformers Llama (64 wide, 4 heads, SDPA, vocab 128) in float64 train mode,
    seeded, and token ids for it (batch 4, 32 tokens); skips the test without transformers."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=intermediate_size,
                                      num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
                                      max_position_embeddings=64, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).double().train()
    return model, torch.randint(1, 128, (4, 32), generator=torch.Generator().manual_seed(0))



def tiny_gpt2(transformers, dtype: torch.dtype = torch.float64, **config):
    """A seeded 2-layer transformers GPT-2 (64 wide, 4 heads, vocab 128, 64 positions) in train
    mode; ``config`` overrides GPT2Config fields (attention implementation, dropout)."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, **config)
    return transformers.GPT2LMHeadModel(config).to(dtype).train()


def hf_step(module, params: torch.nn.Module, *args, **kwargs):
    """Forward + backward from the loss under seed 1; returns (output, loss, gradients of
    ``params``' parameters that got one). The loss is the output, its first item, or ``.loss``."""
    params.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = module(*args, **kwargs)
    loss = out if isinstance(out, torch.Tensor) else out[0] if isinstance(out, tuple) else out.loss
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in params.named_parameters() if p.grad is not None}
    return out, loss.detach(), grads
