"""Every private torch API that remat-opt uses, in one place, with the versions it was checked on.

torch's private modules (AOTAutograd's stages and descriptors, FakeTensor, the partitioner's
helpers, dispatch internals, Inductor) change between releases without notice. Each name the
frontends need from them is imported or adapted here, with a line saying what it guards and on
which versions it was checked; the rest of the package imports these names from this module
only. When a release breaks one, the fix lands here.

Checked: torch 2.13.0 and 2.14.1 (CPU builds; the whole suite in CI) and 2.11.0+cu130 (CUDA,
an H200; the suite from source). `TESTED_TORCH` names them; importing ``frontends`` on another
release prints one line saying so (`warn_if_untested_torch`).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch._functorch._aot_autograd import descriptors as aot_descriptors  # noqa: F401
from torch._functorch.aot_autograd import (  # noqa: F401
    aot_compile_joint_with_descriptors,
    aot_export_joint_with_descriptors,
)
from torch._guards import detect_fake_mode  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily  # noqa: F401

# --- what is imported above, and on which versions it was checked ---------------------------------
# aot_export_joint_with_descriptors / aot_compile_joint_with_descriptors: the joint graph and its
#   compiled pair (capture, remat_module, joint_stitch); 2.11.0, 2.13.0, 2.14.1.
# aot_descriptors: the AOTInput/AOTOutput descriptor classes naming joint placeholders and outputs
#   (ParamAOTInput, TangentAOTInput, ...); 2.11.0, 2.13.0, 2.14.1.
# detect_fake_mode: the fake mode a graph's meta values live in; 2.11.0, 2.13.0, 2.14.1.
# FakeTensor / FakeTensorMode / unset_fake_temporarily: value metadata on joint nodes;
#   2.11.0, 2.13.0, 2.14.1. From 2.14 AOTAutograd counts saved values by FakeTensor type, so every
#   meta value remat-opt adds to a joint must be made in the joint's fake mode (`fake_like_mode`).

TESTED_TORCH = ("2.11", "2.13", "2.14")
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
