"""The remat module's last walk of the module tree holds exactly while a new walk would find
the same modules and tensors (`state_tensors`), and the module reads what the model holds now."""

from __future__ import annotations

import weakref

import pytest
import torch
from e2e_helpers import clone, load_example, loss_of
from torch import nn

from frontends.graph_runtime.state_tensors import walk
from optimizer import optimize


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.unused = None


def _model() -> nn.Sequential:
    return nn.Sequential(_Block(), _Block())


NAMES = (("parameter", "0.linear.weight"), ("parameter", "1.linear.bias"), ("buffer", "1.norm.running_mean"))


def test_the_walk_finds_the_named_tensors_in_named_modules_order():
    model = _model()
    seen = []
    tensors, found = walk(model, NAMES, seen.extend)
    assert [path for path, _ in seen] == [path for path, _ in model.named_modules(remove_duplicate=False)]
    assert tensors[0] is model[0].linear.weight and tensors[2] is model[1].norm.running_mean
    again = found.tensors_if_holds(model)
    assert again is not None and all(a is b for a, b in zip(again, tensors, strict=True))
    with pytest.raises(KeyError, match="buffer '1.norm.gone'"):
        walk(model, (("buffer", "1.norm.gone"),))


@pytest.mark.parametrize("change", [
    "replace a parameter", "replace a buffer", "replace a submodule", "add a submodule",
    "fill a None child", "delete a submodule", "change a class", "another root",
])
def test_every_change_a_walk_would_see_makes_the_last_walk_not_hold(change):
    model = _model()
    _, found = walk(model, NAMES)
    root = model
    if change == "replace a parameter":
        model[0].linear.weight = nn.Parameter(torch.zeros(4, 4))
    elif change == "replace a buffer":
        model[1].norm.running_mean = torch.zeros(4)
    elif change == "replace a submodule":
        model[0].norm = nn.BatchNorm1d(4)  # a part that holds none of the named tensors
    elif change == "add a submodule":
        model[1].extra = nn.ReLU()
    elif change == "fill a None child":
        model[0].unused = nn.ReLU()
    elif change == "delete a submodule":
        del model[1].norm
    elif change == "change a class":  # as fully_shard does
        model[1].norm.__class__ = type("Sharded", (nn.BatchNorm1d,), {})
    else:
        root = clone(model)
    assert found.tensors_if_holds(root) is None
    assert (found.tensors_if_holds(model) is not None) is (change == "another root")


def test_the_walk_keeps_no_replaced_tensor_alive():
    model = _model()
    found = walk(model, NAMES)[1]
    old = weakref.ref(model[0].linear.weight)
    model[0].linear.weight = nn.Parameter(torch.zeros(4, 4))
    assert old() is None
    assert found.tensors_if_holds(model) is None


def test_a_replaced_submodule_trains_in_place_of_the_planned_one():
    model, inputs = load_example("mlp")
    rm = optimize(clone(model), inputs, "85%", solver="greedy")
    loss_of(rm(*inputs)).backward()
    path = next(name for name, m in rm.model.named_modules() if isinstance(m, nn.Linear))
    parent_path, _, child = path.rpartition(".")
    parent = rm.model.get_submodule(parent_path)
    replacement = clone(getattr(parent, child))
    setattr(parent, child, replacement)
    loss_of(rm(*inputs)).backward()
    assert replacement.weight.grad is not None
