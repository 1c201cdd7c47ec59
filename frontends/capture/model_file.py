"""Load a user's model file: a Python file defining ``get_model()`` and ``get_inputs()``.

The CLI takes models as files, not import paths, so users need no package or ``sys.path`` set-up.
The convention (see README and ``examples/``):

* ``get_model() -> torch.nn.Module`` builds the model (with deterministic weights, ideally);
* ``get_inputs() -> tuple`` returns the positional example inputs of one training step; the
  model's first output (or only output) is the scalar loss.

Every mistake becomes one :class:`ModelFileError` line that names the file and says what to fix,
with the line number in the user's file when their code raised.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = ["ModelFileError", "load_model_file"]

_T = TypeVar("_T")
_counter = itertools.count()


class ModelFileError(Exception):
    """A model file that cannot be used; the message says what to change."""


def load_model_file(path: str, *, meta: bool = False) -> tuple[nn.Module, tuple[Any, ...]]:
    """Import the file at ``path`` and return ``(get_model(), get_inputs())``.

    ``meta=True`` builds the model under ``torch.device("meta")`` (shapes only: nothing is
    allocated, tied weights stay tied) and moves the inputs to the meta device, for planning
    a model larger than this machine's memory.

    The file runs as a fresh module with its own directory first on ``sys.path`` (so it may import
    its neighbours) while it is imported and while its two functions run. A single tensor from
    ``get_inputs()`` is wrapped into a 1-tuple and a list becomes a tuple.
    """
    shown = os.fspath(path)
    full_path = os.path.abspath(shown)
    if not os.path.isfile(full_path):
        raise ModelFileError(f"model file {shown!r} not found")

    module = _import_file(full_path, shown)
    get_model = getattr(module, "get_model", None)
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_model) or not callable(get_inputs):
        raise ModelFileError(f"{shown!r} must define get_model() and get_inputs(); see README")

    with _directory_on_sys_path(full_path):
        with torch.device("meta") if meta else contextlib.nullcontext():
            model = _call_user(get_model, "get_model()", full_path, shown)
        inputs = _call_user(get_inputs, "get_inputs()", full_path, shown)

    if not isinstance(model, nn.Module):
        raise ModelFileError(
            f"get_model() in {shown!r} must return a torch.nn.Module, "
            f"got {type(model).__name__}"
        )
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise ModelFileError(
            f"get_inputs() in {shown!r} must return a tuple of positional example inputs, "
            f"got {type(inputs).__name__}"
        )
    if meta:
        if any(not t.is_meta for t in [*model.parameters(), *model.buffers()]):
            raise ModelFileError(
                f"get_model() in {shown!r} put tensors on a device of its own, so it cannot be "
                "built on the meta device: let it use the default device (no device= argument)")
        inputs = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in inputs]
    return model, tuple(inputs)


def _import_file(full_path: str, shown: str) -> ModuleType:
    """Execute the file as a uniquely named module, registered in ``sys.modules`` while alive."""
    digest = hashlib.sha1(full_path.encode()).hexdigest()[:10]
    name = f"remat_model_file_{digest}_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, full_path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"cannot import {shown!r}: give a Python source file ending in .py")
    module = importlib.util.module_from_spec(spec)
    # Registered so that dataclasses, pickling and typing inside the user's file can find it.
    sys.modules[name] = module
    try:
        with _directory_on_sys_path(full_path):
            spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ModelFileError(
            f"importing {shown!r} failed{_user_line(exc, full_path)}: {_describe(exc)}"
        ) from exc
    return module


def _call_user(func: Callable[[], _T], what: str, full_path: str, shown: str) -> _T:
    try:
        return func()
    except Exception as exc:
        raise ModelFileError(
            f"{what} in {shown!r} raised{_user_line(exc, full_path)}: {_describe(exc)}"
        ) from exc


def _user_line(exc: BaseException, full_path: str) -> str:
    """`` at line N`` for the innermost traceback frame in the user's file, else ``""``."""
    if isinstance(exc, SyntaxError) and exc.filename == full_path and exc.lineno is not None:
        return f" at line {exc.lineno}"
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == full_path:
            line = frame.lineno
    return f" at line {line}" if line is not None else ""


def _describe(exc: BaseException) -> str:
    """``Type: message`` on one line."""
    message = exc.msg if isinstance(exc, SyntaxError) and exc.msg else str(exc)
    message = " ".join(message.split())
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


@contextmanager
def _directory_on_sys_path(full_path: str) -> Iterator[None]:
    directory = os.path.dirname(full_path)
    sys.path.insert(0, directory)
    try:
        yield
    finally:
        try:
            sys.path.remove(directory)
        except ValueError:  # the user's code removed it already
            pass
