"""Generated graph code that calls each op's C++ entry point directly.

Why: the graph runtime replays forward and backward as fx-generated Python, one call per op
(``torch.ops.aten.mm.default(a, b)``). Each such call makes four attribute look-ups and goes
through ``OpOverload.__call__``, a Python frame that only forwards to the op's C++ callable
(``OpOverload._op``). Eager autograd runs its backward in C++, so on a step of many short ops that
Python is time eager does not spend: on this project's CPU VM a call of ``aten.relu.default``
took 4.1 us by name and 2.75 us through its ``_op`` (torch 2.13.0), 4.65 and 1.66 us on 2.14.1.

`call_ops_directly` regenerates the module's code with fx's own code generator (same statements,
same order, same ``x = None`` frees after a value's last use, same boxed argument list) and binds
each op's ``_op`` as a global of that code instead of naming it through ``torch.ops``. It does so
only while ``OpOverload.__call__`` is one of the forwards of torch 2.13 and 2.14
(`op_overload_call_only_forwards`, checked on its bytecode): a torch that adds logic there keeps
fx's code. An overload on torch 2.14's Python-object fast path (custom ops with Python kernels)
keeps fx's call. ``gm.code`` still shows fx's code; what runs differs only in how each op is
named. ``gm.recompile()`` puts fx's code back.
"""

from __future__ import annotations

import itertools
import linecache
import re

import torch

from frontends.torch_compat import OpOverload, op_entry_point, op_overload_call_only_forwards

_OP_CALL = re.compile(r"\btorch\.ops\.(\w+)\.(\w+)\.(\w+)\(")
"""An overload called by its qualified name in fx's generated code: namespace, op, overload."""

_SOURCE_NUMBER = itertools.count()


def _overload(namespace: str, name: str, overload: str) -> OpOverload | None:
    try:
        op = getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, OpOverload) else None


def direct_source(gm: torch.fx.GraphModule) -> tuple[str, dict]:
    """fx's source for ``gm`` with every op overload named by a global bound to its ``_op``, and
    the globals that source runs with."""
    code = gm.graph.python_code(root_module="self")
    namespace = dict(code.globals)

    def bind(match: re.Match) -> str:
        op = _overload(*match.groups())
        entry = None if op is None else op_entry_point(op)
        name = "_direct_" + "_".join(match.groups())
        if entry is None or namespace.setdefault(name, entry) is not entry:  # else fx's call stays
            return match.group(0)
        return name + "("

    return _OP_CALL.sub(bind, code.src), namespace


def call_ops_directly(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm``, its ``forward`` replaced by `direct_source`'s code (in place; returns ``gm``).
    Unchanged where ``OpOverload.__call__`` does more than forward to ``_op``."""
    if not op_overload_call_only_forwards():
        return gm
    if hasattr(gm, "real_recompile"):  # a lazy graph module: make fx's own code first
        gm.real_recompile()
    source, namespace = direct_source(gm)
    filename = f"<remat-opt graph {next(_SOURCE_NUMBER)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)
    type(gm).forward = namespace["forward"]  # fx gives every GraphModule a class of its own
    return gm
