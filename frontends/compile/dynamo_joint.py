"""What the compile backend adjusts in a joint graph that dynamo and Inductor hand it.

capture() exports the model itself; under ``torch.compile`` the joint graph comes from dynamo
and, with Inductor, after Inductor's joint-graph passes (nodes those passes insert carry no
``partitioner_tag``; `frontends.capture.step.build_remat_graph` places a node that reads a backward
value in backward, tagged or not). Two differences matter to the step's budget split: dynamo
lifts parameters to plain inputs that AOTAutograd names only by index (`mark_parameters`), and
only parameter gradients outlive a graph's backward (`graph_footprint`, one graph's terms in
`solvers.planning.graph_budget`). `JointReader` reads a joint graph into the `RematGraph` the
backend plans.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from frontends.capture.export_passes import untie_batch_norm_backward
from frontends.capture.step import CaptureError, build_remat_graph
from frontends.capture.symbolic_sizes import SymbolSizes
from frontends.graph_runtime.rewrite import RewriteError
from frontends.measure.costs import CostModel, cost_model_from_name
from frontends.torch_compat import aot_descriptors as aot_desc
from frontends.torch_compat import functorch_config, fx_graph_cse
from solvers.ir.graph import NodeKind, Phase, RematGraph
from solvers.ir.plan import Plan
from solvers.ir.simulator import simulate
from solvers.planning.graph_budget import GraphFootprint


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
    backward; the gradients of its inputs are the earlier graph's output gradients (counted there).
    Saved values an offload plan keeps on host hold no device bytes while later graphs run."""
    output = gm.graph.find_nodes(op="output")[0]
    param_grads = {
        value_of[out.name] for out, desc in zip(output.args[0], output.meta.get("desc") or [])
        if isinstance(out, torch.fx.Node) and out.name in value_of
        and isinstance(desc, aot_desc.GradAOTOutput)
        and getattr(desc.grad_of, "idx", None) in set(static)
    }
    on_host: set[str] = set()
    if plan.offloaded and plan.schedule is not None:  # saved on host: no device bytes across later graphs
        # which values forward leaves on host does not depend on the link's speed: any preset walks it
        on_host = set(simulate(graph, plan.schedule, link="pcie5").saved_on_host)
    saved = sum(graph[name].bytes for name in plan.saved if name not in on_host)
    return GraphFootprint(peak_bytes=plan.predicted_peak_bytes, parameters_bytes=graph.parameter_bytes,
                          saved_bytes=saved, gradients_bytes=sum(graph[v].bytes for v in param_grads),
                          inputs_bytes=graph.input_bytes)


@dataclass(frozen=True)
class ReadJoint:
    """A joint graph read for planning: the `RematGraph`, the fx value of each of its values,
    the forward outputs, and the input shapes it was sized at."""

    graph: RematGraph
    value_of: dict[str, str]
    num_fwd_outputs: int
    shapes: list[tuple[int, ...]]


class JointReader:
    """Reads the joint graphs of one backend: each frame's last input shapes are kept, so that a
    recompile with symbolic sizes is planned at no less than the frame was before."""

    def __init__(self, cost_model_name: str):
        self.cost_model_name = cost_model_name
        self.frame_shapes: dict[str, list[tuple[int, ...]]] = {}
        """Dynamo frame -> the input shapes its last graph was planned at (see `_at_least`)."""

    def cost_model(self, gm: torch.fx.GraphModule) -> CostModel:
        """The cost model at the joint graph's most common floating dtype."""
        values = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")
                  if isinstance(n.meta.get("val"), torch.Tensor)]
        dtypes = [v.dtype for v in values if v.is_floating_point()]
        dtype = max(set(dtypes), key=dtypes.count) if dtypes else torch.float32
        device = values[0].device if values else None
        return cost_model_from_name(self.cost_model_name, dtype=dtype, device=device)

    @staticmethod
    def prepare(joint_module: torch.fx.GraphModule) -> None:
        """What the joint graph gets before it is read: CSE, as torch's partitioners do first
        (one graph to plan and to seed from), and batch norm's backward untied, as capture() does."""
        if functorch_config.cse:
            joint_module.graph = fx_graph_cse(joint_module.graph)
            joint_module.recompile()
        untie_batch_norm_backward(joint_module)

    def read(self, joint_module: torch.fx.GraphModule, frame: str, num_fwd_outputs: int, static: list[int],
             name: str) -> ReadJoint:
        """The (prepared) joint graph as a `RematGraph` named ``name``, to plan."""
        inputs = _tensor_inputs(joint_module)
        sizes = SymbolSizes(_at_least(inputs, self.frame_shapes.get(frame)))
        try:
            graph, value_of, n_fwd = build_remat_graph(joint_module, self.cost_model(joint_module), name, sizes)
        except CaptureError as err:
            raise CaptureError(f"{err} (with torch.compile: pass dynamic=False)") from None
        if n_fwd != num_fwd_outputs:
            raise RewriteError(f"the joint graph's output descriptors name {n_fwd} forward outputs, "
                               f"AOTAutograd {num_fwd_outputs}: this torch version is not supported")
        graph = forward_ops_first(mark_parameters(graph, joint_module, static or []))
        return ReadJoint(graph, value_of, n_fwd, [sizes.shape(t) for t in inputs])


def _tensor_inputs(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    """The joint graph's tensor placeholders' values, in order (sizes are separate placeholders)."""
    return [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")
            if isinstance(n.meta.get("val"), torch.Tensor)]


def _at_least(inputs: list[torch.Tensor], planned: list[tuple[int, ...]] | None) -> dict:
    """Sizes a recompile with symbolic dimensions must be planned for: dynamo recompiles a frame
    with symbols at the *second* size it sees, so each symbol is planned at no less than what
    the frame's earlier graph was planned at in that place (the first, often larger, size)."""
    if not planned or len(planned) != len(inputs):
        return {}
    at_least: dict = {}
    for t, shape in zip(inputs, planned):
        if len(shape) != t.dim():
            return {}
        for dim, size in zip(t.shape, shape):
            if isinstance(dim, torch.SymInt) and len(dim.node.expr.free_symbols) == 1 and dim.node.expr.is_symbol:
                at_least[dim.node.expr] = max(size, at_least.get(dim.node.expr, 0))
    return at_least
