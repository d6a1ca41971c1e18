# The commands people use. Each one sets up .venv first if it is missing or stale.
#   make setup            set up .venv alone (torch first, then requirements-dev.txt and the tab)
#   make train            train the default model, then print a sample
#   make test             run the test suite
#   make test-fast        the tests not marked slow, browser, distributed or compile (pyproject.toml): the
#                         inner loop; every module of the project is still run (tests/test_fast_tier.py)
#   make sample           sample from the newest run, or RUN=<run dir> (ARGS="prompt='Once upon a time'")
#   make tensorboard      open TensorBoard on every run, with the Attention tab (attention_tab/)
#   make bench            speed figures for this machine (python -m bench: bench/), as a table and JSON
#   make docs             redraw the tour's pictures (docs/questions/), and docs/attention_maps.png and the
#                         Attention tab's screenshot docs/attention_tab.png from the newest run (RUN=<run dir>),
#                         and docs/induction_*.png from runs of experiment=induction (INDUCTION_RUNS="<dir> ..."),
#                         and docs/tools.json with its pictures (the logit lens, attribution, patching) from both
#   make notebook         open notebooks/look_inside.ipynb in JupyterLab (installs it into .venv the first time);
#                         NOTEBOOK=name_swap (or its file name or path) opens notebooks/name_swap.ipynb
#   make lint             ruff
#   make clean            remove .venv and the caches (not your runs)
#   make help             this list
#   make browser          Chromium and its driver for the Attention tab's browser tests (apt-get; make
#                         test runs it: it does nothing when they are there)
# Extra arguments go through ARGS, e.g. make train ARGS="model.n_layer=6 train.max_steps=500"

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
# Where pip looks for torch; e.g. TORCH_PIP_ARGS="--index-url <a CPU-only wheel index>".
TORCH_PIP_ARGS ?=
# The tests make test-fast runs: pytest -m of the markers pyproject.toml registers.
FAST_TESTS := not slow and not browser and not distributed and not compile
# One pytest-xdist worker per core; a worker that runs out of tests takes the other's last ones
# (worksteal), so that both end together rather than one waiting on the other's slow tests.
XDIST := -n auto --dist worksteal
RUN ?= latest
# RUN=~/... as zsh passes it on, unexpanded, taken as the shell would take it
RUN_PATH = $(patsubst ~/%,$(HOME)/%,$(RUN))
INDUCTION_RUNS ?=
NOTEBOOK ?= look_inside
# The notebook's file, from its name (name_swap), its file name or its path (notebooks/name_swap.ipynb).
NOTEBOOK_FILE = notebooks/$(basename $(notdir $(NOTEBOOK))).ipynb
ARGS ?=
# ARG= (no S) would be left unread, and the command run with its defaults: say so instead.
ifneq ($(origin ARG),undefined)
$(error ARG= is no variable here: extra arguments go through ARGS= (with an S), e.g. make train ARGS="train.max_steps=500")
endif

.PHONY: setup browser train test test-fast sample tensorboard bench docs notebook lint clean help
.DEFAULT_GOAL := help  # a bare make lists the commands (each one sets up .venv first)

setup: $(VENV)/.installed

# torch first, pinned, so that the torch range in requirements.txt is already met and no
# other torch build is pulled in later. Which build the pin gets is pip's choice: a local
# CPU wheel where pip is set up to find one; TORCH_PIP_ARGS can point it at a CPU index.
# pip compiles each installed file to bytecode one after another; compileall does it on every
# core afterwards (41 s of pip's time for torch and the rest, a 2-core AMD EPYC VM, 2026-11-28).
# Like pip, it goes past the few files that do not compile on this Python (torch ships one
# written for 3.12): hence the || true.
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml Makefile
	@echo "setup: creating $(VENV) (once; README.md#what-make-train-prints says how long)"
	@$(PYTHON) -m venv $(VENV)
	@echo "setup: installing torch==$(TORCH_VERSION)"
	@$(PY) -m pip install -qq --disable-pip-version-check --no-compile torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	@echo "setup: installing requirements-dev.txt (hydra-core, tensorboard, tiktoken, rustbpe, transformers, pytest, ruff, selenium, ...)"
	@$(PY) -m pip install -qq --disable-pip-version-check --no-compile -r requirements-dev.txt
	@echo "setup: installing the Attention tab for TensorBoard (attention_tab/, editable)"
	@$(PY) -m pip install -qq --disable-pip-version-check --no-deps -e .
	@echo "setup: compiling the packages' Python to bytecode, on every core"
	@$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true
	@touch $@
	@echo "setup: done (make help lists the commands)"

# Debian's chromium and chromium-driver (Ubuntu: chromium-browser); with apt-get as root or through sudo.
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
# JupyterLab refuses to start as root (a container, a VM) unless told it may.
JUPYTER_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root,)
browser:
	@if command -v chromedriver >/dev/null && { command -v chromium || command -v chromium-browser; } >/dev/null; then :; \
	elif command -v apt-get >/dev/null; then \
	  echo "browser: installing chromium and chromium-driver for the Attention tab's tests (once)"; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "browser: no apt-get here: install Chromium and chromedriver (the Attention tab's browser tests need them)"; fi

train: setup
	$(PY) train.py $(ARGS)

test: setup browser
	$(PY) -m pytest $(XDIST) $(ARGS)

test-fast: setup
	$(PY) -m pytest $(XDIST) -m "$(FAST_TESTS)" $(ARGS)

sample: setup
	@test "$(RUN)" = latest -o -e "$(RUN_PATH)" || { echo "error: RUN=$(RUN) does not exist; give make sample RUN=<run dir>, or leave RUN out for the newest run" >&2; exit 2; }
	$(PY) sample.py run=$(RUN_PATH) $(ARGS)

tensorboard: setup
	@test -d outputs -o -d multirun || echo "note: no runs yet under outputs/ or multirun/ (make train makes one); TensorBoard shows them as they come" >&2
	$(VENV)/bin/tensorboard --logdir_spec outputs:outputs,multirun:multirun $(ARGS)

bench: setup
	$(PY) -m bench $(ARGS)

docs: setup browser
	@test -n "$(RUN)" || { echo "error: RUN= is empty; give make docs RUN=<run dir>, or leave RUN out for the newest run" >&2; exit 2; }
	@test "$(RUN)" = latest -o -e "$(RUN_PATH)" || { echo "error: RUN=$(RUN) does not exist; give make docs RUN=<run dir>, or leave RUN out for the newest run" >&2; exit 2; }
	$(PY) docs/figures.py $(RUN_PATH)
	$(PY) docs/questions.py
	$(PY) docs/attention_tab.py $(RUN_PATH)
	$(PY) docs/induction_figures.py $(INDUCTION_RUNS)
	$(PY) docs/tools.py $(RUN_PATH) $(INDUCTION_RUNS)

notebook: setup
	@test -f "$(NOTEBOOK_FILE)" || { echo "error: NOTEBOOK=$(NOTEBOOK) is not a notebook here: pick one of" \
	  "$$(ls notebooks | sed -n 's/\.ipynb$$//p' | paste -sd, - | sed 's/,/, /g') (make notebook NOTEBOOK=name_swap)" >&2; exit 2; }
	@$(PY) -c "import jupyterlab" 2>/dev/null || { echo "notebook: installing JupyterLab into $(VENV) (once)"; \
	  $(PY) -m pip install -qq --disable-pip-version-check "jupyterlab>=4"; }
	$(VENV)/bin/jupyter lab $(NOTEBOOK_FILE) $(JUPYTER_ROOT) $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

help:
	@sed -n '2,/^# Extra/p' Makefile | cut -c3-
