"""Predict the peak memory of an Inductor-compiled training step from Inductor's own buffer plan.

remat-opt plans unfused aten ops; Inductor then fuses pointwise ops (a fused kernel's
intermediates never reach memory) and reuses freed buffers, so the plan's peak is only an upper
bound of the compiled step's. The exact numbers are in the wrapper Inductor generates: after
fusion and scheduling its ``memory_plan_reuse`` pass turns the graph into a list of allocation
(``empty_strided``), reuse (``bufB = bufA; del bufA``) and free (``del buf``) lines. While a
graph compiles, `recording_wrapper_plans` copies that list into a `WrapperMemoryPlan` (names and
byte sizes only); `predict_compiled_peak` then walks the forward's and the backward's plans the
way they run in a step, exactly as the simulator combines an eager plan:

* forward: parameters and user inputs are resident (freeing their names frees nothing);
  what the forward returns stays live: user outputs (held by the caller through backward) and
  the activations saved for backward;
* between the graphs autograd creates the output gradients (the backward's ``tangents``);
* backward: saved activations and tangents belong to the call (AOTAutograd clears its saved
  tensors), so a ``del`` frees them, unless a user output or a parameter holds the storage;
  parameter gradients stay.

Storage identity is tracked by name through reuse and alias lines, so a freed name whose storage
lives on under another name frees nothing.

`probe_compiled_peak` gets the same prediction for a forward/backward pair that is not going to
run (a candidate plan, `frontends.compile.inductor_fit`): Inductor lowers, fuses and schedules both graphs
and plans their buffers, then the compile stops before any kernel is built or loaded.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from frontends.measure.kernel_workspace import kernel_peak_bytes
from frontends.torch_compat import (
    OpOverload,
    TracingContext,
    aot_collect_bw_donated_buffer_idxs,
    arg_tree_leaves,
    functorch_config,
    inductor_compile_fx_inner,
    inductor_count_tangents,
    inductor_get_dtype_size,
    inductor_ir,
    inductor_virtualized,
    inductor_wrapper,
)


@dataclass(frozen=True)
class BufferEvent:
    """One memory line of Inductor's wrapper, in execution order."""

    op: str
    """``alloc`` (new storage), ``free`` (drop a name), ``reuse`` (``name`` takes ``source``'s
    storage, ``source`` is dropped), ``alias`` (``name`` is a view of ``source``'s storage) or
    ``transient`` (an extern kernel ``name`` holds ``bytes`` above what is live while it runs:
    its outputs about to be allocated and its workspace; nothing stays)."""
    name: str
    bytes: int = 0
    source: str = ""


@dataclass(frozen=True)
class WrapperMemoryPlan:
    """What one compiled graph allocates and frees, from its generated wrapper."""

    is_backward: bool
    inputs: tuple[tuple[str, int], ...]
    """Graph inputs in placeholder order, with their storage bytes."""
    events: tuple[BufferEvent, ...]
    outputs: tuple[str | None, ...]
    """For each graph output, the buffer or input name holding it (None: not a tensor)."""
    unmeasured_kernels: tuple[str, ...] = ()
    """Extern kernels whose transient bytes could not be measured (counted as none)."""
    output_strides: tuple[tuple[int, ...] | None, ...] = ()
    """For each graph output, the strides Inductor gave it (None: not a tensor, or symbolic).
    Layout optimisation (channels-last convolutions) may change them from the fx graph's."""


@dataclass(frozen=True)
class CompiledPeak:
    """The Inductor-aware peak of one graph's training step (forward, then backward)."""

    predicted_peak_bytes: int
    """Resident bytes plus the larger of the two graphs' live peaks."""
    resident_bytes: int
    forward_peak_bytes: int
    """Live bytes above the resident ones at the forward's peak."""
    backward_peak_bytes: int
    """Live bytes above the resident ones at the backward's peak (saved activations, user
    outputs and tangents included)."""
    saved_bytes: int
    """Activations the compiled forward leaves for backward (storages, not names)."""
    unmeasured_kernels: tuple[str, ...] = ()
    """Extern kernels run without a measured workspace: the prediction may be low by theirs."""


class _Walk:
    """Live storage bytes while a wrapper plan runs; storages keyed by the name that made them."""

    def __init__(self, live: int = 0) -> None:
        self.key_of: dict[str, str] = {}
        self.names_of: dict[str, set[str]] = {}
        self.bytes_of: dict[str, int] = {}
        self.pinned: set[str] = set()  # held outside the graph: never freed by a del here
        self.live = self.peak = live

    def bind(self, name: str, key: str, nbytes: int, pinned: bool) -> None:
        self.key_of[name] = key
        self.names_of.setdefault(key, set()).add(name)
        self.bytes_of.setdefault(key, nbytes)
        if pinned:
            self.pinned.add(key)

    def drop(self, name: str) -> None:
        key = self.key_of.pop(name, None)
        if key is None:
            return
        names = self.names_of[key]
        names.discard(name)
        if not names and key not in self.pinned:
            self.live -= self.bytes_of[key]

    def apply(self, event: BufferEvent) -> None:
        if event.op == "alloc":
            self.drop(event.name)  # a name bound twice: the old storage goes (never seen in practice)
            self.bind(event.name, f"{id(self)}:{event.name}", event.bytes, pinned=False)
            self.live += event.bytes
            self.peak = max(self.peak, self.live)
        elif event.op == "free":
            self.drop(event.name)
        elif event.op == "transient":
            self.peak = max(self.peak, self.live + event.bytes)
        elif event.op in ("reuse", "alias") and event.source in self.key_of:
            key = self.key_of[event.source]
            self.key_of[event.name] = key
            self.names_of[key].add(event.name)
            if event.op == "reuse":
                self.drop(event.source)
        elif event.op not in ("reuse", "alias"):
            raise ValueError(f"unknown buffer event {event.op!r}")

    def live_keys(self, names: tuple[str | None, ...]) -> dict[str, int]:
        keys = {self.key_of[n]: self.bytes_of[self.key_of[n]] for n in names if n in self.key_of}
        return {k: b for k, b in keys.items() if k not in self.pinned}


def predict_compiled_peak(forward: WrapperMemoryPlan, backward: WrapperMemoryPlan,
                          resident_bytes: int) -> CompiledPeak:
    """The step's peak: ``forward`` runs with the parameters and inputs resident, then
    ``backward`` receives the saved activations (its non-tangent inputs, in the order the
    forward returns them after its user outputs) and the tangents autograd created."""
    fw = _Walk()
    for name, nbytes in forward.inputs:
        fw.bind(name, f"input:{name}", nbytes, pinned=True)
    for event in forward.events:
        fw.apply(event)
    saved_names = [name for name, _ in backward.inputs if not name.startswith("tangents")]
    n_user = len(forward.outputs) - len(saved_names)
    if n_user < 0:
        raise ValueError(f"the backward takes {len(saved_names)} saved values but the forward returns "
                         f"only {len(forward.outputs)} outputs: the two graphs do not belong together")
    user_out, saved_out = forward.outputs[:n_user], forward.outputs[n_user:]
    held = fw.live_keys(forward.outputs)  # what the forward leaves alive
    user_keys = set(fw.live_keys(user_out))
    saved_bytes = sum(b for k, b in fw.live_keys(saved_out).items() if k not in user_keys)
    tangents = sum(nbytes for name, nbytes in backward.inputs if name.startswith("tangents"))

    bw = _Walk(live=sum(held.values()) + tangents)
    saved_iter = iter(saved_out)
    for name, nbytes in backward.inputs:
        if name.startswith("tangents"):
            bw.bind(name, f"tangent:{name}", nbytes, pinned=False)
            continue
        source = next(saved_iter)
        key = fw.key_of.get(source) if source is not None else None
        if key is None or key not in held:  # a parameter or input passed through: resident
            bw.bind(name, f"input:{source or name}", nbytes, pinned=True)
        else:
            bw.bind(name, key, held[key], pinned=key in user_keys)
    for key in user_keys:  # the caller holds user outputs even if backward never reads them
        bw.pinned.add(key)
        bw.bytes_of.setdefault(key, held[key])
    for event in backward.events:
        bw.apply(event)
    return CompiledPeak(
        predicted_peak_bytes=resident_bytes + max(fw.peak, bw.peak),
        resident_bytes=resident_bytes, forward_peak_bytes=fw.peak, backward_peak_bytes=bw.peak,
        saved_bytes=saved_bytes,
        unmeasured_kernels=forward.unmeasured_kernels + backward.unmeasured_kernels)


# --------------------------------------------------------------------- reading Inductor's wrapper
def _buffer_bytes(graph: Any, node: Any) -> int:
    get_dtype_size = inductor_get_dtype_size()  # Inductor, imported only on its path
    elements = graph.sizevars.optimization_hint(graph.get_allocation_storage_size(node), fallback=0)
    return int(elements) * get_dtype_size(node.get_dtype())


def _origin_op(node: Any) -> torch.fx.Node | None:
    """The aten call an extern kernel runs: its origin node, else the origin whose op the kernel
    runs (a fallback's ``op_overload``), else its one aten origin."""
    origin = getattr(node, "origin_node", None)
    candidates = [origin] if origin is not None else list(getattr(node, "origins", ()))
    ops = [n for n in candidates if isinstance(n, torch.fx.Node) and n.op == "call_function"
           and isinstance(n.target, OpOverload)]
    runs = getattr(node, "op_overload", None)
    if len(ops) > 1 and runs is not None:
        ops = [n for n in ops if n.target == runs]
    return ops[0] if len(ops) == 1 else None


def _kernel_transient(node: Any, preallocated: bool, unmeasured: list[str]) -> BufferEvent | None:
    """What an extern kernel holds above the live buffers while it runs: everything it allocates
    (outputs and workspace), or only its workspace when its outputs were allocated before
    (``out=`` kernels)."""
    origin = _origin_op(node)
    measured = kernel_peak_bytes(origin) if origin is not None else None
    if measured is None:
        unmeasured.append(f"{node.get_name()} ({origin.target if origin is not None else 'no aten origin'})")
        return None
    held = measured.workspace_bytes if preallocated else measured.peak_bytes
    return BufferEvent("transient", node.get_name(), held) if held else None


def _events_of(wrapper: Any, graph: Any, unmeasured: list[str]) -> list[BufferEvent]:
    """Translate the wrapper's planned lines (after ``memory_plan_reuse``) into buffer events;
    extern kernels they cannot measure are appended to ``unmeasured``."""
    ir, w = inductor_ir(), inductor_wrapper()  # Inductor, imported only on its path

    control_flow = tuple(getattr(w, name) for name in ("EnterSubgraphLine", "ConditionalLine", "SwitchLine")
                         if hasattr(w, name))  # 2.13 has ConditionalLine, 2.14 SwitchLine
    out_lines = tuple(getattr(w, name) for name in ("ExternKernelOutLine", "ExternKernelMultiOutLine")
                      if hasattr(w, name))
    events: list[BufferEvent] = []

    def transient(node: Any, preallocated: bool) -> None:
        event = _kernel_transient(node, preallocated, unmeasured)
        if event is not None:
            events.append(event)

    for line in wrapper.lines:
        if isinstance(line, w.AllocateLine):
            events.append(BufferEvent("alloc", line.node.get_name(), _buffer_bytes(graph, line.node)))
        elif isinstance(line, w.ReuseLine):
            op = "reuse" if line.delete_old else "alias"
            events.append(BufferEvent(op, line.reused_as.get_name(), source=line.node.get_name()))
        elif isinstance(line, w.ReinterpretLine):
            events.append(BufferEvent("alias", line.reused_as.get_name(), source=line.node.get_name()))
        elif isinstance(line, w.FreeIfNotReusedLine):
            if not line.is_reused and not isinstance(line.node.layout, ir.MultiOutputLayout):
                events.append(BufferEvent("free", line.node.get_name()))
        elif isinstance(line, w.FreeLine):
            events.append(BufferEvent("free", line.node.get_name()))
        elif isinstance(line, w.ExternKernelAllocLine):
            node = line.node
            transient(node, preallocated=False)  # before its outputs: the call holds them and more
            if isinstance(node.layout, ir.MultiOutputLayout):
                continue  # its MultiOutputLines name the real buffers
            aliased = node.get_inputs_that_alias_output()
            if aliased:
                events.append(BufferEvent("alias", node.get_name(), source=aliased[0]))
            else:
                events.append(BufferEvent("alloc", node.get_name(), _buffer_bytes(graph, node)))
        elif isinstance(line, out_lines):
            transient(line.node, preallocated=True)
        elif isinstance(line, w.MultiOutputLine):
            node = graph.try_get_buffer(line.result_name)
            if node is not None and not node.get_inputs_that_alias_output():
                events.append(BufferEvent("alloc", line.result_name, _buffer_bytes(graph, node)))
        elif isinstance(line, control_flow):
            raise NotImplementedError("control flow in an Inductor graph: its memory is not predicted")
    return events


def _output_name(node: Any) -> str | None:
    try:
        return node.get_name()
    except (AttributeError, NotImplementedError):  # None outputs and constants
        return None


def _output_strides(node: Any) -> tuple[int, ...] | None:
    try:
        return tuple(int(s) for s in node.get_layout().stride)
    except (AttributeError, NotImplementedError, TypeError):  # None outputs, symbolic strides
        return None


def _plan_of(wrapper: Any, graph: Any) -> WrapperMemoryPlan:
    inputs = []
    for name, value in graph.graph_inputs.items():
        try:
            inputs.append((name, _buffer_bytes(graph, value)))
        except (AttributeError, NotImplementedError):  # symbolic sizes (static shapes: none)
            inputs.append((name, 0))
    unmeasured: list[str] = []
    events = tuple(_events_of(wrapper, graph, unmeasured))
    return WrapperMemoryPlan(is_backward=bool(graph.is_backward), inputs=tuple(inputs), events=events,
                             outputs=tuple(_output_name(o) for o in graph.graph_outputs),
                             unmeasured_kernels=tuple(unmeasured),
                             output_strides=tuple(_output_strides(o) for o in graph.graph_outputs))


_UNREADABLE = (NotImplementedError, AttributeError, KeyError, TypeError, ValueError)
"""What reading an unfamiliar wrapper (another torch version, control flow) may raise."""


@contextlib.contextmanager
def recording_wrapper_plans(sink: list[WrapperMemoryPlan]) -> Iterator[None]:
    """Append a `WrapperMemoryPlan` to ``sink`` for every graph Inductor generates in the block
    (none for a wrapper it cannot read: the compile itself is never affected)."""
    PythonWrapperCodegen, V = inductor_wrapper().PythonWrapperCodegen, inductor_virtualized()

    original = PythonWrapperCodegen.memory_plan_reuse

    def memory_plan_reuse(self: Any) -> None:
        original(self)
        try:
            sink.append(_plan_of(self, V.graph))
        except _UNREADABLE:  # a wrapper this reader does not know: no prediction, same code
            pass

    PythonWrapperCodegen.memory_plan_reuse = memory_plan_reuse
    try:
        yield
    finally:
        PythonWrapperCodegen.memory_plan_reuse = original


# --------------------------------------------------------------------- probing a candidate plan
class _BufferPlanRead(Exception):
    """Raised right after Inductor planned a probed graph's buffers: the rest of the compile
    (kernel source assembly, C++ builds, loading) is not needed for the prediction."""


@contextlib.contextmanager
def _stopping_after_buffer_plan(sink: list[WrapperMemoryPlan]) -> Iterator[None]:
    PythonWrapperCodegen, V = inductor_wrapper().PythonWrapperCodegen, inductor_virtualized()

    original = PythonWrapperCodegen.memory_plan_reuse

    def memory_plan_reuse(self: Any) -> None:
        original(self)
        sink.append(_plan_of(self, V.graph))
        raise _BufferPlanRead

    PythonWrapperCodegen.memory_plan_reuse = memory_plan_reuse
    try:
        yield
    finally:
        PythonWrapperCodegen.memory_plan_reuse = original


def _stopped_by_probe(err: BaseException | None) -> bool:
    """Inductor wraps what its compile raises (``InductorError``): look through the chain."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, _BufferPlanRead):
            return True
        err = getattr(err, "inner_exception", None) or err.__cause__ or err.__context__
        seen += 1
    return False


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]


def _buffer_plan_of(gm: torch.fx.GraphModule, example_inputs: list, *, is_backward: bool,
                    static_input_idxs: Sequence[int]) -> WrapperMemoryPlan | None:
    compile_fx_inner = inductor_compile_fx_inner()  # Inductor, imported only on its path
    sink: list[WrapperMemoryPlan] = []
    try:
        with _stopping_after_buffer_plan(sink):
            compile_fx_inner(gm, example_inputs, is_backward=is_backward,
                             static_input_idxs=list(static_input_idxs))
    except Exception as err:  # the probe's own stop, or a wrapper this reader does not know
        if not _stopped_by_probe(err) and not isinstance(err, _UNREADABLE):
            raise
    return sink[-1] if sink else None


def _saved_counts(forward: torch.fx.GraphModule, num_fwd_outputs: int) -> types.SimpleNamespace:
    """Where the forward's outputs for backward sit, named as AOTAutograd's forward metadata
    names them: the saved tensors, then the saved symbolic sizes."""
    outputs = list(forward.graph.find_nodes(op="output")[0].args[0])
    symints = sum(1 for n in outputs[num_fwd_outputs:] if isinstance(n, torch.fx.Node)
                  and not isinstance(n.meta.get("val"), torch.Tensor))
    return types.SimpleNamespace(num_forward=num_fwd_outputs, num_symints_saved_for_bw=symints,
                                 tensors_saved_for_backwards_slice=slice(
                                     num_fwd_outputs, len(outputs) - symints))


def _donated_backward_inputs(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule,
                             counts: types.SimpleNamespace) -> list[int] | None:
    """The backward inputs AOTAutograd donates (saved activations no one else holds: Inductor may
    reuse their storage), computed as AOTAutograd does right after partitioning (None: off)."""
    if not functorch_config.donated_buffer:
        return None
    return aot_collect_bw_donated_buffer_idxs()(forward, backward, counts)


def _backward_example_inputs(backward: torch.fx.GraphModule, forward_plan: WrapperMemoryPlan,
                             counts: types.SimpleNamespace) -> list:
    """The backward's example inputs as AOTAutograd hands them to Inductor: each saved tensor
    restrided to the layout the compiled forward gave it (``_aot_stage2b_bw_compile``). A
    channels-last convolution output saved for backward is otherwise planned with the fx
    graph's layout, and the backward's copies to the layout its kernels want are missed."""
    inputs = _example_inputs(backward)
    strides = forward_plan.output_strides[counts.tensors_saved_for_backwards_slice]
    for j, stride in enumerate(strides):
        i = j + counts.num_symints_saved_for_bw
        value = inputs[i] if i < len(inputs) else None
        if stride is None or not isinstance(value, torch.Tensor) or tuple(value.stride()) == stride:
            continue
        inputs[i] = value.as_strided(value.size(), stride)
    return inputs


@contextlib.contextmanager
def _donating(donated: list[int] | None) -> Iterator[None]:
    """Inductor reads the donated backward inputs from the tracing context's forward metadata,
    which AOTAutograd fills only after the partitioner returns: stand in for it meanwhile."""
    context = TracingContext.try_get()
    if context is None:  # nothing donated: the probe over-counts the backward, never under
        yield
        return
    metadata = context.fw_metadata
    if metadata is None:
        context.fw_metadata = types.SimpleNamespace(bw_donated_idxs=donated)
    else:
        before, metadata.bw_donated_idxs = metadata.bw_donated_idxs, donated
    try:
        yield
    finally:
        if metadata is None:
            context.fw_metadata = None
        else:
            metadata.bw_donated_idxs = before


def probe_compiled_peak(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule,
                        resident_bytes: int, *, num_fwd_outputs: int, mutated_inputs: int = 0,
                        static_input_idxs: Sequence[int] = ()) -> CompiledPeak | None:
    """The compiled step's peak for a forward/backward pair, as `predict_compiled_peak` reads it
    from Inductor's buffer plans, without building any kernel (None: a plan it cannot read).

    Inductor's passes rewrite the graphs in place: pass graphs made for the probe. The forward
    returns ``num_fwd_outputs`` outputs before the saved values, the first ``mutated_inputs`` of
    them inputs it mutated (the rest the caller's: Inductor keeps their strides); the backward
    gets the saved activations AOTAutograd would donate to it, as in the real compile.
    ``static_input_idxs``: the forward's parameter inputs.
    """
    count_tangents = inductor_count_tangents()  # Inductor, imported only on its path
    forward.graph.find_nodes(op="output")[0].meta["user_visible_output_idxs"] = list(
        range(mutated_inputs, num_fwd_outputs))
    bw_output = backward.graph.find_nodes(op="output")[0]  # as Inductor's bw_outputs_user_visible
    bw_output.meta["user_visible_output_idxs"] = [
        i for i, out in enumerate(arg_tree_leaves(*bw_output.args))
        if isinstance(out, torch.fx.Node)]
    counts = _saved_counts(forward, num_fwd_outputs)  # read before Inductor's passes rewrite the forward
    donated = _donated_backward_inputs(forward, backward, counts)
    fw = _buffer_plan_of(forward, _example_inputs(forward), is_backward=False,
                         static_input_idxs=static_input_idxs)
    if fw is None:
        return None
    bw_inputs = _backward_example_inputs(backward, fw, counts)
    with _donating(donated):
        bw = _buffer_plan_of(backward, bw_inputs, is_backward=True,
                             static_input_idxs=range(count_tangents(backward)))
    if bw is None:
        return None
    try:
        return predict_compiled_peak(fw, bw, resident_bytes)
    except ValueError:  # halves that do not pair up
        return None
