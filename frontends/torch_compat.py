"""Every private torch API that remat-opt uses, in one place, with the versions it was checked on.

torch's private modules (AOTAutograd's stages and descriptors, FakeTensor, the partitioner's
helpers, dispatch internals, Inductor) change between releases without notice. Each name the
package needs from them is imported or adapted here, with a line saying what it guards and on
which versions it was checked; the rest of the package (frontends, optimizer) imports these
names from this module only (tests/frontends/test_torch_compat.py checks it). Inductor and dynamo are
reached through functions that import them when called. When a release breaks one, the fix
lands here.

Tested: torch 2.13.0 and 2.14.1 (CPU builds; the whole suite in CI), named by `TESTED_TORCH`;
importing ``frontends`` on another release prints one line saying so (`warn_if_untested_torch`).
Also run: 2.11.0+cu130 on an H200, from source: every adapter here imports and works, and 954 of
the suite's 970 tests pass; the 16 that do not (generators passed to export, a BatchNorm counter
in the eager runtime, gloo ranks, MoE in transformers 5.17) are listed in benchmarks/RESULTS.md,
so 2.11 is not in the tested range. The "2.11.0" in the lines below means that run.
"""

from __future__ import annotations
import __future__

import sys
from typing import Any

import torch
from torch._functorch import config as functorch_config  # noqa: F401
from torch._functorch._aot_autograd import descriptors as aot_descriptors  # noqa: F401
from torch._functorch.aot_autograd import (  # noqa: F401
    aot_compile_joint_with_descriptors,
    aot_export_joint_with_descriptors,
)
from torch._functorch.compile_utils import fx_graph_cse  # noqa: F401
from torch._functorch.partitioners import (  # noqa: F401
    _extract_fwd_bwd_modules,
    is_sym_node,
    min_cut_rematerialization_partition,
)
from torch._guards import CompileContext, TracingContext, detect_fake_mode  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily  # noqa: F401
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module  # noqa: F401
from torch.nn.modules.batchnorm import _BatchNorm  # noqa: F401
from torch.utils import _pytree as pytree  # noqa: F401
from torch.utils._mode_utils import no_dispatch  # noqa: F401
from torch.utils._python_dispatch import (  # noqa: F401
    TorchDispatchMode,
    _disable_current_modes,
    is_traceable_wrapper_subclass,
)
from torch.utils._pytree import arg_tree_leaves, tree_flatten, tree_leaves, tree_map, tree_unflatten  # noqa: F401

OpOverload = torch._ops.OpOverload

PARTITIONER_LOGGER = "torch._functorch.partitioners"
"""The logger of the partitioner's module (`torch_partitioner` quiets its warnings)."""

# --- what is imported above, and on which versions it was checked ---------------------------------
# aot_export_joint_with_descriptors / aot_compile_joint_with_descriptors: the joint graph and its
#   compiled pair (capture, remat_module, joint_stitch); 2.11.0, 2.13.0, 2.14.1.
# aot_descriptors: the AOTInput/AOTOutput descriptor classes naming joint placeholders and outputs
#   (ParamAOTInput, TangentAOTInput, ...; capture, dynamo_joint, joint_stitch, profile); 2.11.0, 2.13.0, 2.14.1.
# functorch_config: AOTAutograd's settings (activation_memory_budget, enable_autograd_cache,
#   donated_buffer; compile_backend, torch_partitioner, inductor_memory); 2.11.0, 2.13.0, 2.14.1.
# fx_graph_cse: the CSE pass torch runs on a joint before partitioning (compile_backend);
#   2.11.0, 2.13.0, 2.14.1.
# min_cut_rematerialization_partition: torch's own partitioner, the baseline (torch_partitioner);
#   2.11.0, 2.13.0, 2.14.1.
# _extract_fwd_bwd_modules / is_sym_node: split a joint into forward and backward modules by a
#   chosen saved set, and tell symbolic-size nodes (rewrite); 2.11.0, 2.13.0, 2.14.1.
# CompileContext / TracingContext: dynamo's compile id of the graph being planned, and the forward
#   metadata AOTAutograd keeps while compiling (compile_backend, inductor_memory); 2.11.0, 2.13.0, 2.14.1.
# detect_fake_mode: the fake mode a graph's meta values live in; 2.11.0, 2.13.0, 2.14.1.
# FakeTensor / FakeTensorMode / unset_fake_temporarily: value metadata on joint nodes;
#   2.11.0, 2.13.0, 2.14.1. From 2.14 AOTAutograd counts saved values by FakeTensor type, so every
#   meta value remat-opt adds to a joint must be made in the joint's fake mode (`fake_like_mode`).
# _make_graph_module / _use_lazy_graph_module: fx's lazy graph modules (capture traces with them;
#   joint_stitch, repeated_body build modules as it does); 2.11.0, 2.13.0, 2.14.1.
# _BatchNorm: the base of every BatchNorm module that counts its training steps (BatchNorm1d/2d/3d,
#   SyncBatchNorm, the lazy ones; eager_checkpoint freezes them by attribute on a rerun);
#   2.11.0, 2.13.0, 2.14.1.
# pytree / tree_flatten / tree_unflatten / tree_map / tree_leaves / arg_tree_leaves: torch's pytree
#   (flattening step inputs and outputs, node args; pytree.SUPPORTED_NODES, tree_is_leaf in
#   fx_leaves); 2.11.0, 2.13.0, 2.14.1.
# no_dispatch: run a tensor op below every dispatch mode (joint_stitch); 2.11.0, 2.13.0, 2.14.1.
# TorchDispatchMode / _disable_current_modes / is_traceable_wrapper_subclass: dispatch modes (the
#   memory tracker, eager ops, kernel workspace measurement) and wrapper subclasses such as DTensor;
#   2.11.0, 2.13.0, 2.14.1.
# OpOverload: the type of an aten op's overload (``aten.mm.default``), the target of the joint's
#   call_function nodes (kernel_workspace, rng_replay, inductor_memory); 2.11.0, 2.13.0, 2.14.1.
# PARTITIONER_LOGGER: the name of torch._functorch.partitioners' logger; 2.11.0, 2.13.0, 2.14.1.
#
# Inductor and dynamo (``torch._inductor``, ``torch._dynamo``) are imported only by the functions
# below, when called, on the path that needs them (torch.compile, an Inductor-aware peak).

TESTED_TORCH = ("2.13", "2.14")
"""torch releases (major.minor) the package was tested on; see the module docstring."""


def torch_release(version: str = torch.__version__) -> str:
    """'2.14' for '2.14.1+cu130'."""
    return ".".join(version.split("+")[0].split(".")[:2])


def untested_torch_message(version: str = torch.__version__) -> str | None:
    """One line naming the tested releases when ``version`` is not one of them, else None."""
    if torch_release(version) in TESTED_TORCH:
        return None
    return (f"remat-opt: torch {version} is untested (tested: {', '.join(TESTED_TORCH)}); "
            "capture may fail or refuse models that work on a tested release")


def warn_if_untested_torch() -> None:
    """Print `untested_torch_message` once per process, on standard error."""
    message = untested_torch_message()
    if message is not None:
        print(message, file=sys.stderr)


def call_function_apply(original: Any, cls: type, *args: Any, **kwargs: Any) -> Any:
    """Run ``torch.autograd.Function.apply`` as saved from the class ``__dict__`` (``original``)
    for ``cls``. Up to 2.13 it is a Python ``classmethod``; 2.14 makes it a C
    ``classmethod_descriptor``, which has no ``__func__``: binding through ``__get__`` works
    for both. Checked: 2.11.0, 2.13.0, 2.14.1."""
    return original.__get__(None, cls)(*args, **kwargs)


def fake_like_mode(fake_mode: FakeTensorMode | None, make: Any) -> torch.Tensor:
    """``make()``'s tensor as a FakeTensor of ``fake_mode`` (the joint's), or as made when the
    graph has none. 2.14's AOTAutograd asserts that every saved value's meta is a FakeTensor
    (``saved_tensor_is_graph_input``); 2.13 also accepted plain tensors."""
    if fake_mode is None:
        return make()
    with fake_mode:
        return make()


def generator_key(generator: torch.Generator) -> int:
    """The C generator that ``generator`` wraps (``Generator._cdata``, a private attribute): two
    Python objects for one generator share it. Checked: 2.11.0, 2.13.0, 2.14.1."""
    return generator._cdata


def fx_boxed_codegen() -> type | None:
    """fx's ``_BoxedCodeGen`` (a graph that clears its argument list as it runs), or None on a
    torch without it (`remat_module.boxed` then falls back to ``make_boxed_func``).
    Checked: 2.11.0, 2.13.0, 2.14.1."""
    try:
        from torch.fx.graph import _BoxedCodeGen  # optional: private fx API, absent from older torch
    except ImportError:  # older torch: inputs live until the graph returns
        return None
    return _BoxedCodeGen


class _ForwardingCall:  # OpOverload.__call__ of torch 2.13.0
    def __call__(self, /, *args, **kwargs):
        return self._op(*args, **kwargs)


class _ForwardingCallWithFastPath:  # OpOverload.__call__ of torch 2.14.1
    def __call__(self, /, *args, **kwargs):
        if (
            self._pyobj_dispatcher is not None
            and torch._C._peek_should_skip_torch_function()
        ):
            return self._cpp_dispatch_handle(*args, **kwargs)
        return self._op(*args, **kwargs)


def _same_code(ours: Any, theirs: Any) -> bool:
    future = __future__.annotations.compiler_flag  # set in this file's code only: not behaviour
    return (ours.co_code, ours.co_names, ours.co_flags & ~future, ours.co_posonlyargcount) == (
        theirs.co_code, theirs.co_names, theirs.co_flags & ~future, theirs.co_posonlyargcount)


def op_overload_call_only_forwards() -> bool:
    """Whether ``OpOverload.__call__`` only forwards to the overload's C++ dispatcher entry (its
    private ``_op``; from 2.14, ``_op`` may be a faster Python-object path to the same
    dispatcher, with the C++ entry kept as ``_cpp_dispatch_handle``), so that calling
    `op_entry_point` is the same call (`graph_runtime.direct_calls`). Compared on bytecode
    with the two known forwards. Checked: 2.13.0, 2.14.1."""
    theirs = OpOverload.__call__.__code__
    return any(_same_code(known.__call__.__code__, theirs)
               for known in (_ForwardingCall, _ForwardingCallWithFastPath))


def op_entry_point(op: OpOverload) -> Any:
    """The C++ dispatcher entry an overload's ``__call__`` forwards to (``_op``), or None where
    the overload goes through the Python-object fast path (2.14: custom ops with Python
    kernels, ``_pyobj_dispatcher``); calling the overload is then the faster call.
    Checked: 2.13.0, 2.14.1."""
    if getattr(op, "_pyobj_dispatcher", None) is not None:
        return None
    return op._op


def aot_collect_bw_donated_buffer_idxs() -> Any:
    """AOTAutograd's ``collect_bw_donated_buffer_idxs`` (the backward inputs it donates), as
    AOTAutograd calls it right after partitioning. Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._functorch._aot_autograd.graph_compile import collect_bw_donated_buffer_idxs  # heavy: AOTAutograd
    return collect_bw_donated_buffer_idxs


# --------------------------------------------------------------------------- dynamo (heavy, lazy)
def dynamo_aot_autograd() -> Any:
    """dynamo's ``aot_autograd`` backend factory (``torch._dynamo.backends.common``).
    Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._dynamo.backends.common import aot_autograd  # heavy: dynamo, imported only when torch.compile runs
    return aot_autograd


def dynamo_explain() -> Any:
    """``torch._dynamo.explain`` (graph breaks of a model's call). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._dynamo import explain  # heavy: dynamo, imported only when torch.compile runs
    return explain


def is_compiled(module: torch.nn.Module) -> bool:
    """Whether calling ``module`` runs torch.compile'd code: ``torch.compile(module)`` (an
    ``OptimizedModule``) or ``module.compile()`` (``_compiled_call_impl``). Checked: 2.11.0,
    2.13.0, 2.14.1."""
    if getattr(module, "_compiled_call_impl", None) is not None:
        return True
    from torch._dynamo.eval_frame import OptimizedModule  # heavy: dynamo, imported only to recognize its module
    return isinstance(module, OptimizedModule)


def dynamo_config() -> Any:
    """dynamo's config module (``verbose``). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._dynamo import config  # heavy: dynamo, imported only when torch.compile runs
    return config


def dynamo_shorten_traceback() -> type:
    """dynamo's ``ShortenTraceback``: an exception of this type passes through dynamo unwrapped,
    from its ``first_useful_frame``. Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._dynamo.exc import ShortenTraceback  # heavy: dynamo, imported only when torch.compile runs
    return ShortenTraceback


# ------------------------------------------------------------------------- Inductor (heavy, lazy)
def inductor_compile_fx() -> Any:
    """Inductor's ``compile_fx`` (the whole-graph entry point). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.compile_fx import compile_fx  # heavy: Inductor, imported only on its path
    return compile_fx


def inductor_compile_fx_inner() -> Any:
    """Inductor's ``compile_fx_inner`` (one forward or backward graph).
    Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.compile_fx import compile_fx_inner  # heavy: Inductor, imported only on its path
    return compile_fx_inner


def inductor_get_cpp_compiler() -> Any:
    """Inductor's ``get_cpp_compiler``, after loading Inductor's ``compile_fx`` (ImportError,
    RuntimeError or OSError: an Inductor that cannot load). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor import compile_fx  # noqa: F401  # heavy: Inductor, imported only on its path
    from torch._inductor.cpp_builder import get_cpp_compiler  # heavy: Inductor, imported only on its path
    return get_cpp_compiler


def inductor_custom_partitioner_fn() -> type:
    """Inductor's ``CustomPartitionerFn`` base (ImportError on a torch whose Inductor takes no
    custom partitioner). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.custom_graph_pass import CustomPartitionerFn  # heavy: Inductor, imported only on its path
    return CustomPartitionerFn


def inductor_get_hash_for_files() -> Any:
    """Inductor's ``get_hash_for_files`` (a custom pass's cache key). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.custom_graph_pass import get_hash_for_files  # heavy: Inductor, imported only on its path
    return get_hash_for_files


def inductor_get_dtype_size() -> Any:
    """Inductor's ``get_dtype_size`` (bytes of one element). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.utils import get_dtype_size  # heavy: Inductor, imported only on its path
    return get_dtype_size


def inductor_count_tangents() -> Any:
    """Inductor's ``count_tangents`` (a backward graph's tangent inputs). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.utils import count_tangents  # heavy: Inductor, imported only on its path
    return count_tangents


def inductor_ir() -> Any:
    """Inductor's ``ir`` module (``MultiOutputLayout``). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor import ir  # heavy: Inductor, imported only on its path
    return ir


def inductor_wrapper() -> Any:
    """Inductor's wrapper codegen module (``PythonWrapperCodegen`` and its memory-plan lines;
    2.13 has ``ConditionalLine``, 2.14 ``SwitchLine``). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.codegen import wrapper  # heavy: Inductor, imported only on its path
    return wrapper


def inductor_virtualized() -> Any:
    """Inductor's ``V`` (``V.graph``: the graph being lowered). Checked: 2.11.0, 2.13.0, 2.14.1."""
    from torch._inductor.virtualized import V  # heavy: Inductor, imported only on its path
    return V
