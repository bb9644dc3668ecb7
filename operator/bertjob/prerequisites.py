"""What the operator needs installed in the cluster before it can serve jobs: the CRDs.

Without the BertPretrainJob CRD kopf keeps running but serves nothing, and says so only as a
``Selector(...)`` repr among its warnings. :func:`wait_for_crds` instead says once, in plain words,
which CRD is missing and how to install it, keeps the readiness probe failing until it exists, and
looks again every :data:`RETRY_S` seconds (kopf itself starts serving the resource when the CRD
appears). A missing Kubeflow CRD only disables that launcher, so it is reported once and does not
hold readiness back.

The check lists CRDs with a ``metadata.name`` field selector: the ``list`` verb that kopf's own
CRD watch already needs, so the operator's RBAC grows by nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from bertjob.children import call
from bertjob.launchers import registry
from bertjob_api.spec import GROUP, KIND, PLURAL

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
OWN_CRD = f"{PLURAL}.{GROUP}"
RETRY_S = 30.0
# Seconds between checks, where an installation (or a test) wants another pace than RETRY_S.
RETRY_ENV = "BERTJOB_CRD_RETRY_SECONDS"
INSTALL_HINT = (
    "install it with the chart (helm upgrade --install bertjob charts/bertjob --set crds.install=true) "
    "or kubectl apply -f manifests/crd.yaml"
)

log = logging.getLogger("bertjob.prerequisites")


def launcher_crds() -> dict[str, str]:
    """CRD name of each launcher's training job, by ``spec.launcher`` value
    (``pytorchjob`` -> ``pytorchjobs.kubeflow.org``)."""
    return {
        name: f"{launcher.child.plural}.{launcher.child.api_version.split('/')[0]}"
        for name, launcher in registry.LAUNCHERS.items()
    }


def installed(api: ApiClient, names: Iterable[str]) -> set[str]:
    """Which of the CRDs ``names`` exist.

    Raises:
        ApiException: the API server refused the list or failed.
    """
    found: set[str] = set()
    for name in names:
        answer = call(api, "GET", f"{CRD_PATH}?fieldSelector=metadata.name%3D{name}")
        # Filtered here too: a server that ignores the selector answers with every CRD.
        found |= {item["metadata"]["name"] for item in answer.get("items") or []} & {name}
    return found


def report_launchers(api: ApiClient) -> None:
    """Log one warning per launcher whose Kubeflow CRD is missing (its jobs fail to create)."""
    wanted = launcher_crds()
    present = installed(api, wanted.values())
    for launcher, crd_name in wanted.items():
        if crd_name not in present:
            log.warning(
                "the %s CRD is not installed: jobs with spec.launcher %s cannot create their training "
                "job until its Kubeflow operator is installed",
                crd_name,
                launcher,
            )


def wait_for_crds(
    api: ApiClient, ready: threading.Event, stop: threading.Event, retry_s: float = RETRY_S
) -> None:
    """Set ``ready`` once the BertPretrainJob CRD exists, checking every ``retry_s`` seconds
    until ``stop`` is set; report missing CRDs once each (see the module's docstring).

    API errors are logged and retried at the same pace: this runs in its own thread, and the
    operator must not die because the API server was briefly away at start.
    """
    said_missing = said_error = False
    while not stop.is_set():
        try:
            present = OWN_CRD in installed(api, [OWN_CRD])
        except ApiException as error:
            if not said_error:
                log.warning(
                    "cannot list CRDs (HTTP %s %s); trying again every %.0f s",
                    error.status,
                    error.reason,
                    retry_s,
                )
            said_error = True
        else:
            if present:
                if said_missing:
                    log.info("the %s CRD is installed now: serving %ss", OWN_CRD, KIND)
                try:
                    report_launchers(api)
                except ApiException as error:
                    log.warning("cannot list the Kubeflow CRDs (HTTP %s %s)", error.status, error.reason)
                ready.set()
                return
            if not said_missing:
                log.error(
                    "the %s CRD is not installed, so no %s can be served: %s. Checking again every "
                    "%.0f s; not ready until then",
                    OWN_CRD,
                    KIND,
                    INSTALL_HINT,
                    retry_s,
                )
            said_missing = True
        stop.wait(retry_s)


def start(api: ApiClient, ready: threading.Event, retry_s: float = RETRY_S) -> threading.Event:
    """Run :func:`wait_for_crds` in a daemon thread; set the returned event to stop it."""
    stop = threading.Event()
    threading.Thread(
        target=wait_for_crds, args=(api, ready, stop, retry_s), name="crd-check", daemon=True
    ).start()
    return stop
