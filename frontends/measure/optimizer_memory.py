"""What an optimizer keeps and allocates: measured by running its own ``step()`` on fake tensors.

Why fake: the state and the step's temporaries depend on the optimizer's code path (AdamW's
single-tensor loop allocates ``sqrt`` and ``denom`` per parameter; its foreach path allocates
them for a whole group at once; fused allocates none: ``adamw-fused``), and the only exact account of a path is
to run it. On FakeTensors the step runs every op with no data and no memory, for a model of
any size (parameters on ``meta`` included), and `frontends.measure.memory_tracker` counts the
storages it makes: the first step creates the state, the second shows the transient peak.

An optimizer is given as an instance (its class is rebuilt over fake copies of its parameter
groups, with the same hyperparameters, and the ``foreach`` torch would pick for the real ones:
on CUDA tensors, foreach) or as a description, `OPTIMIZERS`: ``adam``, ``adamw``,
``sgd-momentum`` (momentum 0.9), ``sgd`` (no state), ``adamw-8bit`` (bitsandbytes' 8-bit AdamW,
estimated from its layout: two uint8 states with a float32 scale per 256 values for tensors
of at least 4,096 values, float32 states below that; its fused kernel allocates nothing).
Only state on the parameters' device counts (AdamW's ``step`` counters live on the host for
CUDA parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from frontends.measure.memory_tracker import track_live_memory
from frontends.torch_compat import FakeTensorMode
from solvers.planning.training_loop import OPTIMIZERS, OptimizerMemory, TrainingLoop

_BNB_MIN_8BIT_SIZE = 4096
_BNB_BLOCK = 256


class OptimizerSpecError(ValueError):
    """An optimizer that cannot be measured; the message says what to pass instead."""


def check_optimizer(optimizer: object) -> None:
    """Refuse, before any capture, an optimizer that is neither an instance nor a description."""
    if optimizer is None or isinstance(optimizer, torch.optim.Optimizer):
        return
    if not isinstance(optimizer, str) or optimizer.strip().lower() not in OPTIMIZERS:
        raise OptimizerSpecError(f"optimizer={optimizer!r}: pass a torch.optim.Optimizer instance or one of "
                                 f"{', '.join(map(repr, OPTIMIZERS))}")


def optimizer_memory(optimizer: torch.optim.Optimizer | str, parameters: Sequence[torch.Tensor] = (),
                     device: torch.device | str | None = None) -> OptimizerMemory:
    """State and step bytes of ``optimizer`` (an instance, or a description over ``parameters``,
    the trained ones). ``device``: where the parameters will train, for parameters on ``meta``
    (what-ifs); default, where they are."""
    check_optimizer(optimizer)
    if isinstance(optimizer, str):
        name = optimizer.strip().lower()
        trained = [p for p in parameters if p.requires_grad]
        target = torch.device(device) if device is not None else _device_of(trained)
        if name == "adamw-8bit":
            return _adamw_8bit(trained)
        groups = [{"params": trained}]
        make = _DESCRIPTIONS[name]
        foreach = target.type == "cuda"
        path = "fused" if name.endswith("-fused") else _path(foreach)
        return _measure(lambda fakes: make(fakes, foreach), groups, target, f"{name.removesuffix('-fused')} ({path})")
    groups = [dict(g) for g in optimizer.param_groups]
    every = [p for g in groups for p in g["params"]]
    target = torch.device(device) if device is not None else _device_of(every)
    foreach = groups[0].get("foreach")
    if foreach is None and not groups[0].get("fused"):
        foreach = target.type == "cuda"
    cls = type(optimizer)

    def rebuild(fake_groups: list[dict]) -> torch.optim.Optimizer:
        hyper = [{**g, "foreach": foreach} if "foreach" in g else g for g in fake_groups]
        try:
            return cls(hyper)
        except TypeError as exc:
            raise OptimizerSpecError(f"{cls.__name__} cannot be rebuilt from its param_groups to measure its "
                                     f"memory ({exc}): pass a description instead, one of "
                                     f"{', '.join(map(repr, OPTIMIZERS))}") from None

    path = "fused" if groups[0].get("fused") else _path(bool(foreach))
    return _measure(rebuild, groups, target, f"{cls.__name__} ({path})")


def _path(foreach: bool) -> str:
    return "foreach" if foreach else "single-tensor"


def make_optimizer(name: str, parameters: Sequence[torch.Tensor]) -> torch.optim.Optimizer:
    """The torch optimizer a description stands for (``lr=1e-3``, torch's default path), to run
    a measured loop with; ``adamw-8bit`` needs bitsandbytes, which remat-opt does not install."""
    check_optimizer(name)
    name = name.strip().lower()
    if name not in _DESCRIPTIONS:
        raise OptimizerSpecError(f"{name} needs bitsandbytes to run: its memory is estimated, not measured")
    return _DESCRIPTIONS[name]([{"params": [p for p in parameters if p.requires_grad]}], None)


_DESCRIPTIONS = {
    "adamw": lambda groups, foreach: torch.optim.AdamW(groups, lr=1e-3, foreach=foreach),
    "adamw-fused": lambda groups, foreach: torch.optim.AdamW(groups, lr=1e-3, fused=True),
    "adam": lambda groups, foreach: torch.optim.Adam(groups, lr=1e-3, foreach=foreach),
    "sgd-momentum": lambda groups, foreach: torch.optim.SGD(groups, lr=1e-3, momentum=0.9, foreach=foreach),
    "sgd": lambda groups, foreach: torch.optim.SGD(groups, lr=1e-3, foreach=foreach),
}


def _device_of(parameters: Sequence[torch.Tensor]) -> torch.device:
    if not parameters:
        raise OptimizerSpecError("the optimizer has no parameters that train")
    return parameters[0].device


def _measure(build: Any, groups: list[dict], device: torch.device, name: str) -> OptimizerMemory:
    """Run two steps of ``build(fake groups)`` on fake parameters with fake gradients."""
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        fake_groups = []
        for group in groups:
            fakes = []
            for p in group["params"]:
                fake = torch.nn.Parameter(torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=device),
                                          requires_grad=p.requires_grad)
                if p.requires_grad:
                    fake.grad = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device=device)
                fakes.append(fake)
            fake_groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": fakes})
        opt = build(fake_groups)
        opt.step()  # creates the state
        with track_live_memory(fake=True) as step:
            opt.step()
    state = sum(t.untyped_storage().nbytes() for s in opt.state.values() for t in s.values()
                if isinstance(t, torch.Tensor) and t.device == _fake_device(device))
    return OptimizerMemory(name=name, state_bytes=state, step_bytes=step.result.peak_bytes)


def _fake_device(device: torch.device) -> torch.device:
    """How a fake tensor made for ``device`` reports its device (``cuda`` gains its index)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", 0)
    return device


def _adamw_8bit(parameters: Sequence[torch.Tensor]) -> OptimizerMemory:
    state = 0
    for p in parameters:
        n = p.numel()
        if n >= _BNB_MIN_8BIT_SIZE:
            state += 2 * n + 2 * 4 * math.ceil(n / _BNB_BLOCK)  # two uint8 states, a float32 absmax per block each
        else:
            state += 2 * 4 * n  # float32 exp_avg and exp_avg_sq
    return OptimizerMemory(name="adamw-8bit (estimated)", state_bytes=state, step_bytes=0, measured=False)


def training_loop(parameters: Sequence[torch.Tensor], optimizer: torch.optim.Optimizer | str | None,
                  grad_accumulation: int = 1, device: torch.device | str | None = None) -> TrainingLoop:
    """The `TrainingLoop` a plan counts: ``optimizer`` measured over ``parameters`` (None: not counted)."""
    memory = None if optimizer is None else optimizer_memory(optimizer, parameters, device)
    return TrainingLoop(optimizer=memory, grad_accumulation=grad_accumulation)
