"""The one build step pyproject.toml cannot declare: the wheel carries the repository's
``kustomize/`` tree as ``bertjob/kustomize`` (package data of the operator's package), so that an
installed ``bertjob render`` finds the overlays it builds (``bertjob.render.kustomize_dir``). The tree
stays at the top of the repository, where ``kubectl apply -k`` users and the images find it; an
editable install reads it there. Everything else about the package is in pyproject.toml."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KUSTOMIZE = Path(__file__).resolve().parent / "kustomize"


class BuildPy(build_py):
    """``build_py`` that copies ``kustomize/`` into the built ``bertjob`` package. A build without
    ``operator/`` (the trainer image copies only ``api/`` and ``trainer_image/``) has no ``bertjob``
    package and needs no tree."""

    def run(self) -> None:
        super().run()
        package = Path(self.build_lib) / "bertjob"
        if self.editable_mode or not package.is_dir():
            return
        if not (KUSTOMIZE / "base" / "kustomization.yaml").is_file():
            raise SystemExit(f"setup.py: {KUSTOMIZE} has no base/kustomization.yaml: bertjob render needs it")
        shutil.copytree(KUSTOMIZE, package / "kustomize", dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPy})
