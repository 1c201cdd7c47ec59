"""The captured step calls attention as eager calls it (`attention_masks_as_eager`).

transformers builds no mask in eager training when attention is plainly causal (or nothing is
masked) and calls SDPA with ``is_causal``; while torch.export traces it builds a dense mask
instead. These tests compare the SDPA kernels that eager dispatches with those the graph runtime
dispatches at store-all, for transformers models as built, and check the pass itself on
hand-written attention: exact masks are rewritten, an input's mask and a bias are not.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from e2e_helpers import hf_step, max_relative_error, tiny_gpt2
from torch.utils._python_dispatch import TorchDispatchMode

from frontends.capture.export_passes import attention_masks_as_eager
from frontends.capture.step import capture
from optimizer import optimize

VOCAB = 128
_SDPA = torch.ops.aten.scaled_dot_product_attention.default


class _AttentionCalls(TorchDispatchMode):
    """Records each SDPA kernel dispatched (forward and backward): its name, whether it was given
    a mask, ``is_causal``, and the key's shape (grouped heads or repeated ones)."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, bool, bool, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "scaled_dot_product" in func.name():
            schema = [a.name for a in func._schema.arguments]
            bound = {**dict(zip(schema, args)), **kwargs}
            self.calls.append((func.name(), bound.get("attn_mask") is not None, bool(bound.get("is_causal")),
                               tuple(bound["key"].shape)))
        return func(*args, **kwargs)


def _transformers():
    module = pytest.importorskip("transformers")
    module.logging.set_verbosity_error()
    return module


def _tokens(batch: int = 2, seq: int = 32) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(0))


def _gpt2(tf):
    return tiny_gpt2(tf, attn_implementation="sdpa", attn_pdrop=0.0)


def _llama(tf):
    config = tf.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                            num_key_value_heads=2, vocab_size=VOCAB, attn_implementation="sdpa")
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(config).double().train()


def _bert(tf):
    config = tf.BertConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                           vocab_size=VOCAB, attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return tf.BertForMaskedLM(config).double().train()


def _t5(tf):
    config = tf.T5Config(d_model=32, d_ff=64, num_layers=2, num_heads=4, d_kv=8, vocab_size=VOCAB,
                         decoder_start_token_id=0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return tf.T5ForConditionalGeneration(config).double().train()


# Attention dropout is 0 where the config has one: on the CPU, SDPA with dropout runs its math
# fallback, which dispatches matmuls and no SDPA kernel in eager and in the graph alike.
# T5 writes its attention out (matmuls, its relative-position bias, softmax): no SDPA kernel in
# eager, and none may appear in the graph.
MODELS = {"gpt2": _gpt2, "llama": _llama, "bert": _bert, "t5": _t5}
CAUSAL = {"gpt2", "llama"}
OWN_ATTENTION = {"t5"}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_graph_runtime_calls_the_attention_kernels_eager_calls(name):
    model = MODELS[name](_transformers())
    ids = _tokens()
    with _AttentionCalls() as eager:
        _, _, eager_grads = hf_step(model, model, input_ids=ids, labels=ids)
    rm = optimize(model, (), "100%", example_kwargs={"input_ids": ids, "labels": ids}, solver="store-all")
    with _AttentionCalls() as graph:
        _, _, graph_grads = hf_step(rm, model, input_ids=ids, labels=ids)
    assert bool(eager.calls) != (name in OWN_ATTENTION), eager.calls
    assert sorted(graph.calls) == sorted(eager.calls)
    if name in CAUSAL:
        assert all(is_causal and not has_mask for _, has_mask, is_causal, _ in eager.calls)
    assert max_relative_error(graph_grads, eager_grads) < 1e-10


def test_transformers_gpt2_as_built_captures_no_mask():
    """Default GPT-2 (dropout 0.1 in attention, so CPU's SDPA decomposes into matmuls): none of
    the ops that build transformers' mask is left in the joint."""
    tf = _transformers()
    model = tiny_gpt2(tf, attn_implementation="sdpa")
    ids = _tokens()
    step = capture(model, (), {"input_ids": ids, "labels": ids})
    targets = {n.target for n in step.joint.graph_module.graph.nodes}
    assert torch.ops.aten.cumsum.default not in targets  # transformers' packed-sequence check
    assert torch.ops.aten.le.Tensor not in targets  # its causal comparison


# ------------------------------------------------------------------ the pass on hand-written attention
class _Attention(torch.nn.Module):
    """Single-head attention whose mask comes from ``make_mask(q_len, device)``, or from the
    input when ``make_mask`` is None."""

    def __init__(self, make_mask):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.make_mask = make_mask

    def forward(self, x, padding=None):
        q, k, v = self.qkv(x).unsqueeze(1).chunk(3, dim=-1)
        mask = self.make_mask(x.shape[1], x.device) if self.make_mask else padding
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum()


def _tril(n, device):
    i = torch.arange(n, device=device)
    return i[None, :] <= i[:, None]


def _additive_causal(n, device):
    return torch.zeros(n, n, device=device).masked_fill(~_tril(n, device), float("-inf"))


def _min_causal(n, device):
    return torch.zeros(n, n, device=device).masked_fill(~_tril(n, device), torch.finfo(torch.float32).min)


def _all_visible(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device)


def _sliding_window(n, device):
    i = torch.arange(n, device=device)
    return _tril(n, device) & (i[:, None] - i[None, :] < 4)


def _alibi(n, device):
    i = torch.arange(n, device=device, dtype=torch.float32)
    return -(i[:, None] - i[None, :]).abs() * 0.5


def _sdpa_calls(make_mask, with_input_mask: bool = False):
    torch.manual_seed(0)
    model = _Attention(make_mask)
    x = torch.randn(2, 8, 16)
    args = (x, _tril(8, "cpu")) if with_input_mask else (x,)
    gm = torch.export.export(model, args, strict=False).module()
    changed = attention_masks_as_eager(gm)
    calls = [n for n in gm.graph.nodes if n.target is _SDPA]
    expected = model(*args)
    return changed, calls, gm, args, expected


@pytest.mark.parametrize("make_mask", [_tril, _additive_causal, _min_causal], ids=["bool", "-inf", "finfo.min"])
def test_a_causal_mask_of_the_shapes_becomes_is_causal(make_mask):
    changed, calls, gm, args, expected = _sdpa_calls(make_mask)
    assert changed == 1
    (call,) = calls
    assert call.kwargs["attn_mask"] is None and call.kwargs["is_causal"] is True
    assert not any(n.target is torch.ops.aten.arange.default for n in gm.graph.nodes)  # the mask is gone
    torch.testing.assert_close(gm(*args), expected)


def test_a_mask_that_masks_nothing_is_dropped():
    changed, (call,), gm, args, expected = _sdpa_calls(_all_visible)
    assert changed == 1 and call.kwargs["attn_mask"] is None and call.kwargs["is_causal"] is False
    torch.testing.assert_close(gm(*args), expected)


@pytest.mark.parametrize("make_mask", [_sliding_window, _alibi], ids=["sliding-window", "alibi-bias"])
def test_other_masks_and_biases_stay(make_mask):
    changed, (call,), gm, args, expected = _sdpa_calls(make_mask)
    assert changed == 0
    assert isinstance(call.args[3] if len(call.args) > 3 else call.kwargs["attn_mask"], torch.fx.Node)


def test_a_mask_an_input_reaches_stays():
    """Causal by value at capture time, but an input: the next batch may hold padding."""
    changed, (call,), *_ = _sdpa_calls(None, with_input_mask=True)
    assert changed == 0
