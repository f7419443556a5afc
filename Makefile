# gptlab from a fresh clone: every target sets up what it needs first.
#   make train                      # a virtual environment, torch, gptlab; then the default run
#   make test                       # the same set-up; then the tests
#   make train ARGS='debug=fast'    # Hydra overrides for gptlab-train
#   make test ARGS='-k resume -n 0' # pytest arguments
# .venv is made when it is missing or older than pyproject.toml. torch: a wheel already on this
# machine, else the CUDA build with a GPU, else the CPU build (scripts/install_torch.sh);
# TORCH='<pip arguments>' chooses yourself. Offline, export TIKTOKEN_CACHE_DIR and GPTLAB_DATA_DIR.

PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
ARGS ?=
VENV := .venv
BIN := $(VENV)/bin
READY := $(VENV)/.ready

.DEFAULT_GOAL := help
.PHONY: help train test lint format tensorboard clean

help: ## this list
	@grep -E '^[a-z]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  ARGS='...'         Hydra overrides (train) or pytest arguments (test)"
	@echo "  TORCH='...'        pip arguments for torch, instead of the automatic choice"

$(READY): pyproject.toml scripts/install_torch.sh
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
# pip -qq: errors only (a machine's pip config can add a warning line per package, e.g. an
# extra index folder without it: 200 lines in a log)
	-$(BIN)/python -m pip install -qq --disable-pip-version-check --upgrade pip
	TORCH="$(TORCH)" bash scripts/install_torch.sh $(BIN)/python $(TORCH_VERSION)
# setuptools' notice that an editable install may be shadowed by a folder of the same name
# (the one warning left: conf/'s groups are named packages in pyproject.toml)
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install -qq --disable-pip-version-check -e ".[dev]"
	touch $(READY)

train: $(READY) ## train a GPT (the default run: about 3 minutes of training on 2 idle CPU cores)
	$(BIN)/gptlab-train $(ARGS)

test: $(READY) ## run the tests (about 10 minutes on 2 CPU cores)
	$(BIN)/pytest $(ARGS)

lint: $(READY) ## ruff: the lint rules and the formatting, checked
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(READY) ## ruff: format the code and fix what the lint rules can
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

tensorboard: $(READY) ## TensorBoard on every run under outputs/
	$(BIN)/tensorboard --logdir outputs $(ARGS)

clean: ## remove the virtual environment and the caches (outputs/ and data/ stay)
	rm -rf $(VENV) .pytest_cache .ruff_cache src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
