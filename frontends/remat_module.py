"""The drop-in module: the user's model, trained through the rewritten graphs.

Calling it in training mode with gradients enabled runs the plan's forward graph inside one
autograd Function whose backward is the plan's backward graph; gradients land in the
original parameters' ``.grad``. In ``eval()`` or under ``no_grad`` it runs the original model,
which saves nothing. ``state_dict`` and ``load_state_dict`` are the original model's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._functorch.aot_autograd import aot_compile_joint_with_descriptors
from torch.utils._pytree import tree_flatten, tree_unflatten

from frontends.capture import CapturedStep
from frontends.export_passes import guard_gradient_free
from frontends.rewrite import partition_by_schedule
from frontends.sharding import check_no_sharded_submodules
from optimizer.ir.plan import Plan


def boxed(gm: torch.fx.GraphModule):
    """Run ``gm`` with the boxed calling convention: it clears its argument list, so each
    input (a saved activation, a tangent) is freed after its last use, as the plan assumes."""
    try:
        from torch.fx.graph import _BoxedCodeGen  # optional: private fx API, absent from older torch
    except ImportError:  # older torch: inputs live until the graph returns
        from functorch.compile import make_boxed_func  # optional: private fx API, absent from older torch

        return make_boxed_func(gm)
    gm.graph.set_codegen(_BoxedCodeGen())
    gm.recompile()
    return gm


class InputMismatchError(ValueError):
    """The module is called with inputs unlike those it was planned for."""


def _signature(tree: Any) -> list:
    leaves, _ = tree_flatten(tree)
    return [
        ("tensor", tuple(x.shape), x.dtype, x.device.type) if isinstance(x, torch.Tensor) else ("value", x)
        for x in leaves
    ]


class RematModule(torch.nn.Module):
    """``model`` with ``plan`` applied to its training step."""

    def __init__(self, model: torch.nn.Module, captured: CapturedStep, plan: Plan,
                 example_args: tuple, example_kwargs: dict | None = None):
        super().__init__()
        if getattr(captured.joint, "_remat_opt_compiled", False):
            # torch's compile step consumes the joint graph's tracing state: a second use fails
            # deep inside AOTAutograd, so say what to do instead.
            raise ValueError("this capture was already rewritten into a module: capture the model "
                             "again (optimize() does) to build another one")
        captured.joint._remat_opt_compiled = True
        self.model = model
        self.plan = plan
        self._param_names = captured.param_names
        self._buffer_names = captured.buffer_names
        self._gradient_free_outputs = captured.gradient_free_outputs
        self._kwarg_overrides = dict(captured.kwarg_overrides)  # use_cache=False: see hf_training
        self._signature = _signature((tuple(example_args), dict(example_kwargs or {})))
        self._param_signature = self._current_param_signature()
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

        self._compiled = aot_compile_joint_with_descriptors(
            captured.joint, partition_fn=partition_and_keep,
            fw_compiler=keep("forward"), bw_compiler=keep("backward"),
        )
        self._graphs = graphs

    # --------------------------------------------------------------- inspection
    @property
    def forward_graph(self) -> torch.fx.GraphModule:
        """The generated forward: returns the outputs, then what backward reads."""
        return self._graphs["forward"]

    @property
    def backward_graph(self) -> torch.fx.GraphModule:
        """The generated backward, recomputations (``*_recomputed``) included."""
        return self._graphs["backward"]

    # ------------------------------------------------------------------- state
    def state_dict(self, *args, **kwargs):
        return self.model.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self.model.load_state_dict(state_dict, strict=strict, assign=assign)

    # ------------------------------------------------------------------ calling
    def forward(self, *args, **kwargs):
        if not (self.training and torch.is_grad_enabled()):
            return self.model(*args, **kwargs)  # nothing to save: the original module
        self._check(args, kwargs)
        tensors = [self.model.get_parameter(n) for n in self._param_names]
        tensors += [self.model.get_buffer(n) for n in self._buffer_names]
        outputs = self._compiled(*tensors, *args, **{**kwargs, **self._kwarg_overrides})
        if not self._gradient_free_outputs:
            return outputs
        flat, spec = tree_flatten(outputs)
        return tree_unflatten(guard_gradient_free(flat, self._gradient_free_outputs), spec)

    def _current_param_signature(self) -> list:
        tensors = [self.model.get_parameter(n) for n in self._param_names]
        tensors += [self.model.get_buffer(n) for n in self._buffer_names]
        return _signature(tensors)

    def _check(self, args: tuple, kwargs: dict) -> None:
        check_no_sharded_submodules(self.model)  # fully_shard inside: its hooks would never run
        if _signature((tuple(args), dict(kwargs))) != self._signature:
            raise InputMismatchError(
                "inputs differ from the example inputs the plan was made for (shape, dtype, "
                "device or a non-tensor value): call optimize() again with the new inputs"
            )
        if self._current_param_signature() != self._param_signature:
            raise InputMismatchError(
                "parameters changed shape, dtype or device since planning: call optimize() again"
            )
