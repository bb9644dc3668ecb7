# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[operator,trainer,demo,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/bertjob run examples/bert-tiny-local.yaml

lint: $(STAMP)
	$(BIN)/ruff check operator trainer_image tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/pytest
