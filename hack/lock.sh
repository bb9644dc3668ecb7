#!/usr/bin/env bash
# Lock the images' Python dependencies, each package pinned with the hashes of all its files,
# resolved for Python 3.11 and later on every platform (uv's universal resolution), so that one lock
# serves linux/amd64 and linux/arm64 and the bases' newer Pythons. The one command that refreshes
# them all:
#   make lock            (hack/lock.sh BIN_DIR, BIN_DIR holding python and uv; needs PyPI)
#
# requirements/operator.lock   the operator image: pyproject.toml's dependencies and its
#                              build-system requires (the image builds the package without build
#                              isolation, so setuptools is there too).
# The trainer images', resolved together from the [trainer] extra, the build-system requires and
# Horovod (the version that trainer_image/build_horovod.sh builds), then split in three:
# requirements/torch.lock      torch and what only its PyPI build needs on Linux (the CUDA
#                              libraries, Triton): installed where torch comes from PyPI's files.
# requirements/horovod.lock    Horovod's source distribution, which build_horovod.sh compiles.
# requirements/trainer.lock    everything else, torch's platform-independent dependencies included;
#                              every trainer image installs it over the torch it has.
# The Dockerfiles install with --require-hashes, so a dependency missing from a lock fails the
# build; make downloads operator.lock's files into .venv/wheelhouse for the tests. Each file is
# written to a temporary name and renamed.
set -euo pipefail

BIN_DIR=${1:?usage: hack/lock.sh BIN_DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/requirements
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$ROOT"

compile() {
    "$BIN_DIR/uv" pip compile "$@" --universal --python-version 3.11 --generate-hashes \
        --custom-compile-command "make lock" --quiet
}

"$BIN_DIR/python" -c "import sys, tomllib; print('\n'.join(tomllib.load(open(sys.argv[1], 'rb'))['build-system']['requires']))" \
    pyproject.toml > "$work/build-system.in"
# uv keeps the pins of an existing output file where they still satisfy the inputs: the locks are
# seeded with the committed ones, so that a new dependency adds its packages and moves no others.
# To move every pin to the newest allowed, delete requirements/*.lock first.
cat requirements/operator.lock > "$work/operator.lock" 2>/dev/null || true
cat requirements/trainer.lock requirements/torch.lock requirements/horovod.lock > "$work/trainer.all" 2>/dev/null || true
compile pyproject.toml "$work/build-system.in" --no-annotate --output-file "$work/operator.lock"

horovod=$(sed -n 's/^VERSION=\([0-9][0-9.]*\)$/\1/p' trainer_image/build_horovod.sh)
[[ -n "$horovod" ]] || { echo "lock.sh: no VERSION= line in trainer_image/build_horovod.sh" >&2; exit 1; }
echo "horovod==$horovod" > "$work/horovod.in"
# Annotated: the split below reads which packages each one is required by.
compile pyproject.toml "$work/build-system.in" "$work/horovod.in" --extra trainer --annotation-style line --output-file "$work/trainer.all"

# torch.lock: torch, and each package that only torch.lock's packages require and only on some
# platforms (a marker): the CUDA build's libraries. torch's unconditional dependencies (sympy,
# networkx, ...) stay in trainer.lock, since PyTorch's CPU build needs them too.
"$BIN_DIR/python" - "$work" <<'EOF'
import re
import sys
from pathlib import Path

work = Path(sys.argv[1])
# The inputs' temporary paths out of the "via" notes, so that an unchanged resolution rewrites
# the same files.
text = (work / "trainer.all").read_text().replace(f"{work}/", "")
lines = text.splitlines()
start = next(i for i, line in enumerate(lines) if re.match(r"[A-Za-z0-9]", line))
header = "\n".join(lines[:start])
blocks = re.split(r"\n(?=[A-Za-z0-9])", "\n".join(lines[start:]).strip())
# A name has one block per marker where the resolution forks (numpy on Python 3.11 and on 3.12+).
named: dict[str, list[str]] = {}
for block in blocks:
    named.setdefault(re.match(r"[A-Za-z0-9_.-]+", block).group(0).lower(), []).append(block)


def parents(block: str) -> set[str]:
    via = re.search(r"# via (.*)", block)
    return {p.strip().lower() for p in via.group(1).split(",")} if via else set()


def platform_only(block: str) -> bool:
    marker = block.splitlines()[0].partition(";")[2]
    return "sys_platform" in marker or "platform_machine" in marker


torch = {"torch"}
while True:
    grown = torch | {
        name for name, found in named.items()
        if all(platform_only(block) and parents(block) and parents(block) <= torch for block in found)
    }
    if grown == torch:
        break
    torch = grown
assert "torch" in named and "horovod" in named, "the resolution lacks torch or horovod"
for file, names in (
    ("torch.lock", torch),
    ("horovod.lock", {"horovod"}),
    ("trainer.lock", set(named) - torch - {"horovod"}),
):
    kept = [block for name, found in named.items() if name in names for block in found]
    (work / file).write_text(header + "\n" + "\n".join(kept) + "\n")
EOF

mkdir -p "$OUT"
for lock in operator torch horovod trainer; do
    mv "$work/$lock.lock" "$OUT/$lock.lock.tmp"
    mv "$OUT/$lock.lock.tmp" "$OUT/$lock.lock"
    echo "lock.sh: wrote requirements/$lock.lock ($(grep -c '==' "$OUT/$lock.lock") packages)"
done
