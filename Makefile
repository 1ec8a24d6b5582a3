# The two commands of the README, for a fresh machine:
#   make course     set up, then open the course in JupyterLab (make course HEADLESS=1: run the demo)
#   make test       set up, then run the whole test suite (what CI runs)
# On a CPU-only machine torch comes from TORCH_SPEC (default torch==2.13.0, a CPU wheel here);
# with a GPU: make course TORCH_SPEC="torch==2.11.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PYTEST_NOTEBOOKS := --nbval --nbval-current-env --nbval-sanitize-with notebooks/nbval_sanitize.cfg

.PHONY: setup course demo test exercises notebooks grade

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e .
	touch $@

course: setup
ifeq ($(HEADLESS),1)
	$(BIN)/python -m course.demo
else
	$(BIN)/jupyter lab notebooks/
endif

demo: setup
	$(BIN)/python -m course.demo

exercises: setup
	$(BIN)/python -m course.exercises

notebooks: setup
	$(BIN)/python -m course.notebooks build

grade: setup
	$(BIN)/python -m course.grade

test: setup
	$(BIN)/python -m course.exercises --check
	$(BIN)/python -m course.notebooks check
	$(BIN)/python -m course.grade --mode solutions --require pass
	$(BIN)/python -m course.grade --mode exercises --require fail
	bash scripts/test_other_pythons.sh
	$(BIN)/python -m course.grade --mutants --jobs 2
	$(BIN)/python -m pytest tests notebooks $(PYTEST_NOTEBOOKS) --course-mode=solutions -q
