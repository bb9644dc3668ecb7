"""kubectl as the tests call it: the built kubectl of the cluster's version, as one user, with the
few compound steps the tests repeat (wait for CRDs, mount a Secret as the kubelet would, route a
Service to a local process, a service account's token).
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster.pki import KeyPair


def endpoint_slice(service: str, namespace: str, address: str, port: int, manager: str) -> dict[str, Any]:
    """An EndpointSlice that gives Service ``namespace/service`` one ready endpoint, ``address``
    on its port ``https`` = ``port``, written by hand: ``manager`` is its
    ``endpointslice.kubernetes.io/managed-by`` label, which keeps the EndpointSlice controller off
    it."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": service,
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": manager,
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }


def cert_user(pair: KeyPair) -> dict[str, str]:
    """A kubeconfig user that authenticates with the client certificate ``pair``."""
    return {"client-certificate": str(pair.cert), "client-key": str(pair.key)}


def kubeconfig_text(server: str, ca: Path, user: Mapping[str, str], server_name: str = "") -> str:
    """A kubeconfig for ``server`` (trusting ``ca``) as ``user`` (``client-certificate`` and
    ``client-key`` paths, or ``token``); with ``server_name``, the name the server's certificate is
    checked for (when ``server``'s address is not among its names)."""
    cluster = {"server": server, "certificate-authority": str(ca)}
    if server_name:
        cluster["tls-server-name"] = server_name
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": cluster}],
            "users": [{"name": "user", "user": dict(user)}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
            "current-context": "test",
        }
    )


@dataclass(frozen=True)
class Kubectl:
    """The kubectl ``binary`` with ``kubeconfig``; called as ``kubectl("get", "pods")``."""

    binary: Path
    kubeconfig: Path

    def __call__(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl ``args`` (as ``kubeconfig`` when given).

        Raises:
            AssertionError: ``check`` and kubectl failed; the message has its stderr.
            subprocess.TimeoutExpired: it ran over ``timeout_s`` seconds.
        """
        result = subprocess.run(
            self.argv(*args, kubeconfig=kubeconfig),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
        return result

    def argv(self, *args: str, kubeconfig: Path | None = None) -> list[str]:
        """The command line of kubectl ``args`` (for a command that runs on, as ``--watch``)."""
        return [str(self.binary), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]

    def get(self, *args: str) -> Any:
        """``kubectl get ARGS -o json`` as a document; None when kubectl fails (not found)."""
        result = self("get", *args, "-o", "json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def apply(self, document: Mapping[str, Any], *flags: str) -> None:
        """``kubectl apply -f -`` of ``document`` (with ``flags``).

        Raises:
            AssertionError: kubectl refused it.
        """
        self("apply", *flags, "-f", "-", input=json.dumps(document))

    def wait_established(self, timeout_s: float = 60.0) -> None:
        """Wait until every CRD the server holds is Established. (``kubectl wait
        --for=condition=Established`` fails at once, rather than waiting, on a CRD so new that it
        has no conditions yet.)

        Raises:
            AssertionError: some were not in ``timeout_s`` seconds, naming them.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            listed = self.get("crd") or {"items": []}
            pending = [
                crd["metadata"]["name"]
                for crd in listed["items"]
                if not any(
                    c.get("type") == "Established" and c.get("status") == "True"
                    for c in (crd.get("status") or {}).get("conditions") or []
                )
            ]
            if not pending:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"CRDs not Established after {timeout_s:.0f} s: {', '.join(pending)}")
            time.sleep(0.2)

    def mount_secret(self, namespace: str, name: str, directory: Path) -> bool:
        """Write Secret ``namespace/name``'s keys as files of ``directory`` (each to a temporary
        name, then renamed), as the kubelet mounts a Secret volume, once it has a ``tls.crt``;
        whether it had one."""
        found = self.get("secret", name, "-n", namespace)
        data = (found or {}).get("data") or {}
        if "tls.crt" not in data:
            return False
        directory.mkdir(parents=True, exist_ok=True)
        for key, value in data.items():
            temporary = directory / f".{key}.tmp"
            temporary.write_bytes(base64.b64decode(value))
            temporary.rename(directory / key)
        return True

    def route_service_to_localhost(self, namespace: str, name: str) -> None:
        """Make Service ``namespace/name`` ``type: ExternalName`` to ``localhost``, so that the API
        server reaches a process of this machine through it (a webhook's Service): nothing routes
        a ClusterIP on this machine."""
        patch = {
            "spec": {
                "type": "ExternalName",
                "externalName": "localhost",
                "clusterIP": None,
                "clusterIPs": None,
                "selector": None,
            }
        }
        self("patch", "service", name, "-n", namespace, "--type=merge", "-p", json.dumps(patch))

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A token of service account ``namespace/name`` from the API server (``TokenRequest``,
        ``kubectl create token``), valid ``seconds``."""
        return self("create", "token", name, "-n", namespace, f"--duration={seconds}s").stdout.strip()

    def events(self, namespace: str | None = None) -> str:
        """The cluster's events, oldest first (for a failed test's report)."""
        scope = ["-n", namespace] if namespace else ["-A"]
        result = self("get", "events", *scope, "--sort-by=.lastTimestamp", check=False)
        return result.stdout + result.stderr
