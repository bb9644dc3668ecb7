#!/usr/bin/env bash
# The system tools that `make test` uses beyond Python, from Debian's archive:
#   buildah, mmdebstrap       build and run the images in tests/images (hack/build-images.sh --local)
#   libopenmpi-dev, openmpi-bin  Horovod's MPI controller (mpicxx) and mpirun for the MPIJob tests
#   cmake, g++, make          compile Horovod (trainer_image/build_horovod.sh)
#   runc, iptables            the real node's OCI runtime (containerd's shim runs it) and kube-proxy's rules
#
#   hack/install-image-tools.sh
#
# As root on Debian or Ubuntu, the missing ones are installed with apt-get (after apt-get update).
# Otherwise it only says what is missing: the image tests then skip, and Horovod is built without
# MPI (or not at all without a compiler). It exits 0 either way, so that `make test` goes on.
# podman is not needed: buildah imports the Debian base and runs the images itself.
set -uo pipefail

PACKAGES=(buildah mmdebstrap libopenmpi-dev openmpi-bin cmake g++ make runc iptables)

missing=()
for package in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$package")
    fi
done
if ((${#missing[@]} == 0)); then
    echo "install-image-tools.sh: all there (${PACKAGES[*]})"
    exit 0
fi

if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "install-image-tools.sh: installing ${missing[*]}"
    if apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
        exit 0
    fi
    echo "install-image-tools.sh: WARNING: apt-get could not install ${missing[*]}" >&2
else
    echo "install-image-tools.sh: missing ${missing[*]}; install them as root with apt-get" \
        "(this is not root on Debian, so nothing was installed)" >&2
fi
echo "install-image-tools.sh: without buildah and mmdebstrap tests/images skip; without libopenmpi-dev" \
    "Horovod has no MPI controller; without cmake and g++ it cannot be compiled" >&2
exit 0
