"""Turn a meta-device model and its inputs into FakeTensors on CPU before capture.

A meta-device model (built under ``torch.device("meta")``) allocates nothing, which is what
planning a model larger than this machine's memory needs. Tracing it *on the meta device*
gives a different training graph from a real one: some ops have a meta kernel registered
above their autograd decomposition (``aten::nll_loss``: its backward silently vanishes, so
the logits' gradient path is lost), and device-specific storage rules (CPU ``mse_loss``'s
scalar inside the full buffer, see `frontends.capture.step`) do not apply. Capture of a real CPU
model already runs on FakeTensors (AOTAutograd fakifies its inputs), so swapping every meta
tensor for a CPU FakeTensor of the same shape, strides, dtype and storage sharing makes the
traced graph, and so every size of the RematGraph, identical to a real CPU capture, while
still allocating nothing.

The caller's model is never modified: a deep copy (free on meta) gets the fake tensors,
and ``deepcopy``'s memo keeps tied parameters tied. Note: ``model.to("meta")`` itself unties
weights (torch makes a new Parameter per module), so build meta models under
``torch.device("meta")`` instead, as ``examples/gpt2.py`` does.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from frontends.torch_compat import FakeTensor, FakeTensorMode, tree_flatten, tree_map


def has_meta_tensors(model: torch.nn.Module, args: tuple, kwargs: dict) -> bool:
    """True when any parameter, buffer or input tensor lives on the meta device."""
    tensors = [*model.parameters(), *model.buffers(), *tree_flatten((args, kwargs))[0]]
    return any(isinstance(t, torch.Tensor) and t.is_meta for t in tensors)


class _Fakifier:
    """Maps meta (and real) tensors to CPU FakeTensors, one fake storage per real storage."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.mode = FakeTensorMode(allow_non_fake_inputs=False)
        self.sharers: dict[StorageWeakRef, set[int]] = {}
        for t in tensors:
            self.sharers.setdefault(StorageWeakRef(t.untyped_storage()), set()).add(id(t))
        self.bases: dict[StorageWeakRef, torch.Tensor] = {}
        self.done: dict[int, torch.Tensor] = {}

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        if id(t) in self.done:
            return self.done[id(t)]
        if isinstance(t, FakeTensor):
            raise ValueError("mix of meta tensors and FakeTensors: give the model and its inputs "
                             "either all on the meta device or all as FakeTensors")
        fake = self._fake(t.detach())
        if isinstance(t, torch.nn.Parameter):
            fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
        elif t.requires_grad:
            fake.requires_grad_(True)
        self.done[id(t)] = fake
        return fake

    def _fake(self, t: torch.Tensor) -> torch.Tensor:
        if not t.is_meta:  # a real tensor among meta ones (e.g. token ids): its fake twin
            return self.mode.from_tensor(t)
        storage = t.untyped_storage()
        key = StorageWeakRef(storage)
        with self.mode:
            if len(self.sharers.get(key, ())) <= 1 and t.storage_offset() == 0 \
                    and t.numel() * t.element_size() == storage.nbytes():
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
            if key not in self.bases:  # several tensors view one storage: views of one base
                self.bases[key] = torch.empty(storage.nbytes(), dtype=torch.uint8, device="cpu")
            usable = storage.nbytes() - storage.nbytes() % t.element_size()
            typed = self.bases[key][:usable].view(t.dtype)
            return typed.as_strided(t.shape, t.stride(), t.storage_offset())


def fakify_meta(model: torch.nn.Module, args: tuple, kwargs: dict
                ) -> tuple[torch.nn.Module, tuple, dict]:
    """A copy of ``model`` and the inputs with every tensor a CPU FakeTensor (see module doc)."""
    clone = copy.deepcopy(model)
    leaves = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    fakifier = _Fakifier([*(p for _, p in clone.named_parameters(remove_duplicate=False)),
                          *(b for _, b in clone.named_buffers(remove_duplicate=False)), *leaves])
    for module in clone.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = fakifier(param)
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = fakifier(buffer)

    def convert(x: Any) -> Any:
        return fakifier(x) if isinstance(x, torch.Tensor) else x

    return clone, tree_map(convert, tuple(args)), tree_map(convert, dict(kwargs))
