"""The drop-in module: the user's model, trained through the rewritten graphs.

Calling it in training mode with gradients enabled runs the plan's forward graph inside one
autograd Function whose backward is the plan's backward graph; gradients land in the
original parameters' ``.grad``. In ``eval()`` or under ``no_grad`` it runs the original model,
which saves nothing. ``state_dict`` and ``load_state_dict`` are the original model's.
Inputs smaller than the planned ones run the planned schedule on a capture at their sizes,
compiled once per size (`ShapePolicy`, `frontends.graph_runtime.shape_variants`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from frontends.capture.export_passes import guard_gradient_free
from frontends.capture.step import CapturedStep
from frontends.graph_runtime.direct_calls import call_ops_directly
from frontends.graph_runtime.rewrite import partition_by_schedule
from frontends.graph_runtime.shape_variants import (
    DIFFERENT,
    LARGER,
    ON_LARGER,
    SAME,
    compare_inputs,
    describe_shapes,
    input_signature,
    shape_key,
    structure_difference,
)
from frontends.graph_runtime.state_tensors import TreeWalk, walk
from frontends.guards.sharding import check_no_sharded_submodules
from frontends.torch_compat import aot_compile_joint_with_descriptors, fx_boxed_codegen, tree_flatten, tree_unflatten
from solvers.ir.plan import Plan


def boxed(gm: torch.fx.GraphModule):
    """Run ``gm`` with the boxed calling convention: it clears its argument list, so each
    input (a saved activation, a tangent) is freed after its last use, as the plan assumes.
    Its ops are called through their C++ entry points (`direct_calls`)."""
    codegen = fx_boxed_codegen()
    if codegen is None:  # older torch: inputs live until the graph returns
        from functorch.compile import make_boxed_func  # optional: private fx API, absent from older torch

        return make_boxed_func(gm)
    gm.graph.set_codegen(codegen())
    gm.recompile()
    return call_ops_directly(gm)


class InputMismatchError(ValueError):
    """The module is called with inputs unlike those it was planned for."""


@dataclass(frozen=True)
class ShapePolicy:
    """What the module does with inputs of other sizes (see `frontends.graph_runtime.shape_variants`).

    ``static``: only the planned sizes run (anything else raises `InputMismatchError`).
    Otherwise inputs no larger than planned run the planned schedule on a capture at their sizes
    (``recapture``), and a larger input raises (``on_larger="error"``) or is planned afresh
    (``"replan"``: ``replan`` plans a capture at the original budget). ``reschedule`` makes the
    plan the planned schedule makes on a smaller capture (simulated, not solved). Both come from
    the planner above (`optimizer.api`). At most ``max_variants`` sizes are kept, the least
    recently used dropped first."""

    static: bool = True
    on_larger: str = "error"
    recapture: Callable[[tuple, dict], CapturedStep] | None = None
    replan: Callable[[CapturedStep], Plan] | None = None
    reschedule: Callable[[CapturedStep, Plan, str], Plan] | None = None
    max_variants: int = 8

    def __post_init__(self) -> None:
        if self.on_larger not in ON_LARGER:
            raise ValueError(f"on_larger must be one of {', '.join(ON_LARGER)}, got {self.on_larger!r}")
        if not self.static and (self.recapture is None or self.reschedule is None):
            raise ValueError("a shape-polymorphic module needs recapture and reschedule functions")


@dataclass(frozen=True)
class CompiledStep:
    """One planned size: the compiled autograd function, its graphs and plan."""

    function: Callable
    graphs: dict
    plan: Plan
    gradient_free_outputs: tuple[int, ...]
    kwarg_overrides: dict


def compile_step(captured: CapturedStep, plan: Plan) -> CompiledStep:
    """AOTAutograd's compiled function with ``plan``'s schedule as its forward/backward split."""
    if getattr(captured.joint, "_remat_opt_compiled", False):
        # torch's compile step consumes the joint graph's tracing state: a second use fails
        # deep inside AOTAutograd, so say what to do instead.
        raise ValueError("this capture was already rewritten into a module: capture the model "
                         "again (optimize() does) to build another one")
    captured.joint._remat_opt_compiled = True
    graphs: dict[str, torch.fx.GraphModule] = {}
    partition = partition_by_schedule(captured, plan.schedule)

    def keep(kind: str):
        def compiler(gm: torch.fx.GraphModule, example_inputs):
            graphs[kind] = gm
            return boxed(gm)
        return compiler

    def partition_and_keep(joint_module, joint_inputs, **kwargs):
        fw, bw = partition(joint_module, joint_inputs, **kwargs)
        graphs["forward"], graphs["backward"] = fw, bw
        return fw, bw

    function = aot_compile_joint_with_descriptors(
        captured.joint, partition_fn=partition_and_keep,
        fw_compiler=keep("forward"), bw_compiler=keep("backward"),
    )
    return CompiledStep(function, graphs, plan, captured.gradient_free_outputs,
                        dict(captured.kwarg_overrides))  # use_cache=False: see hf_training


def _tensor_signature(tensors: list[torch.Tensor]) -> list[tuple]:
    return [(t.shape, t.dtype, t.device) for t in tensors]


class RematModule(torch.nn.Module):
    """``model`` with ``plan`` applied to its training step."""

    def __init__(self, model: torch.nn.Module, captured: CapturedStep, plan: Plan,
                 example_args: tuple, example_kwargs: dict | None = None,
                 shapes: ShapePolicy = ShapePolicy()):
        super().__init__()
        self.model = model
        self.plan = plan
        self._state_names = tuple([*(("parameter", n) for n in captured.param_names),
                                   *(("buffer", n) for n in captured.buffer_names)])
        self._last_walk: TreeWalk | None = None
        """The last module-tree walk that checked sharding: reused while it holds."""
        self._signature = input_signature((tuple(example_args), dict(example_kwargs or {})))
        self._param_signature = _tensor_signature(self._state_tensors())
        self._planned = compile_step(captured, plan)
        self._planned_graph = captured.graph
        self._shapes = shapes
        self._variants: OrderedDict[str, tuple[tuple, CompiledStep]] = OrderedDict()
        """Input signature key -> (signature, compiled step), least recently used first."""

    # --------------------------------------------------------------- inspection
    @property
    def forward_graph(self) -> torch.fx.GraphModule:
        """The generated forward at the planned sizes: returns the outputs, then what backward reads."""
        return self._planned.graphs["forward"]

    @property
    def backward_graph(self) -> torch.fx.GraphModule:
        """The generated backward at the planned sizes, recomputations (``*_recomputed``) included."""
        return self._planned.graphs["backward"]

    @property
    def plans_by_shape(self) -> dict[str, Plan]:
        """The plan of every input size run so far (the planned one first), keyed by its shapes."""
        plans = {describe_shapes(self._signature): self.plan}
        plans.update((describe_shapes(signature), step.plan) for signature, step in self._variants.values())
        return plans

    # ------------------------------------------------------------------- state
    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)  # nothing to save: the original module
        tensors = self._state_tensors(check_sharding=True)
        if _tensor_signature(tensors) != self._param_signature:
            raise InputMismatchError(
                "parameters changed shape, dtype or device since planning: call optimize() again")
        step = self._step_for(args, kwargs)
        outputs = step.function(*tensors, *args, **{**kwargs, **step.kwarg_overrides})
        if not step.gradient_free_outputs:
            return outputs
        flat, spec = tree_flatten(outputs)
        return tree_unflatten(guard_gradient_free(flat, step.gradient_free_outputs), spec)

    def _state_tensors(self, check_sharding: bool = False) -> list[torch.Tensor]:
        """The parameters and buffers the step reads, by name: the last walk of the module
        tree while it holds (`state_tensors`), else a new one. ``check_sharding`` refuses
        FSDP-wrapped submodules on a new walk (their hooks would never run); a walk that
        holds has the same modules of the same classes."""
        if self._last_walk is not None:
            tensors = self._last_walk.tensors_if_holds(self.model)
            if tensors is not None:
                return tensors
        check = (lambda modules: check_no_sharded_submodules(self.model, modules)) if check_sharding else None
        try:
            tensors, found = walk(self.model, self._state_names, check)
        except KeyError as missing:
            raise InputMismatchError(f"{missing.args[0]} is no longer in the model the plan was made for: "
                                     "call optimize() again") from None
        if check_sharding:
            self._last_walk = found
        return tensors

    def _step_for(self, args: tuple, kwargs: dict) -> CompiledStep:
        """The compiled step for these inputs' sizes: the planned one, or a variant of it."""
        signature = input_signature((tuple(args), dict(kwargs)))
        fit = compare_inputs(self._signature, signature)
        if fit.kind == SAME:
            return self._planned
        if self._shapes.static:
            raise InputMismatchError(
                "inputs differ from the example inputs the plan was made for (shape, dtype, "
                "device or a non-tensor value): call optimize() again with the new inputs"
            )
        if fit.kind == DIFFERENT:
            raise InputMismatchError(f"{fit.detail}: call optimize() again with these inputs")
        if fit.kind == LARGER and self._shapes.on_larger == "error":
            raise InputMismatchError(
                f"{fit.detail}: the plan covers inputs up to ({describe_shapes(self._signature)}); "
                "plan at the largest size (optimize() with those inputs) or pass on_larger='replan'")
        key = shape_key(signature)
        if key in self._variants:
            self._variants.move_to_end(key)
            return self._variants[key][1]
        step = self._new_variant(args, kwargs, fit.kind)
        self._variants[key] = (signature, step)
        while len(self._variants) > self._shapes.max_variants:
            self._variants.popitem(last=False)
        return step

    def _new_variant(self, args: tuple, kwargs: dict, kind: str) -> CompiledStep:
        captured = self._shapes.recapture(tuple(args), dict(kwargs))
        if kind == LARGER:  # on_larger="replan": a plan of its own, at the original budget
            return compile_step(captured, self._shapes.replan(captured))
        difference = structure_difference(self._planned_graph, captured.graph)
        if difference:
            raise InputMismatchError(
                f"at ({describe_shapes(input_signature((tuple(args), dict(kwargs))))}) the model traces to "
                f"another graph ({difference}): it specializes on a size; call optimize() with these inputs")
        plan = self._shapes.reschedule(captured, self.plan,
                                       f"the schedule planned at ({describe_shapes(self._signature)})")
        if plan.predicted_peak_bytes > self.plan.predicted_peak_bytes:  # a bug, not a user error
            raise AssertionError(
                f"the planned schedule peaks at {plan.predicted_peak_bytes} bytes on smaller inputs, "
                f"above its planned {self.plan.predicted_peak_bytes}")
        return compile_step(captured, plan)
