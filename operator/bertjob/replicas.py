"""Several replicas of the operator, one of them reconciling: kopf's peering.

Every replica serves the admission webhook and the progress endpoint (neither depends on which one
reconciles), so that a rolling update or a lost pod refuses no ``kubectl apply``; only one handles
jobs. kopf's peering decides which: each replica writes its priority into the ClusterKopfPeering
``$BERTJOB_PEERING`` every few seconds, and a replica that sees a higher priority pauses its
handlers until that peer's record is gone (removed at a clean exit, expired :data:`LIFETIME_S`
seconds after a replica was killed). Priorities are drawn at random per process: two equal ones
would pause both. Peering is cluster-wide in either scope of the chart (every namespace, or
``watchNamespaces``), so that one object serves both.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping

import kopf
from kubernetes.client import ApiClient, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

PEERING_ENV = "BERTJOB_PEERING"
PEERING_GROUP, PEERING_VERSION, PEERING_PLURAL = "kopf.dev", "v1", "clusterkopfpeerings"
# Seconds a killed replica's record stands before the others take over (kopf renews its own 5 to
# 10 s before it ends, so it must be more than 10): the longest a job waits for the next replica.
LIFETIME_S = 20
PRIORITY_RANGE = 2**31


def configure(
    settings: kopf.OperatorSettings, api: ApiClient, environ: Mapping[str, str] = os.environ
) -> bool:
    """Take part in the peering ``$BERTJOB_PEERING`` if it is set: make its ClusterKopfPeering
    object if it is missing (409: another replica made it) and set kopf's peering settings
    (mandatory, cluster-wide, a random priority, :data:`LIFETIME_S`). Returns whether it is on.
    Called by the operator's startup handler, before kopf starts its peering.

    Raises:
        kubernetes.client.exceptions.ApiException: the object could not be made (e.g. 403: the
            ClusterRole lacks ``create`` on clusterkopfpeerings; 404: the CRD is not installed).
    """
    name = environ.get(PEERING_ENV)
    if not name:
        return False
    body = {
        "apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": name},
    }
    try:
        CustomObjectsApi(api).create_cluster_custom_object(
            PEERING_GROUP, PEERING_VERSION, PEERING_PLURAL, body
        )
    except ApiException as error:
        if error.status != 409:
            raise
    settings.peering.name = name
    settings.peering.mandatory = True
    settings.peering.standalone = False
    settings.peering.clusterwide = True
    settings.peering.priority = secrets.randbelow(PRIORITY_RANGE)
    settings.peering.lifetime = LIFETIME_S
    return True
