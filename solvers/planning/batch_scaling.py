"""One training step's graph at any batch size, from captures at a few, without capturing again.

A what-if question asks about many batch sizes (the largest-batch search probes 20 or more), and
each capture costs seconds (2 s for examples/gpt.py on the meta device, tens of seconds for a
large model). The graph's structure does not change with the batch; only sizes and costs do,
and in a training step they are affine in it: an activation's bytes, an op's FLOPs and the bytes
it moves are ``a + b * batch`` (parameters and their gradients are the constant part). So the
step is captured at two batch sizes, every number is fitted exactly (integer arithmetic: a
prediction that is not a whole number means the model does not hold) and the fit is *checked*
against a capture at a third batch, node for node; a graph in the checked range is then
arithmetic. Costs are recomputed from the fitted FLOPs and bytes moved by the cost model's own
formula (a roofline's ``max`` is not affine, its two terms are).

What does not fit - another structure at another batch, a size quadratic in the batch (a
batch x batch similarity matrix), a measured cost model - makes `fit_batch_scaling` or
`BatchScaling.check` say so, and the caller captures every batch as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Callable, Mapping

from solvers.ir.graph import Node, RematGraph

Seconds = Callable[[float, float], float]
"""The cost model's formula: seconds from (FLOPs, bytes moved)."""


@dataclass(frozen=True)
class StepSample:
    """One capture: the graph at ``batch`` and the bytes each op group moves (the roofline's
    memory term, which the graph does not keep)."""

    batch: int
    graph: RematGraph
    bytes_moved: Mapping[str, float]
    """Op group -> bytes its op reads and writes."""


class ScalingMismatch(ValueError):
    """The graphs at two batch sizes are not one affine family (the message says where)."""


@dataclass(frozen=True)
class _Line:
    """``at(batch) = value + slope * (batch - origin)``, exactly."""

    value: Fraction
    slope: Fraction

    def at(self, offset: int) -> Fraction:
        return self.value + self.slope * offset


@dataclass(frozen=True)
class BatchScaling:
    """Graphs at any batch from two samples; `checked` is the range a third capture confirmed."""

    origin: StepSample
    bytes: tuple[_Line, ...]
    temp_bytes: tuple[_Line, ...]
    flops: tuple[_Line, ...]
    moved: Mapping[str, _Line]
    seconds: Seconds
    checked: tuple[int, int]
    """Smallest and largest batch of the samples that agree with the fit (both ends included)."""

    def predict(self, batch: int) -> RematGraph:
        """The graph at ``batch`` as the fit predicts it (inside `checked`: the graph a capture
        gives; outside: an extrapolation, to be checked before it is trusted)."""
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        offset = batch - self.origin.batch
        graph = self.origin.graph
        nodes = []
        for i, node in enumerate(graph.nodes):
            size = _whole(self.bytes[i].at(offset), node.name, "bytes")
            temp = _whole(self.temp_bytes[i].at(offset), node.name, "temporary bytes")
            changes: dict = {"bytes": size, "temp_bytes": temp}
            if node.is_op and node.name == graph.groups[node.group][0] and node.group in self.moved:
                flops = float(_whole(self.flops[i].at(offset), node.name, "FLOPs"))
                moved = float(_whole(self.moved[node.group].at(offset), node.name, "bytes moved"))
                changes.update(flops=flops, cost=self.seconds(flops, moved))
            nodes.append(dataclasses.replace(node, **changes))
        size_of = {n.name: n.bytes for n in nodes}  # an input reused in place keeps the output's bytes
        nodes = [n if all(size_of[r] == n.bytes for r in n.reuses) else
                 dataclasses.replace(n, reuses=tuple(r for r in n.reuses if size_of[r] == n.bytes)) for n in nodes]
        return dataclasses.replace(graph, nodes=tuple(nodes))

    def covers(self, batch: int) -> bool:
        return self.checked[0] <= batch <= self.checked[1]

    def check(self, sample: StepSample) -> BatchScaling:
        """This fit with its checked range widened to ``sample``'s batch, when the prediction there
        equals the captured graph node for node; `ScalingMismatch` naming the first difference
        otherwise."""
        predicted = self.predict(sample.batch)
        _same_structure(predicted, sample.graph)
        for mine, theirs in zip(predicted.nodes, sample.graph.nodes):
            if mine != theirs:
                raise ScalingMismatch(f"at batch {sample.batch}, {mine.name!r} is not what the fit predicts "
                                      f"({_first_difference(mine, theirs)})")
        low, high = self.checked
        return dataclasses.replace(self, checked=(min(low, sample.batch), max(high, sample.batch)))


def fit_batch_scaling(first: StepSample, second: StepSample, seconds: Seconds) -> BatchScaling:
    """The affine fit through two samples of one step (`ScalingMismatch` when they differ in
    structure: then no fit can hold)."""
    if first.batch == second.batch:
        raise ValueError("two samples at the same batch size cannot fit a slope")
    _same_structure(first.graph, second.graph)
    if set(first.bytes_moved) != set(second.bytes_moved):
        raise ScalingMismatch("the op groups differ between the two batch sizes")
    span = second.batch - first.batch

    def line(a: float, b: float) -> _Line:
        return _Line(Fraction(a), Fraction(b) / span - Fraction(a) / span)

    pairs = list(zip(first.graph.nodes, second.graph.nodes))
    return BatchScaling(
        origin=first,
        bytes=tuple(line(a.bytes, b.bytes) for a, b in pairs),
        temp_bytes=tuple(line(a.temp_bytes, b.temp_bytes) for a, b in pairs),
        flops=tuple(line(a.flops, b.flops) for a, b in pairs),
        moved={g: line(first.bytes_moved[g], second.bytes_moved[g]) for g in first.bytes_moved},
        seconds=seconds,
        checked=(min(first.batch, second.batch), max(first.batch, second.batch)),
    )


def _whole(value: Fraction, name: str, what: str) -> int:
    if value.denominator != 1 or value < 0:
        raise ScalingMismatch(f"{name!r}: {what} {float(value):g} is not a whole number of the fit")
    return int(value)


_STRUCTURE = ("name", "kind", "phase", "inputs", "group", "random", "mutates", "op", "rng_state")


def _same_structure(a: RematGraph, b: RematGraph) -> None:
    if len(a.nodes) != len(b.nodes):
        raise ScalingMismatch(f"{len(a.nodes)} values at one batch size, {len(b.nodes)} at another")
    for x, y in zip(a.nodes, b.nodes):
        for field in _STRUCTURE:
            if getattr(x, field) != getattr(y, field):
                raise ScalingMismatch(f"value {x.name!r} differs in {field} between batch sizes")
    for field in ("forward_outputs", "user_outputs", "backward_outputs", "cost_model"):
        if getattr(a, field) != getattr(b, field):
            raise ScalingMismatch(f"the graphs' {field} differ between batch sizes")


def _first_difference(mine: Node, theirs: Node) -> str:
    for field in dataclasses.fields(Node):
        if getattr(mine, field.name) != getattr(theirs, field.name):
            return f"{field.name}: {getattr(mine, field.name)!r} predicted, {getattr(theirs, field.name)!r} captured"
    return "equal"
