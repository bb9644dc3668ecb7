#!/usr/bin/env bash
# Build Horovod 0.28.1 for the installed torch and install it; used by the trainer image and by
# `make test`. The wheel is kept in WHEEL_DIR, so a second call installs it without compiling.
#
#   trainer_image/build_horovod.sh PYTHON WHEEL_DIR
#
# Why a script: horovod 0.28.1's sdist compiles with C++14, and torch 2.x headers need C++17, so
# `pip install horovod` fails; the two CMakeLists that set the standard are patched to 17.
# CMAKE_POLICY_VERSION_MINIMUM lets CMake 4 accept the sdist's old minimum version (3.13).
# Frameworks: PyTorch only. Controllers: Gloo always (horovodrun --gloo), MPI where an MPI
# compiler (mpicxx) is on PATH. GPU collectives: set HOROVOD_GPU_OPERATIONS=NCCL (the CUDA image
# does; it needs the CUDA and NCCL headers of a -devel base).
set -euo pipefail

PYTHON=${1:?usage: build_horovod.sh PYTHON WHEEL_DIR}
WHEEL_DIR=${2:?usage: build_horovod.sh PYTHON WHEEL_DIR}
VERSION=0.28.1

mkdir -p "$WHEEL_DIR"
WHEEL_DIR=$(cd "$WHEEL_DIR" && pwd)
wheel=$(find "$WHEEL_DIR" -maxdepth 1 -name "horovod-${VERSION}-*.whl" | head -n 1)
if [[ -z "$wheel" ]]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "horovod==${VERSION}" -d "$work"
    tar -xzf "$work/horovod-${VERSION}.tar.gz" -C "$work"
    source_dir="$work/horovod-${VERSION}"
    for cmake_file in "$source_dir/CMakeLists.txt" "$source_dir/horovod/torch/CMakeLists.txt"; do
        grep -q 'CMAKE_CXX_STANDARD 14' "$cmake_file" || {
            echo "build_horovod.sh: $cmake_file no longer sets CMAKE_CXX_STANDARD 14; check the patch" >&2
            exit 1
        }
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$cmake_file"
    done
    if command -v mpicxx >/dev/null; then mpi=HOROVOD_WITH_MPI; else mpi=HOROVOD_WITHOUT_MPI; fi
    echo "build_horovod.sh: compiling horovod ${VERSION} (PyTorch, Gloo, ${mpi}); about 6 minutes on 2 cores"
    env HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 "${mpi}=1" \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
        "$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps "$source_dir" -w "$work/dist"
    wheel="$WHEEL_DIR/$(basename "$(find "$work/dist" -name 'horovod-*.whl' | head -n 1)")"
    mv "$work/dist/$(basename "$wheel")" "$wheel.tmp"
    mv "$wheel.tmp" "$wheel"
fi
# Its dependencies, then the wheel itself even over an installed horovod of the same version
# (which pip would otherwise keep, though built with other controllers).
"$PYTHON" -m pip install --quiet "$wheel"
"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel"
"$PYTHON" -c "import horovod.torch as hvd; from importlib.metadata import version
print('build_horovod.sh: horovod', version('horovod'), 'gloo', hvd.gloo_built(), 'mpi', hvd.mpi_built())"
