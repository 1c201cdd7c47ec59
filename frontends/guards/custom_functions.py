"""Refuse a forward that calls a user-defined ``torch.autograd.Function``.

Non-strict ``torch.export`` traces through a custom Function's ``forward`` and keeps no trace of
its ``backward``: AOTAutograd then differentiates the forward's ops, so the captured gradient is
the forward's derivative, not what the user's ``backward`` returns (a straight-through estimator,
a fused kernel's hand-written gradient, a gradient scale: all silently wrong, under every
schedule). Capture records each Function class applied while it traces and refuses the model;
Dynamo keeps custom Functions whole, so ``torch.compile`` with ``remat_backend`` is the way to
plan such a model. Functions defined inside torch itself are not the user's and pass.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator

import torch

from frontends.torch_compat import call_function_apply


def _is_users(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return not (module == "torch" or module.startswith(("torch.", "functorch.")))


def _where(cls: type) -> str:
    try:
        return f" ({inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]})"
    except (OSError, TypeError):
        return ""


@contextlib.contextmanager
def refuse_custom_functions(error: type[Exception]) -> Iterator[None]:
    """Within the block, applying a user-defined autograd Function raises ``error`` with one line
    naming the class and what to do."""
    original = torch.autograd.Function.__dict__["apply"]

    def apply(cls, *args, **kwargs):
        if _is_users(cls):
            raise error(
                f"the forward applies the custom autograd Function {cls.__qualname__}{_where(cls)}, "
                "whose backward the captured graph cannot keep (torch.export traces its forward "
                "only, so the gradient would silently be the forward's derivative): plan this model "
                "with torch.compile(model, backend=remat_backend(...)), which keeps custom Functions")
        return call_function_apply(original, cls, *args, **kwargs)

    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.autograd.Function.apply = original  # type: ignore[method-assign]
