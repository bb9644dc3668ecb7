"""OCI image archives written here, for images the test node needs that no registry can give it:
the pause image of every pod sandbox, built from Kubernetes' own ``build/pause/linux/pause.c``,
with the tests' own probe of a pod's network beside it (``probe/main.go``).

An archive is an OCI image layout in a tar (``oci-layout``, ``index.json``, ``blobs/sha256/``, as
the OCI image-spec's ``image-layout.md`` lays it out), which ``ctr images import`` takes. Layers are
written with fixed times, owners and order, so the same files give the same digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertjob_testing.cluster.build import source

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
PAUSE_IMAGE = "bertjob.dev/test/pause:3.10"


@dataclass(frozen=True)
class Blob:
    """A blob of the layout: its bytes and its descriptor's fields."""

    data: bytes
    media_type: str

    @property
    def digest(self) -> str:
        """``sha256:<hex>`` of the bytes."""
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **more: Any) -> dict[str, Any]:
        """The OCI descriptor of this blob (``more`` adds fields: annotations)."""
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **more}


def layer(files: dict[str, tuple[bytes, int]]) -> tuple[Blob, str]:
    """A gzipped layer of ``files`` (path in the image: (bytes, mode)), root-owned, mtime 0; the
    blob and the digest of its uncompressed tar (the config's ``diff_ids``)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            archive.addfile(info, io.BytesIO(data))
    tar = raw.getvalue()
    return Blob(gzip.compress(tar, mtime=0), LAYER), "sha256:" + hashlib.sha256(tar).hexdigest()


def write_archive(path: Path, name: str, files: dict[str, tuple[bytes, int]], entrypoint: list[str]) -> Path:
    """An OCI archive at ``path`` of image ``name`` (a full reference: ``registry/repo:tag``) with
    one layer of ``files`` and ``entrypoint``, for linux/amd64; written to a temporary name, then
    renamed."""
    blob, diff_id = layer(files)
    config = Blob(
        json.dumps(
            {
                "architecture": "amd64",
                "os": "linux",
                "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
                "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            },
            sort_keys=True,
        ).encode(),
        CONFIG,
    )
    manifest = Blob(
        json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST,
                "config": config.descriptor(),
                "layers": [blob.descriptor()],
            },
            sort_keys=True,
        ).encode(),
        MANIFEST,
    )
    tag = name.rpartition(":")[2]
    index = {
        "schemaVersion": 2,
        "manifests": [
            manifest.descriptor(
                annotations={"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag}
            )
        ],
    }
    entries = {
        "oci-layout": json.dumps({"imageLayoutVersion": "1.0.0"}).encode(),
        "index.json": json.dumps(index, sort_keys=True).encode(),
        **{f"blobs/sha256/{each.digest.partition(':')[2]}": each.data for each in (blob, config, manifest)},
    }
    temporary = path.with_name(f".{path.name}.tmp")
    with tarfile.open(temporary, "w") as archive:
        for entry, data in entries.items():
            info = tarfile.TarInfo(entry)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    temporary.rename(path)
    return path


def pause_archive(directory: Path) -> Path:
    """The pause image (:data:`PAUSE_IMAGE`) as an OCI archive in ``directory``: Kubernetes'
    pause.c of the pinned version, compiled statically here (``cc``), and ``/probe``, the tests'
    probe (``probe lookup NAME``, ``probe connect HOST:PORT``, ``probe serve PORT``), built with
    Go's standard library alone.

    Raises:
        subprocess.CalledProcessError: a compiler failed (its stderr in the error).
    """
    directory.mkdir(parents=True, exist_ok=True)
    binary = directory / "pause"
    pause_c = source("kubernetes") / "build" / "pause" / "linux" / "pause.c"
    subprocess.run(
        ["cc", "-Os", "-static", "-DVERSION=bertjob-test", "-o", str(binary), str(pause_c)],
        check=True,
        capture_output=True,
    )
    probe = directory / "probe"
    subprocess.run(
        [
            "go",
            "build",
            "-trimpath",
            "-ldflags=-s",
            "-o",
            str(probe),
            str(Path(__file__).with_name("probe") / "main.go"),
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": ""},
        cwd=directory,
    )
    files = {"/pause": (binary.read_bytes(), 0o755), "/probe": (probe.read_bytes(), 0o755)}
    return write_archive(directory / "pause.tar", PAUSE_IMAGE, files, ["/pause"])
