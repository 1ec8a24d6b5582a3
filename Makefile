# The two commands of the README, for a fresh machine:
#   make course     set up, then open the course in JupyterLab (make course HEADLESS=1: run the demo)
#   make test       set up, then run the whole test suite (what CI runs)
#   make check-notebook NB=03   re-run one notebook and compare it with its stored outputs (nbval)
# JupyterLab options: as root it adds --allow-root; in a container (or with no display) it listens
# on JUPYTER_IP without opening a browser. Anything else: make course JUPYTER_ARGS="--port=8890"
# On a CPU-only machine torch comes from TORCH_SPEC (default torch==2.13.0, a CPU wheel here);
# with a GPU: make course TORCH_SPEC="torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
# torchvision for the real-model tests (the release for TORCH_SPEC's torch: change them together)
TORCHVISION_SPEC ?= torchvision==0.28.0
BIN := $(VENV)/bin
PYTEST_NOTEBOOKS := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg
JUPYTER_IP ?= $(if $(wildcard /.dockerenv /run/.containerenv),0.0.0.0,127.0.0.1)
JUPYTER_ARGS ?=
JUPYTER_FLAGS := $(if $(filter 0,$(shell id -u)),--allow-root) \
	$(if $(or $(wildcard /.dockerenv /run/.containerenv),$(if $(DISPLAY)$(WAYLAND_DISPLAY),,nodisplay)),--ip=$(JUPYTER_IP) --no-browser) \
	$(JUPYTER_ARGS)
NB ?=

.PHONY: setup course demo test exercises notebooks grade check-notebook reliability

setup: $(VENV)/.installed

# About 2.5 GB in .venv (torch is most of it); a few minutes on a fast connection.
$(VENV)/.installed: pyproject.toml
	@echo "==> [1/3] creating the virtual environment $(VENV) with $(PYTHON) ($$($(PYTHON) --version 2>&1))"
	$(PYTHON) -m venv $(VENV)
	@echo "==> [2/3] installing torch ($(TORCH_SPEC)): the big one: most of the disk space"
	$(BIN)/python -m pip install --progress-bar on $(TORCH_SPEC)
	@echo "==> [3/3] installing this repo (editable) and its course tools: JupyterLab, jupytext, nbval, triton..."
	$(BIN)/python -m pip install --progress-bar on -e .
	@echo "==> the real-model tests' libraries: torchvision and timm without their dependencies (a resolver would replace TORCH_SPEC's torch by the newest CUDA build), transformers"
	$(BIN)/python -m pip install --progress-bar on --no-deps $(TORCHVISION_SPEC) "timm>=1.0"
	$(BIN)/python -m pip install --progress-bar on "transformers>=4.50" pyyaml huggingface_hub safetensors pillow
	@command -v dot >/dev/null || echo "note: Graphviz's dot is not installed; graph pictures show as text (apt install graphviz)"
	@echo "==> setup done: $$(du -sh $(VENV) | cut -f1) in $(VENV)"
	touch $@

course: setup
ifeq ($(HEADLESS),1)
	$(BIN)/python -m course.demo
else
	@echo "==> starting JupyterLab on notebooks/ (options: $(strip $(JUPYTER_FLAGS))); open the URL it prints"
	$(BIN)/jupyter lab notebooks/ $(JUPYTER_FLAGS)
endif

check-notebook: setup
	@test -n "$(NB)" || { echo "usage: make check-notebook NB=03"; exit 2; }
	@test -n "$$(ls notebooks/$(NB)_*.ipynb 2>/dev/null)" || { echo "no notebook notebooks/$(NB)_*.ipynb; NB is its two-digit number"; exit 2; }
	$(BIN)/python -m pytest notebooks/$(NB)_*.ipynb $(PYTEST_NOTEBOOKS) --course-mode=solutions -q

demo: setup
	$(BIN)/python -m course.demo

exercises: setup
	$(BIN)/python -m course.exercises

notebooks: setup
	@command -v dot >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& echo "==> installing Graphviz (dot), so graph pictures are stored as SVG" \
		&& apt-get update && apt-get install -y graphviz; } || true
	$(BIN)/python -m course.notebooks build

grade: setup
	$(BIN)/python -m course.grade

# issue 13's reliability table: per family, tinydynamo's backends and torch.compile against eager
reliability: setup
	$(BIN)/python -m tests.reliability -v

test: setup
	$(BIN)/python -m ruff check .
	$(BIN)/python -m course.exercises --check
	$(BIN)/python -m course.notebooks check
	$(BIN)/python -m course.grade --mode solutions --require pass
	$(BIN)/python -m course.grade --mode exercises --require fail
	bash scripts/test_other_pythons.sh
	$(BIN)/python -m course.grade --mutants --jobs 2
	$(BIN)/python -m pytest tests notebooks $(PYTEST_NOTEBOOKS) --course-mode=solutions -q
