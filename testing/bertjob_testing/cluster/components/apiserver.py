"""kube-apiserver for the test control plane, on 127.0.0.1 (envtest's flags, and what our tests
add: RBAC with client-certificate users, a service-account signing key for ``TokenRequest``, the
kubelet API for ``kubectl logs`` on kwok's nodes, and an audit log of the training jobs' changes).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bertjob_testing.cluster import pki
from bertjob_testing.cluster.build import executable
from bertjob_testing.cluster.catalog import component
from bertjob_testing.cluster.process import answers, free_port, insecure

SERVICE_CIDR = "10.96.0.0/16"
# The kubernetes Service's ClusterIP: the first of the range.
SERVICE_IP = ipaddress.ip_network(SERVICE_CIDR).network_address + 1
AUDIT_LOG = "audit.log"
# The namespace the tests install the chart into (bertjob_testing.cluster.operator.NAMESPACE).
OPERATOR_NAMESPACE = "bertjob-system"
# What the audit log records: the training jobs' changes, with their bodies (who wrote what to a
# child, which the status alone does not tell: a write that another controller undoes at once
# leaves no trace there), and who patched a BertPretrainJob's status (the trainer pod's progress,
# under its own service account, or the operator).
AUDIT_POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {
            "level": "Request",
            "verbs": ["create", "update", "patch"],
            "resources": [
                {"group": "kubeflow.org", "resources": ["pytorchjobs", "mpijobs"]},
                {"group": "trainer.kubeflow.org", "resources": ["trainjobs"]},
            ],
        },
        {
            "level": "Request",
            "verbs": ["patch"],
            "resources": [{"group": "bertjob.dev", "resources": ["bertpretrainjobs/status"]}],
        },
        # Every request of the chart's ServiceAccounts (the operator's), without bodies: which
        # (verb, resource) it used, for the RBAC audit of the whole cluster tier
        # (tests/cluster/test_rbac_audit.py).
        {"level": "Metadata", "userGroups": [f"system:serviceaccounts:{OPERATOR_NAMESPACE}"]},
        {"level": "None"},
    ],
}


@dataclass
class APIServer:
    """kube-apiserver over ``etcd`` (its client URL), with certificates of ``authority`` and
    service-account keys ``keys``; ``url`` is where it serves once started, ``admin`` a client
    certificate of ``system:masters`` to probe it with.

    ``component_name`` picks the catalog's build: ``kubernetes``, or ``kube-apiserver`` for the
    oldest version the chart claims.

    A second server over the same etcd (an HA control plane's other member) gets another ``name``
    (its certificate and files are named after it), ``issuer`` the first's URL (the tokens the
    first issued are valid here too) and ``audit`` False (the audit log stays the first's alone);
    ``port`` fixes the secure port (0: a free one at each start), so that a server started again
    serves where its clients' kubeconfigs point.
    """

    workdir: Path
    etcd: str
    authority: pki.CertificateAuthority
    keys: pki.KeyPair
    admin: pki.KeyPair
    component_name: str = "kubernetes"
    extra_args: list[str] = field(default_factory=list)
    name: str = "kube-apiserver"
    url: str = ""
    port: int = 0
    issuer: str = ""
    audit: bool = True

    @property
    def version(self) -> str:
        """The version of the catalog's build it runs."""
        return component(self.component_name).version

    def command(self) -> list[str]:
        """kube-apiserver's command with a fresh secure port (:attr:`port` when set)."""
        port = self.port or free_port()
        # The first server's files keep their names; another's are its own, not overwritten under
        # a running server that reloads them.
        prefix = "" if self.name == APIServer.name else f"{self.name}-"
        serving = self.authority.issue(
            f"{prefix}apiserver",
            "kube-apiserver",
            # The kubernetes Service's ClusterIP and names: the real node's pods dial them.
            hosts=(
                "127.0.0.1",
                "localhost",
                str(SERVICE_IP),
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
            ),
            server=True,
        )
        self.url = f"https://127.0.0.1:{port}"
        kubelet_client = self.authority.issue(
            f"{prefix}apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        policy = self.workdir / "audit-policy.yaml"
        policy.write_text(yaml.safe_dump(AUDIT_POLICY))
        audit = [f"--audit-policy-file={policy}", f"--audit-log-path={self.workdir / AUDIT_LOG}"]
        return [
            str(executable(self.component_name, "kube-apiserver")),
            f"--etcd-servers={self.etcd}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.authority.cert}",
            # Node: the real node's kubelet (system:node:<name>) reads and writes its own objects.
            "--authorization-mode=Node,RBAC",
            # On in OpenShift: whoever sets blockOwnerDeletion on an ownerReference (the operator,
            # on every child) must be allowed to update the owner's finalizers.
            "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
            f"--service-account-issuer={self.issuer or self.url}",
            f"--service-account-key-file={self.keys.cert}",
            f"--service-account-signing-key-file={self.keys.key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            # `kubectl logs`: the API server dials the node's InternalIP (127.0.0.1) at its
            # kubelet port, where kwok serves the pod's Logs (its serving certificate is ours).
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-certificate-authority={self.authority.cert}",
            # What the API server shows a kubelet that checks its clients (the real node's).
            f"--kubelet-client-certificate={kubelet_client.cert}",
            f"--kubelet-client-key={kubelet_client.key}",
            *(audit if self.audit else []),
            "--v=1",
        ]

    def environment(self) -> dict[str, str] | None:
        """The caller's."""
        return None

    def ready(self) -> bool:
        """Its /readyz answers the admin."""
        context = insecure()
        context.load_cert_chain(self.admin.cert, self.admin.key)
        return answers(f"{self.url}/readyz", context)
