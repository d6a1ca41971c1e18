# The commands people use. Each one sets up .venv first if it is missing or stale.
#   make train            train the default model, then print a sample
#   make test             run the test suite
#   make sample           sample from the newest run (ARGS="prompt='Once upon a time'")
#   make tensorboard      open TensorBoard on every run
#   make lint             ruff
# Extra arguments go through ARGS, e.g. make train ARGS="model.n_layer=6 train.max_steps=500"

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0
# Where pip looks for torch; e.g. TORCH_PIP_ARGS="--index-url <a CPU-only wheel index>".
TORCH_PIP_ARGS ?=
ARGS ?=

.PHONY: setup train test sample tensorboard lint clean

setup: $(VENV)/.installed

# torch first, pinned, so that the torch range in requirements.txt is already met and
# pip never swaps in a different (multi-GB CUDA) build.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@touch $@

train: setup
	$(PY) train.py $(ARGS)

test: setup
	$(PY) -m pytest $(ARGS)

sample: setup
	$(PY) sample.py run=latest $(ARGS)

tensorboard: setup
	$(VENV)/bin/tensorboard --logdir_spec outputs:outputs,multirun:multirun $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) .cache .pytest_cache .ruff_cache
