# Two commands on a fresh machine (README "Quick start"):
#   make demo   create .venv (torch 2.13.0 CPU first), install remat-opt, plan an example
#   make test   lint (ruff), then the test suite; .ci/run calls this in a fresh environment,
#               once per tested torch: `make test` (2.13.0) and `make test TORCH=2.14.1`
# VENV may point elsewhere (.ci/run uses temporary ones). TORCH=2.14.1 also installs
# torchvision 0.29.1 and timm (they pair with it), in .venv-torch2.14.1 by default.

TORCH ?= 2.13.0
TORCH_PAIRED := $(if $(filter 2.14.1,$(TORCH)),torchvision==0.29.1 timm,)
VENV ?= $(if $(filter 2.13.0,$(TORCH)),.venv,.venv-torch$(TORCH))
PYTHON ?= python3
BIN := $(VENV)/bin

.PHONY: demo test lint env

$(BIN)/remat-opt: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet torch==$(TORCH) $(TORCH_PAIRED)
	$(BIN)/pip install --quiet -e ".[test]"
	touch $@

env: $(BIN)/remat-opt

demo: env
	$(BIN)/remat-opt examples/gpt.py --budget 70% --time-limit 20

lint: env
	$(BIN)/ruff check .

# Test files run in parallel (pytest-xdist, one worker per core up to 4; a file's tests stay on
# one worker so its module fixtures are built once); the slowest tests are listed at the end.
test: lint
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations 15
