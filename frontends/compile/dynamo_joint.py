"""What the compile backend adjusts in a joint graph that dynamo and Inductor hand it.

capture() exports the model itself; under ``torch.compile`` the joint graph comes from dynamo
and, with Inductor, after Inductor's joint-graph passes (nodes those passes insert carry no
``partitioner_tag``; `frontends.capture.step.build_remat_graph` places a node that reads a backward
value in backward, tagged or not). Two differences matter to the step's budget split: dynamo
lifts parameters to plain inputs that AOTAutograd names only by index (`mark_parameters`), and
only parameter gradients outlive a graph's backward (`graph_footprint`, one graph's terms in
`optimizer.planning.graph_budget`).
"""

from __future__ import annotations

import dataclasses

import torch

from frontends.torch_compat import aot_descriptors as aot_desc
from optimizer.ir.graph import NodeKind, Phase, RematGraph
from optimizer.ir.plan import Plan
from optimizer.planning.graph_budget import GraphFootprint


def mark_parameters(graph: RematGraph, gm: torch.fx.GraphModule, static: list[int]) -> RematGraph:
    """Dynamo lifts parameters and buffers to plain inputs; AOTAutograd names them only by
    index (``static_lifetime_input_indices``). Label them parameters, as capture() does, so
    the breakdown and the distributed budget can tell parameters from user inputs."""
    primals = [n.name for n in gm.graph.find_nodes(op="placeholder") if not n.name.startswith("tangents")]
    names = {primals[i] for i in static if i < len(primals)}
    if not names:
        return graph
    nodes = tuple(dataclasses.replace(n, kind=NodeKind.PARAMETER)
                  if n.name in names and n.kind is NodeKind.INPUT else n for n in graph.nodes)
    return RematGraph(nodes, graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                      graph.cost_model, graph.name)


def forward_ops_first(graph: RematGraph) -> RematGraph:
    """Inductor's joint-graph passes can leave a forward op (one that reads no backward value)
    after backward ops in the graph's order; schedules and the exact solvers' data expect every
    forward group first. A stable partition keeps the order topological: a forward op reads no
    backward value, and each phase keeps its own order (so siblings stay together)."""
    phases = [n.phase for n in graph.nodes if n.is_op]
    first_backward = next((i for i, p in enumerate(phases) if p is Phase.BACKWARD), len(phases))
    if all(p is Phase.BACKWARD for p in phases[first_backward:]):
        return graph
    late = [n.phase is Phase.BACKWARD and (n.is_op or n.kind is NodeKind.TANGENT) for n in graph.nodes]
    nodes = tuple(n for n, x in zip(graph.nodes, late) if not x) + tuple(n for n, x in zip(graph.nodes, late) if x)
    return RematGraph(nodes, graph.forward_outputs, graph.user_outputs, graph.backward_outputs,
                      graph.cost_model, graph.name)


def graph_footprint(graph: RematGraph, plan: Plan, gm: torch.fx.GraphModule, value_of: dict[str, str],
               static: list[int]) -> GraphFootprint:
    """The graph's terms in the step's budget split. Only parameter gradients outlive the graph's
    backward; the gradients of its inputs are the earlier graph's output gradients (counted there)."""
    output = gm.graph.find_nodes(op="output")[0]
    param_grads = {
        value_of[out.name] for out, desc in zip(output.args[0], output.meta.get("desc") or [])
        if isinstance(out, torch.fx.Node) and out.name in value_of
        and isinstance(desc, aot_desc.GradAOTOutput)
        and getattr(desc.grad_of, "idx", None) in set(static)
    }
    saved = sum(graph[name].bytes for name in plan.saved)
    return GraphFootprint(peak_bytes=plan.predicted_peak_bytes, parameters_bytes=graph.parameter_bytes,
                          saved_bytes=saved, gradients_bytes=sum(graph[v].bytes for v in param_grads),
                          inputs_bytes=graph.input_bytes)
