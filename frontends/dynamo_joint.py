"""What the compile backend adjusts in a joint graph that dynamo and Inductor hand it.

capture() exports the model itself; under ``torch.compile`` the joint graph comes from dynamo
and, with Inductor, after Inductor's joint-graph passes. Three differences matter to planning
and to the step's budget split: nodes those passes insert carry no ``partitioner_tag``
(`tag_inserted_backward_nodes`), dynamo lifts parameters to plain inputs that AOTAutograd names
only by index (`mark_parameters`), and only parameter gradients outlive a graph's backward
(`graph_footprint`, one graph's terms in `frontends.graph_budget`).
"""

from __future__ import annotations

import dataclasses

import torch

from frontends.graph_budget import GraphFootprint
from optimizer.graph import NodeKind, RematGraph
from optimizer.plan import Plan


def tag_inserted_backward_nodes(gm: torch.fx.GraphModule) -> None:
    """Inductor's joint-graph passes insert nodes without a ``partitioner_tag`` (e.g. an
    ``expand`` after the cross-entropy backward's ``where``); one that reads a backward value
    runs in backward. Tag it, or capture would place it in forward before its own input."""
    backward: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        tag = node.meta.get("partitioner_tag")
        if tag == "is_backward" or (node.op == "placeholder" and node.name.startswith("tangents")):
            backward.add(node)
        elif tag is None and node.op == "call_function" and any(a in backward for a in node.all_input_nodes):
            node.meta["partitioner_tag"] = "is_backward"
            backward.add(node)


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


def graph_footprint(graph: RematGraph, plan: Plan, gm: torch.fx.GraphModule, value_of: dict[str, str],
               static: list[int]) -> GraphFootprint:
    """The graph's terms in the step's budget split. Only parameter gradients outlive the graph's
    backward; the gradients of its inputs are the earlier graph's output gradients (counted there)."""
    from torch._functorch._aot_autograd import descriptors as aot_desc

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
