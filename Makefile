# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

HOROVOD := $(VENV)/.horovod

.PHONY: demo test lint

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[operator,trainer,demo,dev]'
	touch $(STAMP)

# Horovod for the MPIJob path's tests: compiled once (about 6 minutes on 2 cores), the wheel kept
# in .cache/wheels for the next fresh .venv.
$(HOROVOD): $(STAMP) trainer_image/build_horovod.sh
	trainer_image/build_horovod.sh $(BIN)/python .cache/wheels
	touch $(HOROVOD)

demo: $(STAMP)
	$(BIN)/bertjob run examples/bert-tiny-local.yaml

lint: $(STAMP)
	$(BIN)/ruff check operator trainer_image tests benchmarks
	$(BIN)/mypy

test: lint $(HOROVOD)
	$(BIN)/pytest
