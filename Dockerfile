# The operator image: kopf, the kubernetes client and the bertjob package (no torch), with the
# kustomize tree and the kustomize binary that bertjob.render runs.
#   docker build -t ghcr.io/bertjob/operator:0.1.0 .
FROM registry.k8s.io/kustomize/kustomize:v5.5.0 AS kustomize

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    BERTJOB_KUSTOMIZE_DIR=/opt/bertjob/kustomize

COPY --from=kustomize /app/kustomize /usr/local/bin/kustomize

# setuptools wants both package directories that pyproject.toml names; the trainer's code is
# small, and its heavy dependencies (torch) come only with the [trainer] extra.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY trainer_image/bertpretrain/ trainer_image/bertpretrain/
RUN pip install --no-cache-dir "/src[operator]"

COPY kustomize/ /opt/bertjob/kustomize/

# A numeric user, so that the kubelet can check runAsNonRoot; its home is the Deployment's /tmp.
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp bertjob
USER 10001:10001
WORKDIR /tmp

CMD ["kopf", "run", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz", "-m", "bertjob.handlers"]
