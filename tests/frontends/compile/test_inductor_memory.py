"""The compiled-step peak walk of `frontends.compile.inductor_memory` on hand-written buffer plans.

Each case is small enough to add up by hand; Inductor's own plans are checked against the
allocator in tests/frontends/compile/test_compile_backend.py.
"""

from __future__ import annotations

import pytest

from frontends.compile.inductor_memory import (
    BufferEvent,
    WrapperMemoryPlan,
    predict_compiled_peak,
)

A, F, R, V = "alloc", "free", "reuse", "alias"


def _forward(*events: BufferEvent, outputs: tuple) -> WrapperMemoryPlan:
    return WrapperMemoryPlan(is_backward=False, inputs=(("w", 400), ("x", 100)),
                             events=events, outputs=outputs)


def _backward(inputs: tuple, *events: BufferEvent, outputs: tuple = ("dw",)) -> WrapperMemoryPlan:
    return WrapperMemoryPlan(is_backward=True, inputs=inputs, events=events, outputs=outputs)


def test_saved_activations_live_from_forward_to_their_last_use_in_backward():
    forward = _forward(
        BufferEvent(A, "buf0", 1000), BufferEvent(R, "buf1", source="buf0"),  # fused in place
        BufferEvent(A, "buf2", 300), BufferEvent(A, "loss", 8),
        outputs=("loss", "buf1", "buf2", "w"))  # the loss, then saved: two activations and w
    backward = _backward(
        (("buf1", 1000), ("buf2", 300), ("w", 400), ("tangents_1", 8)),
        BufferEvent(A, "g", 1000),   # 1000 + 300 + 8 (loss) + 8 (tangent) + 1000
        BufferEvent(F, "buf1"), BufferEvent(F, "tangents_1"),
        BufferEvent(F, "w"),         # a parameter: freeing its name frees nothing
        BufferEvent(A, "dw", 400), BufferEvent(F, "g"), BufferEvent(F, "buf2"))
    peak = predict_compiled_peak(forward, backward, resident_bytes=500)
    assert peak.forward_peak_bytes == 1000 + 300 + 8
    assert peak.saved_bytes == 1300
    assert peak.backward_peak_bytes == 1000 + 300 + 8 + 8 + 1000
    assert peak.predicted_peak_bytes == 500 + 2316


def test_a_freed_name_frees_nothing_while_its_storage_lives_on():
    forward = _forward(BufferEvent(A, "buf0", 1000), BufferEvent(V, "view0", source="buf0"),
                       BufferEvent(F, "buf0"),    # the view still holds the storage
                       BufferEvent(A, "buf1", 50), BufferEvent(F, "view0"),
                       BufferEvent(A, "buf2", 10), outputs=("buf2", "buf1"))
    backward = _backward((("buf1", 50), ("tangents_1", 10)), BufferEvent(F, "buf1"),
                         BufferEvent(A, "dw", 400))
    peak = predict_compiled_peak(forward, backward, resident_bytes=0)
    assert peak.forward_peak_bytes == 1050
    assert peak.backward_peak_bytes == 10 + 10 + 400  # dw comes after buf1 is freed
    assert peak.predicted_peak_bytes == 1050


def test_user_outputs_stay_held_through_backward_even_when_backward_frees_them():
    forward = _forward(BufferEvent(A, "logits", 600), BufferEvent(A, "loss", 8),
                       outputs=("loss", "logits", "logits"))  # logits also saved for backward
    backward = _backward((("logits", 600), ("tangents_1", 8), ("tangents_2", 600)),
                         BufferEvent(F, "logits"), BufferEvent(F, "tangents_2"),
                         BufferEvent(A, "dw", 400))
    peak = predict_compiled_peak(forward, backward, resident_bytes=0)
    assert peak.saved_bytes == 0  # the only saved storage is a user output
    assert peak.backward_peak_bytes == 608 + 608


def test_graphs_that_do_not_belong_together_are_refused():
    forward = _forward(BufferEvent(A, "loss", 8), outputs=("loss",))
    backward = _backward((("a", 1), ("b", 1), ("tangents_1", 8)))
    with pytest.raises(ValueError, match="do not belong together"):
        predict_compiled_peak(forward, backward, resident_bytes=0)


def test_an_extern_kernels_transient_bytes_count_at_its_call_and_then_vanish():
    """An extern kernel holds its outputs and its workspace while it runs (SDPA's CPU backward,
    a float64 convolution's im2col columns): the peak sees them, the live total does not keep them."""
    forward = _forward(BufferEvent(A, "buf0", 1000), BufferEvent("transient", "conv", 700),
                       BufferEvent(A, "conv", 200), BufferEvent(F, "buf0"), BufferEvent(A, "loss", 8),
                       outputs=("loss", "conv"))
    backward = _backward((("conv", 200), ("tangents_1", 8)), BufferEvent("transient", "sdpa_bw", 5000),
                         BufferEvent(F, "conv"), BufferEvent(A, "dw", 400))
    peak = predict_compiled_peak(forward, backward, resident_bytes=0)
    assert peak.forward_peak_bytes == 1000 + 700  # not 1000 + 700 + 200: the call's bytes include its output
    assert peak.backward_peak_bytes == 200 + 8 + 8 + 5000
    assert peak.saved_bytes == 200


def test_kernel_peak_measures_a_float64_convolutions_workspace():
    """CPU float64 convolution runs slow_conv2d, which builds im2col columns inside the call."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from frontends.measure.kernel_workspace import kernel_peak_bytes

    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    conv = graph.call_function(torch.ops.aten.convolution.default,
                               (x, w, None, [4, 4], [0, 0], [1, 1], False, [0, 0], 1))
    with FakeTensorMode():
        x.meta["val"] = torch.empty(4, 3, 32, 32, dtype=torch.float64)
        w.meta["val"] = torch.empty(64, 3, 4, 4, dtype=torch.float64)
        conv.meta["val"] = torch.empty(4, 64, 8, 8, dtype=torch.float64)
    measured = kernel_peak_bytes(conv)
    assert measured is not None
    assert measured.output_bytes == 4 * 64 * 8 * 8 * 8
    columns = 4 * (3 * 4 * 4) * (8 * 8) * 8  # one [C*k*k, out_h*out_w] matrix per image
    assert measured.workspace_bytes >= columns // 4, measured  # at least one image's columns
    assert kernel_peak_bytes(conv) is measured  # measured once per signature


def test_the_backward_is_probed_with_the_layouts_the_compiled_forward_gave_its_saved_tensors():
    """Inductor lays CPU convolution outputs out channels-last; AOTAutograd restrides the saved
    tensors the backward receives to match, so the probe must too (ViT at min-cut's 0.5 budget:
    probed 276 KB under its real compile without it)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from frontends.compile.inductor_memory import _backward_example_inputs, _saved_counts

    forward, backward = torch.fx.Graph(), torch.fx.Graph()
    x = forward.placeholder("x")
    conv, loss = forward.call_function(torch.relu, (x,)), forward.call_function(torch.sum, (x,))
    forward.output((loss, conv, x))  # one user output, then two saved tensors
    saved_conv, saved_x, tangent = (backward.placeholder(n) for n in ("conv", "x", "tangents_1"))
    backward.output((tangent,))
    with FakeTensorMode():
        image = torch.empty(2, 3, 4, 4)
        for node, val in ((x, image), (conv, image), (loss, torch.empty(())), (saved_conv, image),
                          (saved_x, image), (tangent, torch.empty(()))):
            node.meta["val"] = val
    fw_module = torch.fx.GraphModule(torch.nn.Module(), forward)
    bw_module = torch.fx.GraphModule(torch.nn.Module(), backward)
    channels_last = (48, 1, 12, 3)
    plan = WrapperMemoryPlan(is_backward=False, inputs=(("x", 384),), events=(), outputs=("buf0", "buf1", "x"),
                             output_strides=((), channels_last, (48, 16, 4, 1)))
    inputs = _backward_example_inputs(bw_module, plan, _saved_counts(fw_module, num_fwd_outputs=1))
    assert inputs[0].stride() == channels_last and inputs[0].shape == image.shape
    assert inputs[1] is saved_x.meta["val"] and inputs[2] is tangent.meta["val"]  # layouts unchanged
