#!/usr/bin/env bash
# Build Horovod 0.28.1 for the installed torch and install it; used by the trainer images and by
# `make test`. The wheel is kept under WHEEL_DIR, so a second call installs it without compiling.
#
#   trainer_image/build_horovod.sh [--cached-only] PYTHON WHEEL_DIR
#
# --cached-only: install the kept wheel, or exit 3 without compiling when there is none (the
# trainer images' runtime stages, which have no compiler, install what their build stage made).
#
# Why a script: horovod 0.28.1's sdist compiles with C++14, and torch 2.x headers need C++17, so
# `pip install horovod` fails; the two CMakeLists that set the standard are patched to 17.
# CMAKE_POLICY_VERSION_MINIMUM lets CMake 4 accept the sdist's old minimum version (3.13).
# Frameworks: PyTorch only. Controllers: Gloo always (horovodrun --gloo); MPI with
# HOROVOD_WITH_MPI=1, not with HOROVOD_WITHOUT_MPI=1, else where an MPI compiler (mpicxx) is on
# PATH. GPU collectives: set HOROVOD_GPU_OPERATIONS=NCCL (the CUDA image does; it needs the CUDA
# and NCCL headers of a -devel base). Without it the wheel is CPU-only, also against PyPI's torch,
# which is a CUDA build: no other HOROVOD_GPU* switch reaches the build, NVTX is off, and Horovod
# adds CUDA ops to its torch extension only where torch finds a CUDA toolkit (CUDA_HOME, nvcc;
# none on this project's machines); the check at the end refuses a CPU-only wheel with CUDA in it.
#
# The source distribution is checked against requirements/horovod.lock (hack/lock.sh, beside this
# script's directory; HOROVOD_LOCK names another), which must pin VERSION: pip download
# --require-hashes refuses any other file.
#
# The kept wheel's directory is named by everything the wheel depends on: Horovod's version, the
# torch it was compiled against (its C++ ABI), the Python tag, and the controllers and GPU
# operations it was built with. A wheel built without MPI (no mpicxx then) is not taken for one
# with MPI once Open MPI is installed, and an image whose torch differs from the host's compiles
# its own.
set -euo pipefail

cached_only=false
if [[ "${1:-}" == "--cached-only" ]]; then
    cached_only=true
    shift
fi
PYTHON=${1:?usage: build_horovod.sh [--cached-only] PYTHON WHEEL_DIR}
WHEEL_DIR=${2:?usage: build_horovod.sh [--cached-only] PYTHON WHEEL_DIR}
VERSION=0.28.1
HOROVOD_LOCK=${HOROVOD_LOCK:-$(dirname "$0")/../requirements/horovod.lock}

# Horovod's own switches say whether MPI is wanted (an image's runtime stage has mpirun but no
# mpicxx, yet installs a wheel with MPI); without either, MPI is built where mpicxx is found.
if [[ -n "${HOROVOD_WITH_MPI:-}" ]]; then
    mpi=HOROVOD_WITH_MPI
elif [[ -n "${HOROVOD_WITHOUT_MPI:-}" ]] || ! command -v mpicxx >/dev/null; then
    mpi=HOROVOD_WITHOUT_MPI
else
    mpi=HOROVOD_WITH_MPI
fi
gpu=${HOROVOD_GPU_OPERATIONS:-}
torch_and_python=$("$PYTHON" -c 'import sys, torch; print(f"torch{torch.__version__}-cp{sys.version_info[0]}{sys.version_info[1]}")')
controllers=gloo
[[ "$mpi" == HOROVOD_WITH_MPI ]] && controllers+=-mpi
[[ -n "$gpu" ]] && controllers+="-${gpu,,}"
key="horovod-${VERSION}-${torch_and_python}-${controllers}"

KEY_DIR=$(realpath -m "$WHEEL_DIR/$key")
wheel=$(find "$KEY_DIR" -maxdepth 1 -name "horovod-${VERSION}-*.whl" 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]] && $cached_only; then
    echo "build_horovod.sh: no wheel in $KEY_DIR; compiling needs cmake, a C++ compiler and, for MPI, mpicxx"
    exit 3
fi
if [[ -z "$wheel" ]]; then
    if ! grep -q "^horovod==${VERSION} " "$HOROVOD_LOCK" 2>/dev/null; then
        echo "build_horovod.sh: $HOROVOD_LOCK does not pin horovod==${VERSION}; run make lock" >&2
        exit 1
    fi
    mkdir -p "$KEY_DIR"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --require-hashes -r "$HOROVOD_LOCK" -d "$work"
    tar -xzf "$work/horovod-${VERSION}.tar.gz" -C "$work"
    source_dir="$work/horovod-${VERSION}"
    for cmake_file in "$source_dir/CMakeLists.txt" "$source_dir/horovod/torch/CMakeLists.txt"; do
        grep -q 'CMAKE_CXX_STANDARD 14' "$cmake_file" || {
            echo "build_horovod.sh: $cmake_file no longer sets CMAKE_CXX_STANDARD 14; check the patch" >&2
            exit 1
        }
        sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$cmake_file"
    done
    echo "build_horovod.sh: compiling $key; about 6 minutes on 2 cores"
    gpu_env=(HOROVOD_WITHOUT_NVTX=1)
    [[ -n "$gpu" ]] && gpu_env=(HOROVOD_GPU_OPERATIONS="$gpu")
    env -u HOROVOD_GPU_OPERATIONS -u HOROVOD_GPU_ALLREDUCE -u HOROVOD_GPU_ALLGATHER -u HOROVOD_GPU_BROADCAST \
        -u HOROVOD_GPU_ALLTOALL -u HOROVOD_GPU_REDUCESCATTER -u HOROVOD_GPU "${gpu_env[@]}" \
        HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 "${mpi}=1" \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
        "$PYTHON" -m pip wheel --quiet --no-build-isolation --no-deps "$source_dir" -w "$work/dist"
    wheel="$KEY_DIR/$(basename "$(find "$work/dist" -name 'horovod-*.whl' | head -n 1)")"
    # Renamed into place, so that an interrupted build leaves no wheel that a later call would take.
    mv "$work/dist/$(basename "$wheel")" "$wheel.tmp"
    mv "$wheel.tmp" "$wheel"
fi
# Its dependencies, then the wheel itself even over an installed horovod of the same version
# (which pip would otherwise keep, though built with other controllers).
"$PYTHON" -m pip install --quiet "$wheel"
"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel"
# The installed wheel must have every controller its key names: a wheel put in the wrong
# directory by hand, or a build that silently dropped MPI, stops here.
"$PYTHON" - "$controllers" "$gpu" <<'EOF'
import sys
from importlib.metadata import version

import horovod.torch as hvd

wanted = set(sys.argv[1].split("-"))
built = {
    "gloo": bool(hvd.gloo_built()),
    "mpi": bool(hvd.mpi_built()),
    "nccl": bool(hvd.nccl_built()),
    "cuda": bool(hvd.cuda_built()),
}
missing = sorted(name for name in wanted if not built.get(name))
print("build_horovod.sh: horovod", version("horovod"), " ".join(f"{k} {v}" for k, v in built.items()))
if missing:
    sys.exit(f"build_horovod.sh: the wheel lacks {', '.join(missing)}")
if built["cuda"] and not sys.argv[2]:
    sys.exit("build_horovod.sh: the wheel has CUDA ops, though HOROVOD_GPU_OPERATIONS was not set")
EOF
