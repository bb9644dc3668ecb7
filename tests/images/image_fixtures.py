"""The images built for real, once per session, and run as a cluster would run them: fixtures of
every folder (tests/conftest.py loads this as a plugin), since the real node's tests run the images
too.

``hack/build-images.sh --local`` builds the operator and the Xeon trainer image with buildah on a
Debian bookworm made here (no image registry is needed); buildah's storage and the base tarball
stay in ``$BERTJOB_CACHE`` (``hack/build-images.sh --cache-dir``: ~/.cache/bertjob/build), and the
next session or checkout reuses every unchanged layer. The tests start the images
with ``buildah run`` (:mod:`buildah_images`).

Everything here skips, saying why, where buildah cannot run (not installed, not root); a build
that fails is a test failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.images.buildah_images import BUILD, Buildah, Built, build, build_cache


def _why_not() -> str | None:
    """Why the images cannot be built here, or None."""
    if shutil.which("buildah") is None:
        return "buildah is not installed (hack/install-image-tools.sh installs it as root on Debian)"
    if os.geteuid() != 0:
        return "buildah builds and runs the images as root here (chroot isolation); not root"
    cache = build_cache()
    if shutil.which("mmdebstrap") is None and not (cache / "images" / "debian-bookworm.tar").exists():
        return f"mmdebstrap is not installed, and the Debian base it makes is not in {cache}/images"
    return None


@pytest.fixture(scope="session")
def buildah() -> Buildah:
    """buildah on the image storage of hack/build-images.sh (skips where it cannot run)."""
    if (reason := _why_not()) is not None:
        pytest.skip(reason)
    flags = subprocess.run(
        [str(BUILD), "--buildah-flags"], capture_output=True, text=True, check=True, timeout=60
    ).stdout.split("\n")
    return Buildah(tuple(flag for flag in flags if flag))


@pytest.fixture(scope="session")
def operator_image(buildah: Buildah, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The operator image, built by hack/build-images.sh --local (skips without kubectl, which
    stands in for Kubernetes' kubectl image)."""
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the operator image's stand-in kubectl image copies it")
    return build("operator", buildah, tmp_path_factory.mktemp("image-builds"))


@pytest.fixture(scope="session")
def xeon_image(buildah: Buildah, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The Xeon trainer image, built by hack/build-images.sh --local, with the Horovod wheel that
    `make test` compiled into $BERTJOB_CACHE/wheels when it is there."""
    return build("xeon", buildah, tmp_path_factory.mktemp("image-builds"))
