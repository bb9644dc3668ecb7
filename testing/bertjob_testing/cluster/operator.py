"""The operator on the real control plane, installed as a platform team installs it.

:func:`install` applies Kubeflow's CRDs (from the controllers' modules), then ``helm install``s
``charts/bertjob`` with its webhook on (the chart's own certificates), and runs the operator as a
local process (``kopf run``, as the chart's Deployment runs it) with the credentials of the
chart's ServiceAccount: a ``TokenRequest`` token, so the real API server holds it to the chart's
RBAC. The chart's Deployment also exists, and kwok runs its pod on a fake node, where nothing runs.

The API server calls the webhook through the chart's Service, made ``type: ExternalName`` to
``localhost``; that kind of Service takes its port from the webhook configuration, so the
configuration's ``service.port`` is set to the local operator's port (its path stays the chart's).

:class:`RealCluster` is :class:`bertjob_testing.kube_emulator.Cluster` over the real server: the
same calls, with :meth:`RealCluster.stored` reading the server instead of the emulator's store.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.config import new_client_from_config

from bertjob import progress
from bertjob.admission import ADDRESS_ENV, CERT_DIR_ENV, PORT_ENV
from bertjob_api.contract import KIND
from bertjob_testing.cluster.build import crds
from bertjob_testing.cluster.catalog import REPO
from bertjob_testing.cluster.components.apiserver import OPERATOR_NAMESPACE
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.nodes import EXIT_CODE_ANNOTATION
from bertjob_testing.cluster.process import free_port, takes_connections
from bertjob_testing.kube_emulator import Cluster

CHART = REPO / "charts" / "bertjob"
RELEASE = "bertjob"
NAMESPACE = OPERATOR_NAMESPACE
OPERATOR = f"{RELEASE}-operator"
WEBHOOK_SERVICE = f"{OPERATOR}-webhook"
WEBHOOK_SECRET = f"{OPERATOR}-webhook-tls"
# Where the chart's operator keeps its progress endpoint's certificate (charts/bertjob/README.md).
PROGRESS_SECRET = f"{OPERATOR}-progress-tls"
START_WAIT_S = 60.0


def get_json(api: ApiClient, path: str, query: list[tuple[str, str]] | None = None) -> Any:
    """GET ``path`` of the API server as JSON.

    Raises:
        kubernetes.client.exceptions.ApiException: the server answered an error.
    """
    method, url, headers, body, post = api.param_serialize(
        "GET",
        path,
        query_params=query or [],
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
    )
    response = api.call_api(method, url, headers, body, post)
    data = response.read()
    if not 200 <= response.status < 300:
        raise ApiException(status=response.status, reason=response.reason)
    return json.loads(data)


def resource_path(group_version_plural: str, namespace: str | None = None) -> str:
    """The REST path of a resource: ``v1/configmaps`` or ``kubeflow.org/v1/pytorchjobs``, in
    ``namespace`` or in all."""
    *group_version, plural = group_version_plural.split("/")
    prefix = f"/api/{group_version[0]}" if len(group_version) == 1 else f"/apis/{'/'.join(group_version)}"
    return f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"


@attrs.define
class RealCluster(Cluster):
    """The operator and a client of the real API server (``server`` is None: there is no
    emulator); ``plane`` is the control plane.

    The calls of :class:`Cluster` that name no namespace act in ``default_namespace`` (a test's
    own: tests/cluster/conftest.py's ``cluster`` fixture sets it), where the emulator's act in
    ``default``."""

    plane: ControlPlane | None = None
    default_namespace: str = "default"

    def start(self) -> None:
        """Start the operator and wait until its liveness endpoint answers and its webhook port
        takes connections: kopf opens the webhook's port a few tens of milliseconds after the
        liveness endpoint, and a job applied in between is refused (failurePolicy: Fail)."""
        super().start()
        if port := self.env.get(PORT_ENV):
            self.wait_for("the webhook's port", lambda: takes_connections("127.0.0.1", int(port)))

    def create_job(self, document: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create a BertPretrainJob; the object as stored."""
        return super().create_job(document, namespace or self.default_namespace)

    def job(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """A BertPretrainJob as stored."""
        return super().job(name, namespace or self.default_namespace)

    def patch_job(self, name: str, patch: dict[str, Any], namespace: str | None = None) -> None:
        """Merge-patch a BertPretrainJob, as ``kubectl patch --type merge`` would."""
        super().patch_job(name, patch, namespace or self.default_namespace)

    def object(
        self, group_version_plural: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """One live object of a resource; None if there is none."""
        return super().object(group_version_plural, name, namespace or self.default_namespace)

    def report(
        self, group_version_plural: str, name: str, status: dict[str, Any], namespace: str | None = None
    ) -> None:
        """Patch a child's status subresource, as Kubeflow's operator would (the real server
        holds it to the CRD's status schema)."""
        super().report(group_version_plural, name, status, namespace or self.default_namespace)

    def events(self, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The Events about the BertPretrainJob ``name`` (not those the real cluster's controllers
        post about a child or pod of the same name)."""
        return [
            event
            for event in super().events(name, namespace or self.default_namespace)
            if (event.get("involvedObject") or {}).get("kind") == KIND
        ]

    def live_pods(self, selector: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The pods that ``selector`` (a label selector) picks, by name, those being deleted left
        out."""
        path = resource_path("v1/pods", namespace or self.default_namespace)
        found = get_json(self.api, path, [("labelSelector", selector)])["items"]
        live = [pod for pod in found if not pod["metadata"].get("deletionTimestamp")]
        return sorted(live, key=lambda pod: str(pod["metadata"]["name"]))

    def end_pod(self, name: str, exit_code: int, namespace: str | None = None) -> None:
        """End running pod ``name``: every container exits ``exit_code`` (kwok's stage: Succeeded
        for 0, else Failed)."""
        CoreV1Api(self.api).patch_namespaced_pod(
            name,
            namespace or self.default_namespace,
            {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: str(exit_code)}}},
        )

    def end_pods(self, selector: str, exit_code: int, namespace: str | None = None) -> list[str]:
        """End the pods that ``selector`` (a label selector) picks, once there is at least one and
        all run, with every container exiting ``exit_code`` (:meth:`end_pod`); the pods' names.

        Raises:
            WaitTimeoutError: no pod ran.
        """

        def running() -> list[str] | None:
            live = self.live_pods(selector, namespace)
            if live and all(pod.get("status", {}).get("phase") == "Running" for pod in live):
                return [str(pod["metadata"]["name"]) for pod in live]
            return None

        names = self.wait_for(f"pods {selector} running", running)
        for name in names:
            self.end_pod(name, exit_code, namespace)
        return names

    def stored(self, group_version_plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every live object of a resource, as the API server lists it (none when the resource
        is not served)."""
        try:
            return list(get_json(self.api, resource_path(group_version_plural, namespace))["items"])
        except ApiException as error:
            if error.status == 404:
                return []
            raise


def helm_binary() -> str:
    """helm beside this interpreter (make installs it into .venv/bin), else on PATH.

    Raises:
        FileNotFoundError: neither.
    """
    beside = Path(sys.executable).with_name("helm")
    found = str(beside) if beside.is_file() else shutil.which("helm")
    if found is None:
        raise FileNotFoundError("helm is not installed: `make .venv/bin/helm` (hack/install-helm.sh)")
    return found


def helm(plane: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm against the control plane as its admin.

    Raises:
        AssertionError: ``check`` and helm failed; the message has its stderr.
    """
    result = subprocess.run(
        [helm_binary(), f"--kubeconfig={plane.admin}", *args], capture_output=True, text=True, timeout=180
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


# The components of the catalog whose CRDs are the children our operator makes.
KUBEFLOW = ("training-operator", "mpi-operator", "trainer")


def apply_upstream_crds(plane: ControlPlane) -> None:
    """Apply the CRDs the catalog lists for :data:`KUBEFLOW` (server-side, as Kubeflow's install
    does) and wait until the server serves them."""
    for name in KUBEFLOW:
        for path in crds(name):
            plane.kubectl("apply", "--server-side", "-f", str(path))
    plane.kubectl.wait_established()


def install_chart(plane: ControlPlane, *flags: str, chart: Path = CHART) -> None:
    """Kubeflow's CRDs, then ``helm install`` of ``chart`` (this checkout's) with its webhook on
    and ``flags``.

    Raises:
        AssertionError: helm or kubectl failed.
    """
    apply_upstream_crds(plane)
    helm(
        plane,
        "install",
        RELEASE,
        str(chart),
        f"--namespace={NAMESPACE}",
        "--create-namespace",
        "--set=webhook.enabled=true",
        *flags,
    )


def install(
    plane: ControlPlane, workdir: Path, *values: str, chart: Path = CHART, env: Mapping[str, str] = {}
) -> RealCluster:
    """Install ``chart`` (webhook on, ``values`` as ``--set`` arguments) and start the operator
    under the chart's ServiceAccount, in the namespaces its Deployment names (``--namespace`` per
    ``watchNamespaces`` entry) or in all, with ``env`` added to its environment; the returned
    cluster's operator is running.

    Raises:
        AssertionError: helm or kubectl failed.
        bertjob_testing.kube_emulator.WaitTimeoutError: the operator did not start.
    """
    install_chart(plane, *(f"--set={value}" for value in values), chart=chart)
    plane.kubectl.wait_established()
    port, progress_port = free_port(), free_port()
    certs = workdir / "webhook-certs"
    assert plane.kubectl.mount_secret(NAMESPACE, WEBHOOK_SECRET, certs), (
        f"the chart's Secret {WEBHOOK_SECRET}"
    )
    plane.kubectl.route_service_to_localhost(NAMESPACE, WEBHOOK_SERVICE)
    route_webhook_port(plane, port)
    deployment = json.loads(
        plane.kubectl("get", "deployment", OPERATOR, "-n", NAMESPACE, "-o", "json").stdout
    )
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    # kopf's scope as the chart's pod would run it: the Deployment's own --namespace arguments.
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "operator"]
    scope = [arg for arg in container["command"] if arg.startswith("--namespace=")]
    token = plane.kubectl.service_account_token(NAMESPACE, account, seconds=6 * 3600)
    cluster = RealCluster(
        new_client_from_config(config_file=str(plane.admin)),
        None,  # type: ignore[arg-type]
        workdir,
        plane.kubeconfig_for_token(workdir / "operator.kubeconfig", token),
        start_wait_s=START_WAIT_S,
        namespaces=tuple(arg.removeprefix("--namespace=") for arg in scope),
        env={
            CERT_DIR_ENV: str(certs),
            PORT_ENV: str(port),
            ADDRESS_ENV: "127.0.0.1",
            # The progress endpoint as the chart configures it, on this machine's loopback: its
            # certificate in the chart's Secret name, made by the operator under the chart's RBAC.
            progress.URL_ENV: f"https://127.0.0.1:{progress_port}",
            progress.SECRET_ENV: f"{NAMESPACE}/{PROGRESS_SECRET}",
            progress.PORT_ENV: str(progress_port),
            progress.ADDRESS_ENV: "127.0.0.1",
            **env,
        },
        plane=plane,
    )
    cluster.start()
    return cluster


def route_webhook_port(plane: ControlPlane, port: int) -> None:
    """Point every webhook of the chart's ValidatingWebhookConfiguration at ``port`` (an
    ExternalName Service has no port mapping of its own)."""
    name = OPERATOR
    configuration = json.loads(
        plane.kubectl("get", "validatingwebhookconfiguration", name, "-o", "json").stdout
    )
    patch = [
        {"op": "replace", "path": f"/webhooks/{index}/clientConfig/service/port", "value": port}
        for index, _ in enumerate(configuration["webhooks"])
    ]
    plane.kubectl("patch", "validatingwebhookconfiguration", name, "--type=json", "-p", json.dumps(patch))


# A namespace labelled so is not served by the webhook (:func:`skip_webhook_in_labelled_namespaces`):
# there the API server stores what only the webhook would refuse, as on a cluster where the chart's
# webhook is off (its default), and the operator refuses it after the fact.
UNSERVED_LABEL = "bertjob.dev/test-webhook"
UNSERVED_VALUE = "skip"


def skip_webhook_in_labelled_namespaces(plane: ControlPlane) -> None:
    """Give every webhook of the chart's configuration a ``namespaceSelector`` that leaves out the
    namespaces labelled :data:`UNSERVED_LABEL` = :data:`UNSERVED_VALUE` (the chart sets one only
    for ``watchNamespaces``, which this install leaves empty)."""
    configuration = json.loads(
        plane.kubectl("get", "validatingwebhookconfiguration", OPERATOR, "-o", "json").stdout
    )
    selector = {
        "matchExpressions": [{"key": UNSERVED_LABEL, "operator": "NotIn", "values": [UNSERVED_VALUE]}]
    }
    patch = [
        {"op": "add", "path": f"/webhooks/{index}/namespaceSelector", "value": selector}
        for index, _ in enumerate(configuration["webhooks"])
    ]
    plane.kubectl("patch", "validatingwebhookconfiguration", OPERATOR, "--type=json", "-p", json.dumps(patch))


def uninstall(cluster: RealCluster) -> None:
    """Stop the operator and ``helm uninstall`` the chart (the CRD stays, as Helm leaves CRDs)."""
    cluster.stop()
    assert cluster.plane is not None
    helm(cluster.plane, "uninstall", RELEASE, f"--namespace={NAMESPACE}", "--wait", check=False)


def wait_until(what: str, probe: Any, wait_s: float = 60.0) -> Any:
    """Poll ``probe()`` until truthy.

    Raises:
        AssertionError: not within ``wait_s`` seconds, naming ``what``.
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"waited {wait_s:.0f} s for {what}")


def is_paused(log: str) -> bool:
    """Whether a replica in the chart's peering (bertjob.replicas) has paused for another, from its
    log: kopf starts a replica of a mandatory peering paused, logs "Resuming operations" when it
    finds no higher priority and "Pausing operations in favour of" when one appears later; a
    replica that found a higher one at its start logs neither."""
    resumed, paused = log.rfind("Resuming operations"), log.rfind("Pausing operations")
    return resumed < 0 or paused > resumed
