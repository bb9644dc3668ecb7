#!/usr/bin/env bash
# Lock the operator image's Python dependencies: requirements/operator.lock pins every package the
# image installs, each with the hashes of all its files (so one lock serves linux/amd64 and
# linux/arm64), resolved for Python 3.11 on every platform (uv's universal resolution) from
# pyproject.toml's dependencies and its build-system requires (the image builds the package
# without build isolation, so setuptools is in the lock too). The one command that refreshes it:
#   make lock            (hack/lock.sh BIN_DIR, BIN_DIR holding python and uv; needs PyPI)
# The operator's Dockerfile installs from it with --require-hashes, so a dependency missing from it
# fails the build; make downloads the same files into .venv/wheelhouse for tests/test_wheel.py.
# The file is written to a temporary name and renamed.
set -euo pipefail

BIN_DIR=${1:?usage: hack/lock.sh BIN_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOCK=$ROOT/requirements/operator.lock
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$BIN_DIR/python" -c "import sys, tomllib; print('\n'.join(tomllib.load(open(sys.argv[1], 'rb'))['build-system']['requires']))" \
    "$ROOT/pyproject.toml" > "$work/build-system.in"
cd "$ROOT"
"$BIN_DIR/uv" pip compile pyproject.toml "$work/build-system.in" \
    --universal --python-version 3.11 --generate-hashes --no-annotate \
    --custom-compile-command "make lock" --quiet --output-file "$work/operator.lock"
mv "$work/operator.lock" "$LOCK.tmp"
mv "$LOCK.tmp" "$LOCK"
echo "lock.sh: wrote $LOCK ($(grep -c '==' "$LOCK") packages)"
