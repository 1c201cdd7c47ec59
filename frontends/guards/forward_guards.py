"""What a forward does in Python, outside its tensors: refused at capture, or kept on request.

`frontends.capture.step` traces the forward once (torch.export, non-strict): tensor ops go into the
graph and replay at every step of the remat module; everything else the forward does in Python
runs once, at trace time, and never again. Left alone, the remat module then differs from the
model:

- a draw from Python's ``random`` or from ``numpy.random`` becomes a constant of the graph;
- a plain Python value the forward changes on any submodule (``self.calls += 1``) or among the
  module-level variables of its source file stays as it was (torch.export even puts submodule
  attributes back after tracing);
- module hooks (forward, forward pre-, backward, backward pre-, and the global ones) fire once,
  at capture; a tensor hook registered in forward (``y.register_hook``) never fires, so what it
  does to the gradient is lost;
- ``torch.manual_seed`` in forward, a reseeded ``torch.Generator``, or one made in forward
  seeds only the trace (a generator made outside forward and passed to random ops is replayed:
  the graph draws from that same generator at every step).

`forward_guards` wraps the trace. It refuses hooks before tracing; it records what the forward
changed and restores it afterwards (capture leaves the caller's module attributes, variables and
RNG states as it found them); then it raises one line naming each thing (the module path and
attribute, the hook, the call site) and what to do: train with ``torch.compile`` and
``remat_backend`` (dynamo keeps Python semantics), or pass ``python_side_effects="ignore"`` to
plan anyway with the values of capture time. docs/limits.md "What the graph runtime preserves" is the
user's summary.

Not detected: Python RNGs other than the global ones (``random.Random()``,
``numpy.random.default_rng()``), state held outside the model's modules and the module-level
variables of the files that define their ``forward``, values that are not plain (objects, tensors
assigned as attributes, which torch.export handles itself), ``print`` and logging (they run once,
at capture; documented, not refused). Hooks whose function is defined inside torch
(the ``ModuleTracker`` that ``FlopCounterMode`` uses) are not refused; ``fully_shard`` units are
refused before this runs (`frontends.guards.sharding`).
"""


from __future__ import annotations

import contextlib
import contextvars
import copy
import io
import operator
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from frontends.capture.fakify import has_meta_tensors
from frontends.guards.forward_hooks import hook_name, hook_problems, hook_tables, recording_tensor_hooks
from frontends.guards.forward_state import (
    TensorRef,
    attribute_differences,
    attribute_snapshot,
    forward_globals,
    model_path,
    original_value,
    plain_globals,
    same_value,
    shown,
)
from frontends.guards.rng_states import RngStates, generators_in, locate_rng_calls
from frontends.guards.user_code import stack_location
from frontends.torch_compat import generator_key, tree_flatten

POLICIES = ("error", "ignore")
"""``python_side_effects``: ``error`` (default) refuses, ``ignore`` plans with capture's values."""

_AMBIENT_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "remat_opt_python_side_effects", default="error")


def resolve_policy(python_side_effects: str | None) -> str:
    """The policy to apply: the one given, else the ambient one (`python_side_effects_policy`)."""
    policy = _AMBIENT_POLICY.get() if python_side_effects is None else python_side_effects
    if policy not in POLICIES:
        raise ValueError(f"python_side_effects={python_side_effects!r}: expected one of "
                         + ", ".join(repr(p) for p in POLICIES))
    return policy


@contextlib.contextmanager
def python_side_effects_policy(python_side_effects: str) -> Iterator[None]:
    """Within the block, captures that are not given ``python_side_effects`` use this policy
    (the CLI sets it once, for the paths that reach capture without the keyword: what-if
    reports, ``--meta``, per-rank plans)."""
    token = _AMBIENT_POLICY.set(resolve_policy(python_side_effects))
    try:
        yield
    finally:
        _AMBIENT_POLICY.reset(token)


def _export_again(model: torch.nn.Module, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """The trace once more, silent (the forward's prints were seen at the first one)."""
    def trace():
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.export.export(model, tuple(args), dict(kwargs), strict=False)
    return trace


_RNG_PROBLEMS = {
    "random": "Python's random module is called in forward{at}: the value drawn at capture is frozen",
    "numpy": "numpy.random is called in forward{at}: the value drawn at capture is frozen",
    "torch": "torch's global RNG is seeded in forward (torch.manual_seed{at}): only the trace is seeded",
}


# ------------------------------------------------------------------------------------- guard
class ForwardGuard:
    """What `forward_guards` saw; ``check_graph`` adds what the traced graph shows."""

    def __init__(self, model: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        self.model, self.args, self.kwargs = model, args, kwargs
        self.problems: list[str] = []
        self.tensor_hooks: list[str] = []
        self.attributes = attribute_snapshot(model, tensors=True)
        self.namespaces = [(ns, plain_globals(ns)) for ns in forward_globals(model)]
        self.hook_keys = {id(table): set(table) for _, table, _ in hook_tables(model)}
        self.generators = self._visible_generators()
        self.rng = RngStates({key: (name, g) for key, (name, g) in self.generators.items()
                               if name != "default"})
        self.at_end_of_forward: list[str] | None = None

    def _visible_generators(self) -> dict[int, tuple[str, torch.Generator]]:
        """The generators the user can reach: torch's default ones, the model's attributes,
        the inputs, the forwards' module-level variables; keyed by the C generator they wrap."""
        found = {generator_key(torch.default_generator): ("default", torch.default_generator)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            found.update((generator_key(g), ("default", g)) for g in torch.cuda.default_generators)
        for g in generators_in(tree_flatten((self.args, self.kwargs))[0]):
            found.setdefault(generator_key(g), ("an input generator", g))
        for path, module in self.model.named_modules():
            for name, value in module.__dict__.items():
                for g in generators_in([value]):
                    found.setdefault(generator_key(g), (f"{model_path(path)}.{name}", g))
        for namespace, _ in self.namespaces:
            for name, value in namespace.items():
                for g in generators_in([value]):
                    found.setdefault(generator_key(g), (f"{namespace.get('__name__', '?')}.{name}", g))
        return found

    def check_graph(self, gm: torch.fx.GraphModule) -> None:
        """Generators the graph draws from that the user cannot reach (made in forward)."""
        if has_meta_tensors(self.model, self.args, self.kwargs):
            return  # planned on a copy (see fakify), never run
        for node in gm.graph.find_nodes(op="get_attr"):
            try:
                value = operator.attrgetter(str(node.target))(gm)
            except AttributeError:
                continue
            if isinstance(value, torch.Generator) and generator_key(value) not in self.generators:
                ops = ", ".join(sorted({str(u.target) for u in node.users})) or "a random op"
                at = stack_location(node)
                self.problems.append(
                    f"a torch.Generator made in forward drives {ops}{f' (at {at})' if at else ''}: its "
                    "state is frozen at capture (make it once, outside forward)")

    def restore(self) -> tuple[list[str], list[str]]:
        """Put back what the forward changed; return what it changed (phrases) and which RNG
        states it changed ('random', 'numpy', 'torch' or a generator's name)."""
        found = list(self.at_end_of_forward or [])
        now = attribute_snapshot(self.model, tensors=True)
        found += [d for d in attribute_differences(self.attributes, now) if d not in found]
        modules = dict(self.model.named_modules())
        for key in dict.fromkeys([*self.attributes, *now]):
            module = modules.get(key[0])
            if module is None:
                continue
            if key in self.attributes:
                if key not in now or not same_value(now[key], self.attributes[key]):
                    module.__dict__[key[1]] = original_value(self.attributes[key])
            else:  # set during capture (a tensor set then holds a FakeTensor)
                del module.__dict__[key[1]]
        for namespace, before in self.namespaces:
            now_globals = plain_globals(namespace)
            module_name = namespace.get("__name__", "?")
            for name in dict.fromkeys([*before, *now_globals]):
                if name not in now_globals:
                    found.append(f"module-level variable {module_name}.{name} was removed")
                    namespace[name] = copy.deepcopy(before[name])
                elif name not in before:
                    found.append(f"module-level variable {module_name}.{name} was set to "
                                 f"{shown(now_globals[name])}")
                    del namespace[name]
                elif not same_value(before[name], now_globals[name]):
                    found.append(f"module-level variable {module_name}.{name} changed "
                                 f"{shown(before[name])} -> {shown(now_globals[name])}")
                    namespace[name] = copy.deepcopy(before[name])
        for kind, table, where in hook_tables(self.model):
            for key in [k for k in table if k not in self.hook_keys.get(id(table), set())]:
                found.append(f"forward registers a {kind} {hook_name(table[key])} {where}")
                del table[key]
        rng = self.rng.changed()
        self.rng.restore()
        return found, rng


def _message(model: torch.nn.Module, problems: list[str]) -> str:
    """The one-line refusal: what the forward does, and the two ways on."""
    shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
    return (f"{type(model).__name__}'s forward does in Python what the captured graph cannot "
            f"replay: {shown}. Train it with torch.compile(model, backend=remat_backend(...)), "
            "which keeps Python semantics, or pass python_side_effects=\"ignore\" (CLI: "
            "--python-side-effects ignore) to plan with the values of capture time")


def _observer(guard: ForwardGuard) -> Callable:
    """The root module's forward hook that reads the attributes before torch.export puts them
    back (a plain function: a meta model's fakified deep copy shares it, see fakify)."""
    def observe(module: torch.nn.Module, _args: Any, _output: Any) -> None:
        if guard.at_end_of_forward is None:
            tensors = module is guard.model  # a fakified copy's tensors are other objects
            before = {k: v for k, v in guard.attributes.items() if tensors or not isinstance(v, TensorRef)}
            guard.at_end_of_forward = attribute_differences(before, attribute_snapshot(module, tensors))
    return observe


def _rng_phrase(kind: str, located: dict[str, str]) -> str:
    if kind == "torch":
        return _RNG_PROBLEMS[kind].format(at=f", at {located[kind]}" if kind in located else "")
    at = f" (at {located[kind]})" if kind in located else ""
    if kind in _RNG_PROBLEMS:
        return _RNG_PROBLEMS[kind].format(at=at)
    return f"generator {kind} is reseeded in forward{at}: only the trace is seeded"


@contextlib.contextmanager
def forward_guards(model: torch.nn.Module, args: tuple, kwargs: dict,
                   python_side_effects: str | None = None,
                   error: type[Exception] = RuntimeError) -> Iterator[ForwardGuard]:
    """Around the trace of ``model(*args, **kwargs)``: refuse (policy ``error``, the default) or
    allow (``ignore``) what the forward does in Python that the graph will not replay, and
    restore what it changed either way. ``error`` is the exception type raised (capture passes
    its `CaptureError` subclass: this module imports no capture code, so capture can import it).
    """
    policy = resolve_policy(python_side_effects)
    hooks = hook_problems(model) if policy == "error" else []
    if hooks:  # refused before tracing: nothing to undo
        raise error(_message(model, [f"{h} fires at capture only" for h in hooks]))
    guard = ForwardGuard(model, tuple(args), dict(kwargs))
    observer = model.register_forward_hook(_observer(guard))
    traced = False
    try:
        with recording_tensor_hooks(guard.tensor_hooks):
            yield guard
        traced = True
    finally:
        observer.remove()
        changes, rng = guard.restore()
    if not traced or policy == "ignore":
        return
    located: dict[str, str] = {}
    if rng:  # the error path: find the user's line
        try:
            names = {key: name for key, (name, _) in guard.generators.items() if name != "default"}
            located = locate_rng_calls(_export_again(model, guard.args, guard.kwargs), names)
        finally:
            guard.restore()
    problems = ([_rng_phrase(kind, located) for kind in rng]
                + [f"{c} during capture" for c in changes] + guard.tensor_hooks + guard.problems)
    if problems:
        raise error(_message(model, problems))
