"""Module hooks (on any submodule, and the global ones) and tensor hooks registered in forward:
the captured graph replays none of them, so `frontends.guards.forward_guards` names and refuses them.
Hooks whose function is defined inside torch (``ModuleTracker``) are not the user's.

One kind of hook is accepted: a forward hook whose whole body is ``output.requires_grad_(True)``,
which transformers' ``enable_input_require_grads()`` (called by PEFT/LoRA fine-tuning and by
``gradient_checkpointing_enable()``, and left behind by ``gradient_checkpointing_disable()``)
registers on the input embeddings, and PEFT's own twin. It only makes autograd differentiate
through a frozen embedding's output. The captured joint differentiates every op between the loss
and any trainable parameter anyway, so no gradient changes: its effect is kept whenever the model
has a trainable parameter, and the hook is refused (as before) when it has none."""

from __future__ import annotations

import contextlib
import dis
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.modules import module as nn_module

from frontends.guards.forward_state import model_path
from frontends.guards.user_code import is_user_file, short_path

_MODULE_HOOKS = (("_forward_pre_hooks", "forward pre-hook"), ("_forward_hooks", "forward hook"),
                 ("_backward_pre_hooks", "backward pre-hook"), ("_backward_hooks", "backward hook"))
_GLOBAL_HOOKS = (("_global_forward_pre_hooks", "global forward pre-hook"),
                 ("_global_forward_hooks", "global forward hook"),
                 ("_global_backward_pre_hooks", "global backward pre-hook"),
                 ("_global_backward_hooks", "global backward hook"))
_TENSOR_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")


def _hook_function(hook: Any) -> Any:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return getattr(hook, "__func__", hook)


def hook_name(hook: Any) -> str:
    fn = _hook_function(hook)
    return getattr(fn, "__name__", None) or type(fn).__name__


def _is_torch_hook(hook: Any) -> bool:
    fn = _hook_function(hook)
    owner = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    return owner == "torch" or owner.startswith("torch.")


def hook_tables(model: torch.nn.Module) -> Iterator[tuple[str, dict, str]]:
    """(kind, hook dict, where) for every module hook table of the model, then the global ones."""
    for path, module in model.named_modules():
        for attr, kind in _MODULE_HOOKS:
            table = getattr(module, attr, None)
            if isinstance(table, dict):
                if attr == "_backward_hooks" and table and module._is_full_backward_hook is False:
                    kind = "backward hook (register_backward_hook)"
                yield kind, table, f"on {model_path(path)}"
    for attr, kind in _GLOBAL_HOOKS:
        table = getattr(nn_module, attr, None)
        if isinstance(table, dict):
            yield kind, table, "(registered for every module)"


def marks_output_requiring_grad(hook: Any) -> bool:
    """Whether ``hook`` is a ``(module, input, output)`` forward hook that does nothing but
    ``output.requires_grad_(True)``, as transformers' and PEFT's ``make_inputs_require_grad(s)``
    are. Read off its bytecode: the one attribute it names is ``requires_grad_``, its only
    constants are None and True, and it runs no instruction but loads, that call and a return
    (no arithmetic, no globals, no closure)."""
    code = getattr(_hook_function(hook), "__code__", None)
    if code is None or code.co_argcount != 3 or code.co_names != ("requires_grad_",) or code.co_freevars:
        return False
    if not set(code.co_consts) <= {None, True}:
        return False
    return all(i.opname in _MARKING_OPS for i in dis.get_instructions(code))


_MARKING_OPS = frozenset({"RESUME", "NOP", "CACHE", "LOAD_FAST", "LOAD_CONST", "LOAD_ATTR", "LOAD_METHOD",
                          "PUSH_NULL", "PRECALL", "CALL", "CALL_METHOD", "CALL_FUNCTION", "POP_TOP",
                          "RETURN_VALUE", "RETURN_CONST", "LOAD_FAST_BORROW", "LOAD_SMALL_INT"})
"""Bytecode instructions (Python 3.10-3.13) a hook that only marks its output may run."""


def hook_problems(model: torch.nn.Module) -> list[str]:
    """One phrase per module hook (of any submodule) or global module hook the captured graph
    would not replay: each fires once, at capture. Forward hooks that only mark the output as
    requiring grad are kept by the graph while a parameter trains (module docstring)."""
    trainable = any(p.requires_grad for p in model.parameters())
    return [f"{kind} {hook_name(hook)} {where}" for kind, table, where in hook_tables(model)
            for hook in table.values() if not _is_torch_hook(hook)
            and not (trainable and kind == "forward hook" and marks_output_requiring_grad(hook))]


@contextlib.contextmanager
def recording_tensor_hooks(found: list[str]) -> Iterator[None]:
    """``Tensor.register_hook`` (and the post-accumulate one) called by user code meanwhile."""
    originals = {name: getattr(torch.Tensor, name) for name in _TENSOR_HOOKS if hasattr(torch.Tensor, name)}

    def recording(name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def register(self, hook, *args, **kwargs):
            caller = sys._getframe(1)
            if is_user_file(caller.f_code.co_filename):
                found.append(f"Tensor.{name}({hook_name(hook)}) in forward "
                             f"(at {short_path(caller.f_code.co_filename)}:{caller.f_lineno}) never fires")
            return original(self, hook, *args, **kwargs)
        return register

    for name, original in originals.items():
        setattr(torch.Tensor, name, recording(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
