"""The compiled-step peak walk of `frontends.inductor_memory` on hand-written buffer plans.

Each case is small enough to add up by hand; Inductor's own plans are checked against the
allocator in tests/test_compile_backend.py.
"""

from __future__ import annotations

import pytest

from frontends.inductor_memory import (
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
