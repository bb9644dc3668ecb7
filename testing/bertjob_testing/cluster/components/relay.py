"""The real node's way to the API server, which listens on 127.0.0.1 alone: a relay of this
machine's end of the node's link (an address the node's namespace and its pods route to) to the
API server's port, so that the kubelet, kube-proxy, CoreDNS and the pods (through the
``kubernetes`` Service) reach it."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from bertjob_testing.cluster.process import free_port, takes_connections, with_testing_on_path


@dataclass
class Relay:
    """A relay from ``address``:``port`` to 127.0.0.1:``target``."""

    address: str
    target: int
    extra_args: list[str] = field(default_factory=list)
    name: str = "api-relay"
    version: str = "-"
    port: int = 0

    def command(self) -> list[str]:
        """Its command, on a fresh port."""
        self.port = free_port()
        relay = f"--relay={self.address}:{self.port}:{self.target}"
        return [sys.executable, "-m", "bertjob_testing.cluster.namespaces", relay]

    def environment(self) -> dict[str, str] | None:
        """This package on the path."""
        return with_testing_on_path()

    def ready(self) -> bool:
        """It takes connections."""
        return takes_connections(self.address, self.port)
