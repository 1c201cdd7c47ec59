"""What a forward does in Python, outside its tensors: refused at capture, or kept on request.

`frontends.capture` traces the forward once (torch.export, non-strict): tensor ops go into the
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
plan anyway with the values of capture time. README "What the graph runtime preserves" is the
user's summary.

Not detected: Python RNGs other than the global ones (``random.Random()``,
``numpy.random.default_rng()``), state held outside the model's modules and the module-level
variables of the files that define their ``forward``, values that are not plain (objects, tensors
assigned as attributes, which torch.export handles itself), ``print`` and logging (they run once,
at capture; documented, not refused). Hooks whose function is defined inside torch
(the ``ModuleTracker`` that ``FlopCounterMode`` uses) are not refused; ``fully_shard`` units are
refused before this runs (`frontends.sharding`).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import io
import operator
import os
import random
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.modules import module as nn_module
from torch.utils._pytree import tree_flatten

from frontends.fakify import has_meta_tensors

POLICIES = ("error", "ignore")
"""``python_side_effects``: ``error`` (default) refuses, ``ignore`` plans with capture's values."""

_AMBIENT_POLICY: contextvars.ContextVar[str] = contextvars.ContextVar(
    "remat_opt_python_side_effects", default="error")

_TORCH_OWN_ATTRIBUTES = frozenset(torch.nn.Module().__dict__)
"""What ``nn.Module.__init__`` sets (hooks, parameters, ``training``): torch's bookkeeping."""
_PLAIN_TYPES = (type(None), bool, int, float, complex, str, bytes,
                torch.dtype, torch.device, torch.layout, torch.memory_format)
_MAX_ITEMS = 10_000
_MODULE_HOOKS = (("_forward_pre_hooks", "forward pre-hook"), ("_forward_hooks", "forward hook"),
                 ("_backward_pre_hooks", "backward pre-hook"), ("_backward_hooks", "backward hook"))
_GLOBAL_HOOKS = (("_global_forward_pre_hooks", "global forward pre-hook"),
                 ("_global_forward_hooks", "global forward hook"),
                 ("_global_backward_pre_hooks", "global backward pre-hook"),
                 ("_global_backward_hooks", "global backward hook"))
_TENSOR_HOOKS = ("register_hook", "register_post_accumulate_grad_hook")
_PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER = (sysconfig.get_paths()["stdlib"] + os.sep,
             *(os.path.join(_PROJECT, pkg) + os.sep for pkg in ("frontends", "optimizer", "solvers")))


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


# ------------------------------------------------------------------------------------ values
def is_user_file(filename: str) -> bool:
    """Source the user wrote: not torch, not an installed package, not the standard library,
    not remat-opt's own packages."""
    path = os.path.abspath(filename)
    return not (filename.startswith("<") or "site-packages" in path or "dist-packages" in path
                or f"{os.sep}torch{os.sep}" in path or path.startswith(_NOT_USER))


def _short_path(filename: str) -> str:
    path = os.path.abspath(filename)
    here = os.getcwd() + os.sep
    return path[len(here):] if path.startswith(here) else path


def _is_plain(value: Any, depth: int = 0) -> bool:
    """Numbers, strings, flags, dtypes and devices, and small containers of them."""
    if isinstance(value, _PLAIN_TYPES):
        return True
    if depth >= 4 or not isinstance(value, (tuple, list, set, frozenset, dict)) or len(value) > _MAX_ITEMS:
        return False
    items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    return all(_is_plain(v, depth + 1) for v in items)


class _TensorRef:
    """A tensor attribute, compared by identity (what torch.export restores, but only warns of)."""

    __slots__ = ("tensor",)
    __hash__ = None

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _TensorRef) and other.tensor is self.tensor

    def __repr__(self) -> str:
        return "a tensor"


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, _TensorRef) or isinstance(b, _TensorRef):
        return a == b
    try:
        if a == b:
            return True
    except Exception:  # a value whose == raises counts as changed only if its text differs
        pass
    return type(a) is type(b) and repr(a) == repr(b)  # nan == nan


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _where(path: str) -> str:
    return f"model.{path}" if path else "model"


def _attributes(model: torch.nn.Module, tensors: bool) -> dict[tuple[str, str], Any]:
    found: dict[tuple[str, str], Any] = {}
    for path, module in model.named_modules():
        for name, value in module.__dict__.items():
            if name in _TORCH_OWN_ATTRIBUTES:
                continue
            if _is_plain(value):
                found[(path, name)] = copy.deepcopy(value)
            elif tensors and isinstance(value, torch.Tensor):
                found[(path, name)] = _TensorRef(value)
    return found


def _original(value: Any) -> Any:
    return value.tensor if isinstance(value, _TensorRef) else copy.deepcopy(value)


def plain_attributes(model: torch.nn.Module) -> dict[tuple[str, str], Any]:
    """(module path, attribute) -> a copy of every plain value (`_is_plain`) the model's modules
    hold outside torch's own bookkeeping: what a forward may change in Python."""
    return _attributes(model, tensors=False)


def differing_attributes(a: dict[tuple[str, str], Any], b: dict[tuple[str, str], Any]
                         ) -> list[tuple[str, str | None, str | None]]:
    """(``model.path.attr``, value in ``a``, value in ``b``) shown short, None where absent, for
    each plain attribute that differs between two `plain_attributes` snapshots."""
    found = []
    for key in dict.fromkeys([*a, *b]):
        if key in a and key in b and _same(a[key], b[key]):
            continue
        found.append((f"{_where(key[0])}.{key[1]}", _shown(a[key]) if key in a else None,
                      _shown(b[key]) if key in b else None))
    return found


def attribute_differences(before: dict[tuple[str, str], Any], after: dict[tuple[str, str], Any]) -> list[str]:
    """One phrase per plain attribute that differs between two `plain_attributes` snapshots."""
    return [f"{name} was removed (was {old})" if new is None
            else f"{name} was set to {new}" if old is None
            else f"{name} changed {old} -> {new}"
            for name, old, new in differing_attributes(before, after)]


def _forward_globals(model: torch.nn.Module) -> list[dict]:
    """The module-level variables (globals) of the user files that define the model's forwards."""
    found: dict[int, dict] = {}
    for module in model.modules():
        code = getattr(getattr(type(module), "forward", None), "__code__", None)
        if code is not None and is_user_file(code.co_filename):
            namespace = type(module).forward.__globals__
            found.setdefault(id(namespace), namespace)
    return list(found.values())


def _plain_globals(namespace: dict) -> dict[str, Any]:
    return {name: copy.deepcopy(value) for name, value in namespace.items()
            if not name.startswith("__") and _is_plain(value)}


# ------------------------------------------------------------------------------------- hooks
def _hook_function(hook: Any) -> Any:
    while isinstance(hook, functools.partial):
        hook = hook.func
    return getattr(hook, "__func__", hook)


def _hook_name(hook: Any) -> str:
    fn = _hook_function(hook)
    return getattr(fn, "__name__", None) or type(fn).__name__


def _is_torch_hook(hook: Any) -> bool:
    fn = _hook_function(hook)
    owner = getattr(fn, "__module__", None) or type(fn).__module__ or ""
    return owner == "torch" or owner.startswith("torch.")


def _hook_tables(model: torch.nn.Module) -> Iterator[tuple[str, dict, str]]:
    """(kind, hook dict, where) for every module hook table of the model, then the global ones."""
    for path, module in model.named_modules():
        for attr, kind in _MODULE_HOOKS:
            table = getattr(module, attr, None)
            if isinstance(table, dict):
                if attr == "_backward_hooks" and table and module._is_full_backward_hook is False:
                    kind = "backward hook (register_backward_hook)"
                yield kind, table, f"on {_where(path)}"
    for attr, kind in _GLOBAL_HOOKS:
        table = getattr(nn_module, attr, None)
        if isinstance(table, dict):
            yield kind, table, "(registered for every module)"


def hook_problems(model: torch.nn.Module) -> list[str]:
    """One phrase per module hook (of any submodule) or global module hook the captured graph
    would not replay: each fires once, at capture."""
    return [f"{kind} {_hook_name(hook)} {where}" for kind, table, where in _hook_tables(model)
            for hook in table.values() if not _is_torch_hook(hook)]


@contextlib.contextmanager
def _recording_tensor_hooks(found: list[str]) -> Iterator[None]:
    """``Tensor.register_hook`` (and the post-accumulate one) called by user code meanwhile."""
    originals = {name: getattr(torch.Tensor, name) for name in _TENSOR_HOOKS if hasattr(torch.Tensor, name)}

    def recording(name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def register(self, hook, *args, **kwargs):
            caller = sys._getframe(1)
            if is_user_file(caller.f_code.co_filename):
                found.append(f"Tensor.{name}({_hook_name(hook)}) in forward "
                             f"(at {_short_path(caller.f_code.co_filename)}:{caller.f_lineno}) never fires")
            return original(self, hook, *args, **kwargs)
        return register

    for name, original in originals.items():
        setattr(torch.Tensor, name, recording(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


# -------------------------------------------------------------------------------------- RNGs
def _numpy_random():
    numpy = sys.modules.get("numpy")  # not imported by anyone: the forward cannot have used it
    return getattr(numpy, "random", None) if numpy is not None else None


def _numpy_same(a: Any, b: Any) -> bool:
    np_random = _numpy_random()
    if a is None or b is None or np_random is None:
        return a is b
    return len(a) == len(b) and all(
        bool((x == y).all()) if hasattr(x, "shape") else x == y for x, y in zip(a, b))


def _generators_in(values: list[Any]) -> list[torch.Generator]:
    found = []
    for value in values:
        if isinstance(value, torch.Generator):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found += [v for v in value if isinstance(v, torch.Generator)]
        elif isinstance(value, dict):
            found += [v for v in value.values() if isinstance(v, torch.Generator)]
    return found


class _RngStates:
    """Python's, numpy's and torch's global RNG states, and those of the model's generators."""

    def __init__(self, generators: dict[int, tuple[str, torch.Generator]]) -> None:
        np_random = _numpy_random()
        self.python = random.getstate()
        self.numpy = np_random.get_state() if np_random is not None else None
        self.torch = torch.random.get_rng_state()
        self.cuda = (torch.cuda.get_rng_state_all()
                     if torch.cuda.is_available() and torch.cuda.is_initialized() else None)
        self.generators = {key: (name, g, g.get_state()) for key, (name, g) in generators.items()}

    def changed(self) -> list[str]:
        """Which states differ from now: 'random', 'numpy', 'torch', or a generator's name."""
        now = _RngStates({key: (name, g) for key, (name, g, _) in self.generators.items()})
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
        np_random = _numpy_random()
        if self.numpy is not None and np_random is not None:
            np_random.set_state(self.numpy)
        torch.random.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)
        for _, g, state in self.generators.values():
            g.set_state(state)


def _first_user_frame(frame) -> str | None:
    while frame is not None and not is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    return None if frame is None else f"{_short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def _locate_rng_calls(trace: Callable[[], Any], generators: dict[int, str]) -> dict[str, str]:
    """'random' / 'numpy' / 'torch' / a generator's name -> the user's file:line of the first
    call into that RNG while ``trace`` runs (``sys.setprofile``, and numpy's module functions
    wrapped, which profiling does not see: slow and intrusive, for the error path only)."""
    np_random = _numpy_random()
    np_global = getattr(getattr(np_random, "mtrand", None), "_rand", None)
    torch_seeding = ("manual_seed", "seed", "set_rng_state")
    found: dict[str, str] = {}

    def record(kind: str, frame) -> None:
        if kind not in found:
            where = _first_user_frame(frame)
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
            elif isinstance(owner, torch.Generator) and owner._cdata in generators:
                record(generators[owner._cdata], frame)

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


def _export_again(model: torch.nn.Module, args: tuple, kwargs: dict) -> Callable[[], Any]:
    """The trace once more, silent (the forward's prints were seen at the first one)."""
    def trace():
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()), \
                contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.export.export(model, tuple(args), dict(kwargs), strict=False)
    return trace


def _stack_location(node: torch.fx.Node) -> str | None:
    """The user's file:line in an fx node's recorded stack trace."""
    for user in (node, *node.users):
        for line in reversed((user.meta.get("stack_trace") or "").splitlines()):
            line = line.strip()
            if line.startswith('File "') and '", line ' in line:
                filename, rest = line[len('File "'):].split('", line ', 1)
                if is_user_file(filename):
                    return f"{_short_path(filename)}:{rest.split(',')[0]}"
    return None


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
        self.attributes = _attributes(model, tensors=True)
        self.namespaces = [(ns, _plain_globals(ns)) for ns in _forward_globals(model)]
        self.hook_keys = {id(table): set(table) for _, table, _ in _hook_tables(model)}
        self.generators = self._visible_generators()
        self.rng = _RngStates({key: (name, g) for key, (name, g) in self.generators.items()
                               if name != "default"})
        self.at_end_of_forward: list[str] | None = None

    def _visible_generators(self) -> dict[int, tuple[str, torch.Generator]]:
        """The generators the user can reach: torch's default ones, the model's attributes,
        the inputs, the forwards' module-level variables; keyed by the C generator they wrap."""
        found = {torch.default_generator._cdata: ("default", torch.default_generator)}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            found.update((g._cdata, ("default", g)) for g in torch.cuda.default_generators)
        for g in _generators_in(tree_flatten((self.args, self.kwargs))[0]):
            found.setdefault(g._cdata, ("an input generator", g))
        for path, module in self.model.named_modules():
            for name, value in module.__dict__.items():
                for g in _generators_in([value]):
                    found.setdefault(g._cdata, (f"{_where(path)}.{name}", g))
        for namespace, _ in self.namespaces:
            for name, value in namespace.items():
                for g in _generators_in([value]):
                    found.setdefault(g._cdata, (f"{namespace.get('__name__', '?')}.{name}", g))
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
            if isinstance(value, torch.Generator) and value._cdata not in self.generators:
                ops = ", ".join(sorted({str(u.target) for u in node.users})) or "a random op"
                at = _stack_location(node)
                self.problems.append(
                    f"a torch.Generator made in forward drives {ops}{f' (at {at})' if at else ''}: its "
                    "state is frozen at capture (make it once, outside forward)")

    def restore(self) -> tuple[list[str], list[str]]:
        """Put back what the forward changed; return what it changed (phrases) and which RNG
        states it changed ('random', 'numpy', 'torch' or a generator's name)."""
        found = list(self.at_end_of_forward or [])
        now = _attributes(self.model, tensors=True)
        found += [d for d in attribute_differences(self.attributes, now) if d not in found]
        modules = dict(self.model.named_modules())
        for key in dict.fromkeys([*self.attributes, *now]):
            module = modules.get(key[0])
            if module is None:
                continue
            if key in self.attributes:
                if key not in now or not _same(now[key], self.attributes[key]):
                    module.__dict__[key[1]] = _original(self.attributes[key])
            else:  # set during capture (a tensor set then holds a FakeTensor)
                del module.__dict__[key[1]]
        for namespace, before in self.namespaces:
            now_globals = _plain_globals(namespace)
            module_name = namespace.get("__name__", "?")
            for name in dict.fromkeys([*before, *now_globals]):
                if name not in now_globals:
                    found.append(f"module-level variable {module_name}.{name} was removed")
                    namespace[name] = copy.deepcopy(before[name])
                elif name not in before:
                    found.append(f"module-level variable {module_name}.{name} was set to "
                                 f"{_shown(now_globals[name])}")
                    del namespace[name]
                elif not _same(before[name], now_globals[name]):
                    found.append(f"module-level variable {module_name}.{name} changed "
                                 f"{_shown(before[name])} -> {_shown(now_globals[name])}")
                    namespace[name] = copy.deepcopy(before[name])
        for kind, table, where in _hook_tables(self.model):
            for key in [k for k in table if k not in self.hook_keys.get(id(table), set())]:
                found.append(f"forward registers a {kind} {_hook_name(table[key])} {where}")
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
            before = {k: v for k, v in guard.attributes.items() if tensors or not isinstance(v, _TensorRef)}
            guard.at_end_of_forward = attribute_differences(before, _attributes(module, tensors))
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
    if policy == "error" and hook_problems(model):  # refused before tracing: nothing to undo
        raise error(_message(model, [f"{h} fires at capture only" for h in hook_problems(model)]))
    guard = ForwardGuard(model, tuple(args), dict(kwargs))
    observer = model.register_forward_hook(_observer(guard))
    traced = False
    try:
        with _recording_tensor_hooks(guard.tensor_hooks):
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
            located = _locate_rng_calls(_export_again(model, guard.args, guard.kwargs), names)
        finally:
            guard.restore()
    problems = ([_rng_phrase(kind, located) for kind in rng]
                + [f"{c} during capture" for c in changes] + guard.tensor_hooks + guard.problems)
    if problems:
        raise error(_message(model, problems))
