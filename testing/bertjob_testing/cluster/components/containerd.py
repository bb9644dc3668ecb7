"""containerd 2 for the test cluster's real node: its CRI serves the kubelet, its shim runs
Debian's runc. Everything it keeps (root, state, sockets, runc's state, the pods' network
namespaces, the CNI configuration and IP allocations) is under the node's own directory, so that
two runs on one machine touch nothing of each other's and the end of a run removes it all.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.oci import PAUSE_IMAGE
from bertjob_testing.cluster.process import in_namespaces, with_testing_on_path

# Plugins that would only fail or log here: other snapshotters, tracing.
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass
class Containerd:
    """containerd in the node's network namespace ``netns`` with its files under ``workdir`` and
    the network configurations of ``cni_conf``; ``socket`` is its CRI and API endpoint."""

    workdir: Path
    cni_conf: Path
    netns: Path
    extra_args: list[str] = field(default_factory=list)
    name: str = "containerd"
    version: str = field(default_factory=lambda: component("containerd").version)

    @property
    def socket(self) -> Path:
        """Its gRPC socket (the CRI endpoint the kubelet is given)."""
        return self.workdir / "containerd.sock"

    def config(self) -> str:
        """Its configuration (version 3, containerd 2's): the pinned sandbox image is ours, runc is
        Debian's with its state here, the pods' network namespaces are mounted under the state
        directory, the CNI plugins are the catalog's."""
        runc = shutil.which("runc") or "/usr/sbin/runc"
        cni_bin = executable("cni-plugins", "bridge").parent
        sections: dict[str, dict[str, object]] = {
            "": {
                "version": 3,
                "root": str(self.workdir / "root"),
                "state": str(self.workdir / "state"),
                "disabled_plugins": list(DISABLED_PLUGINS),
            },
            "grpc": {"address": str(self.socket)},
            "ttrpc": {"address": str(self.workdir / "containerd.sock.ttrpc")},
            "plugins.'io.containerd.cri.v1.images'": {"snapshotter": "overlayfs"},
            "plugins.'io.containerd.cri.v1.images'.pinned_images": {"sandbox": PAUSE_IMAGE},
            "plugins.'io.containerd.cri.v1.runtime'": {
                "netns_mounts_under_state_dir": True,
                # The sandbox these tests run in withholds CAP_SYS_RESOURCE even from root, so
                # runc cannot lower oom_score_adj below ours (the kubelet asks -998 for pause).
                "restrict_oom_score_adj": True,
                "tolerate_missing_hugetlb_controller": True,
                "disable_hugetlb_controller": True,
                "cdi_spec_dirs": [],
            },
            "plugins.'io.containerd.cri.v1.runtime'.containerd": {"default_runtime_name": "runc"},
            "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc": {
                "runtime_type": "io.containerd.runc.v2"
            },
            "plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options": {
                "BinaryName": runc,
                "Root": str(self.workdir / "runc"),
                "SystemdCgroup": False,
            },
            "plugins.'io.containerd.cri.v1.runtime'.cni": {
                "bin_dirs": [str(cni_bin)],
                "conf_dir": str(self.cni_conf),
                "max_conf_num": 1,
            },
            "plugins.'io.containerd.grpc.v1.cri'": {
                "disable_tcp_service": True,
                "stream_server_address": "127.0.0.1",
                "stream_server_port": "0",
            },
        }
        lines = []
        for header, values in sections.items():
            if header:
                lines.append(f"\n[{header}]")
            lines.extend(f"{key} = {_toml(value)}" for key, value in values.items())
        return "\n".join(lines) + "\n"

    def command(self) -> list[str]:
        """Its command, its configuration written first."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.toml"
        config.write_text(self.config())
        return [
            *in_namespaces(f"--netns={self.netns}"),
            str(executable("containerd", "containerd")),
            f"--config={config}",
            "--log-level=info",
        ]

    def environment(self) -> dict[str, str] | None:
        """Its shim beside it on the PATH (containerd starts ``containerd-shim-runc-v2`` from there)."""
        shim = executable("containerd", "containerd-shim-runc-v2").parent
        return with_testing_on_path(
            {**os.environ, "PATH": os.pathsep.join([str(shim), os.environ.get("PATH", "")])}
        )

    def ready(self) -> bool:
        """Its socket is there."""
        return self.socket.is_socket()
