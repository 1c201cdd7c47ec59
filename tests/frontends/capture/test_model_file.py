"""Model files load by path, and each kind of mistake yields one actionable line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn

from frontends.capture.model_file import ModelFileError, load_model_file

GOOD = """
import torch
from torch import nn

def get_model():
    torch.manual_seed(0)
    return nn.Linear(4, 2)

def get_inputs():
    return (torch.ones(3, 4),)
"""


def _write(tmp_path: Path, text: str, name: str = "model.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _error(path: str) -> str:
    with pytest.raises(ModelFileError) as info:
        load_model_file(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_loads_model_and_inputs(tmp_path: Path) -> None:
    model, inputs = load_model_file(_write(tmp_path, GOOD))
    assert isinstance(model, nn.Linear)
    assert isinstance(inputs, tuple) and len(inputs) == 1
    assert model(*inputs).shape == (3, 2)


def test_each_load_is_a_fresh_module(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD + "\nCOUNT = []\ndef get_model():\n    COUNT.append(1)\n"
                  "    return nn.Linear(len(COUNT), 1)\n")
    first, _ = load_model_file(path)
    second, _ = load_model_file(path)
    assert first.in_features == second.in_features == 1  # module state was not shared


def test_single_tensor_and_list_inputs_become_tuples(tmp_path: Path) -> None:
    single = GOOD.replace("return (torch.ones(3, 4),)", "return torch.ones(3, 4)")
    _, inputs = load_model_file(_write(tmp_path, single, "single.py"))
    assert isinstance(inputs, tuple) and len(inputs) == 1 and inputs[0].shape == (3, 4)
    as_list = GOOD.replace("return (torch.ones(3, 4),)", "return [torch.ones(3, 4), 5]")
    _, inputs = load_model_file(_write(tmp_path, as_list, "as_list.py"))
    assert isinstance(inputs, tuple) and inputs[1] == 5


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.py")
    assert _error(path) == f"model file {path!r} not found"


def test_import_error_names_type_message_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "import torch\n\nx = 1\nraise ValueError('bad\\nconfig')\n")
    message = _error(path)
    assert path in message
    assert "line 4" in message
    assert "ValueError: bad config" in message


def test_error_raised_in_a_helper_reports_the_user_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "import torch\n\ntorch.zeros(2) @ torch.zeros(3)\n")
    message = _error(path)
    assert "line 3" in message and "RuntimeError" in message


def test_syntax_error_reports_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "def get_model():\n    return (\n\ndef get_inputs(:\n")
    message = _error(path)
    assert "SyntaxError" in message and "line" in message


def test_missing_functions(tmp_path: Path) -> None:
    path = _write(tmp_path, "def get_model():\n    return None\n")
    assert _error(path) == f"{path!r} must define get_model() and get_inputs(); see README"
    not_callable = _write(tmp_path, "get_model = 1\nget_inputs = 2\n", "not_callable.py")
    assert "must define get_model() and get_inputs()" in _error(not_callable)


def test_get_model_must_return_module(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("return nn.Linear(4, 2)", "return 42"))
    message = _error(path)
    assert "get_model()" in message and "torch.nn.Module" in message and "int" in message


def test_get_inputs_must_return_tuple(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD.replace("return (torch.ones(3, 4),)", "return {'x': 1}"))
    message = _error(path)
    assert "get_inputs()" in message and "tuple" in message and "dict" in message


def test_exception_inside_get_model_reports_line(tmp_path: Path) -> None:
    text = GOOD.replace("    torch.manual_seed(0)\n", "    torch.manual_seed(0)\n    1 / 0\n")
    message = _error(_write(tmp_path, text))
    assert "get_model()" in message and "ZeroDivisionError" in message and "line 7" in message


def test_file_may_import_its_neighbours(tmp_path: Path) -> None:
    (tmp_path / "helper_mod_for_remat.py").write_text("WIDTH = 7\n")
    text = GOOD.replace("import torch\n", "import torch\nimport helper_mod_for_remat\n", 1)
    text = text.replace("nn.Linear(4, 2)", "nn.Linear(4, helper_mod_for_remat.WIDTH)")
    path_before = list(sys.path)
    model, inputs = load_model_file(_write(tmp_path, text))
    assert model(*inputs).shape == (3, 7)
    assert sys.path == path_before
    sys.modules.pop("helper_mod_for_remat", None)


def test_failed_import_leaves_no_module_behind(tmp_path: Path) -> None:
    modules_before = set(sys.modules)
    _error(_write(tmp_path, "raise KeyError('x')\n"))
    assert not [m for m in set(sys.modules) - modules_before if "remat_model_file" in m]


def test_dataclass_in_model_file_works(tmp_path: Path) -> None:
    text = (
        "from dataclasses import dataclass\nimport torch\nfrom torch import nn\n\n"
        "@dataclass\nclass Config:\n    width: int = 5\n\n"
        "def get_model():\n    return nn.Linear(Config().width, 1)\n\n"
        "def get_inputs():\n    return (torch.ones(2, 5),)\n"
    )
    model, inputs = load_model_file(_write(tmp_path, text))
    assert model(*inputs).shape == (2, 1)
