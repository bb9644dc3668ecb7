# The operator image: kopf, the kubernetes client and the bertjob package (no torch) in a venv,
# the kustomize tree, and kubectl, whose built-in kustomize bertjob.render runs.
#   docker build -t ghcr.io/bertjob/operator:0.1.0 .      (or: hack/build-images.sh operator)
#
# Every base image is a build argument, so that a build can start from a mirror or a local image
# (the tests build on a Debian bookworm made by mmdebstrap, with a stand-in kubectl image).
# BASE_IMAGE: any Debian-based image with python3 >= 3.11 and its venv module. The package goes
# into a venv (/opt/venv), which works the same whether python3 is the image's own build
# (/usr/local/bin on python:*-slim) or Debian's (/usr/bin, where pip refuses to install system-wide).
ARG BASE_IMAGE=python:3.11-slim-bookworm
# KUBECTL_IMAGE: Kubernetes' own kubectl image (kubernetes/kubernetes build/server-image/kubectl),
# whose /bin/kubectl carries kustomize v5.5.0 built in (kubectl 1.32). Why kubectl rather than the
# kustomize image: render() falls back to `kubectl kustomize` when no kustomize is on PATH, kubectl
# is the one kustomize-capable binary that also ships in Debian's and other registries' packages
# (so a stand-in can be made where registry.k8s.io is out of reach), and its kustomize is the one
# `kubectl apply -k` users run.
ARG KUBECTL_IMAGE=registry.k8s.io/kubectl:v1.32.5

FROM ${KUBECTL_IMAGE} AS kubectl

FROM ${BASE_IMAGE}

# pip's options as build arguments, which reach RUN as environment variables: PIP_CERT for a CA
# bundle mounted into the build (a proxy's), PIP_INDEX_URL and PIP_FIND_LINKS for a mirror.
ARG PIP_CERT
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    BERTJOB_KUSTOMIZE_DIR=/opt/bertjob/kustomize

COPY --from=kubectl /bin/kubectl /usr/local/bin/kubectl

# The dependencies first, from the lock alone, so that a change to the code reuses this layer:
# requirements/operator.lock (hack/lock.sh, `make lock`) pins every package with its hashes, and
# --require-hashes refuses anything else, a dependency missing from the lock included.
# A numeric user, so that the kubelet can check runAsNonRoot; its home is the Deployment's /tmp.
COPY requirements/operator.lock /src/requirements/operator.lock
RUN python3 -m venv /opt/venv \
    && pip install --require-hashes -r /src/requirements/operator.lock \
    && useradd --uid 10001 --user-group --no-create-home --home-dir /tmp bertjob

# The job API and the operator only: the trainer's folder is not copied, and pyproject.toml's
# package search installs what is there. Its dependencies and setuptools are the lock's: no
# dependency resolution and no build isolation here, so nothing else is downloaded.
COPY pyproject.toml README.md /src/
COPY api/ /src/api/
COPY operator/ /src/operator/
COPY kustomize/ /src/kustomize/
RUN pip install --no-deps --no-build-isolation "/src[operator]" \
    && mkdir -p /opt/bertjob \
    && mv /src/kustomize "$BERTJOB_KUSTOMIZE_DIR" \
    && rm -rf /src \
    && kubectl kustomize "$BERTJOB_KUSTOMIZE_DIR/overlays/single-node" > /dev/null

USER 10001:10001
WORKDIR /tmp

CMD ["kopf", "run", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "-m", "bertjob.handlers"]
