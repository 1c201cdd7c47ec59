"""The random number generators a forward may draw from or reseed in Python: Python's and
numpy's global ones, torch's, and the generators the model can reach. Their states around a
capture, and (on the error path only) the user's file:line of the first call into each."""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable
from typing import Any

import torch

from frontends.guards.user_code import first_user_frame
from frontends.torch_compat import generator_key


def numpy_random():
    numpy = sys.modules.get("numpy")  # not imported by anyone: the forward cannot have used it
    return getattr(numpy, "random", None) if numpy is not None else None


def _numpy_same(a: Any, b: Any) -> bool:
    np_random = numpy_random()
    if a is None or b is None or np_random is None:
        return a is b
    return len(a) == len(b) and all(
        bool((x == y).all()) if hasattr(x, "shape") else x == y for x, y in zip(a, b))


def generators_in(values: list[Any]) -> list[torch.Generator]:
    found = []
    for value in values:
        if isinstance(value, torch.Generator):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, torch.Generator)]
        elif isinstance(value, dict):
            found += [v for v in value.values() if isinstance(v, torch.Generator)]
    return found


class RngStates:
    """Python's, numpy's and torch's global RNG states, and those of the model's generators."""

    def __init__(self, generators: dict[int, tuple[str, torch.Generator]]) -> None:
        np_random = numpy_random()
        self.python = random.getstate()
        self.numpy = np_random.get_state() if np_random is not None else None
        self.torch = torch.random.get_rng_state()
        self.cuda = (torch.cuda.get_rng_state_all()
                     if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self.generators = {key: (name, g, g.get_state()) for key, (name, g) in generators.items()}

    def changed(self) -> list[str]:
        """Which states differ from now: 'random', 'numpy', 'torch', or a generator's name."""
        now = RngStates({key: (name, g) for key, (name, g, _) in self.generators.items()})
        found = []
        if now.python != self.python:
            found.append("random")
        if not _numpy_same(now.numpy, self.numpy):
            found.append("numpy")
        if not torch.equal(now.torch, self.torch):
            found.append("torch")
        found += [name for key, (name, _, state) in self.generators.items()
                  if not torch.equal(now.generators[key][2], state)]
        return found

    def restore(self) -> None:
        random.setstate(self.python)
        np_random = numpy_random()
        if self.numpy is not None and np_random is not None:
            np_random.set_state(self.numpy)
        torch.random.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        for _, g, state in self.generators.values():
            g.set_state(state)


def locate_rng_calls(trace: Callable[[], Any], generators: dict[int, str]) -> dict[str, str]:
    """'random' / 'numpy' / 'torch' / a generator's name -> the user's file:line of the first
    call into that RNG while ``trace`` runs (``sys.setprofile``, and numpy's module functions
    wrapped, which profiling does not see: slow and intrusive, for the error path only)."""
    np_random = numpy_random()
    np_global = getattr(getattr(np_random, "mtrand", None), "_rand", None)
    torch_seeding = ("manual_seed", "seed", "set_rng_state")
    found: dict[str, str] = {}

    def record(kind: str, frame) -> None:
        if kind not in found:
            where = first_user_frame(frame)
            if where is not None:
                found[kind] = where

    def profile(frame, event, arg):
        if event == "call":
            filename, name = frame.f_code.co_filename, frame.f_code.co_name
            if filename == random.__file__:
                record("random", frame.f_back)
            elif filename == torch.random.__file__ and name in torch_seeding:
                record("torch", frame.f_back)
        elif event == "c_call":
            owner = getattr(arg, "__self__", None)
            if owner is getattr(random, "_inst", None):
                record("random", frame)
            elif owner is torch.default_generator:
                record("torch", frame)
            elif isinstance(owner, torch.Generator) and generator_key(owner) in generators:
                record(generators[generator_key(owner)], frame)

    def numpy_recorder(function: Callable) -> Callable:
        @functools.wraps(function)
        def call(*args, **kwargs):
            record("numpy", sys._getframe(1))
            return function(*args, **kwargs)
        return call

    wrapped = {name: f for name, f in vars(np_random).items()
               if np_global is not None and getattr(f, "__self__", None) is np_global} if np_random else {}
    previous = sys.getprofile()
    for name, function in wrapped.items():
        setattr(np_random, name, numpy_recorder(function))
    sys.setprofile(profile)
    try:
        trace()
    except Exception:  # best effort: the message then names no line
        pass
    finally:
        sys.setprofile(previous)
        for name, function in wrapped.items():
            setattr(np_random, name, function)
    return found
