"""RBAC minimality from the real API server's audit log, over the whole cluster tier: every
(verb, resource) the operator's ServiceAccount asked for is granted by the chart, and every verb the
chart grants it was used, or the rule's comment says when it is (``# <verb>: only when ...``).

The comparison (:mod:`bertjob_testing.cluster.rbac_audit`) is tested first on small logs and
charts of its own; then :func:`test_the_operator_used_each_permission_the_chart_grants_and_no_other`
reads the shared control plane's audit log once every other test of this folder has run (it is
moved after them: tests/cluster/conftest.py), against the chart rendered as the ``operator``
fixture installs it.

Why kwok: the audit reads what the operator asked of the API server while the whole tier drove it
on kwok's nodes (jobs of each launcher, failures, progress reports, peering, restarts), which no
single test covers; no pod of its own needs to run.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob_api.contract import GROUP, KIND, PLURAL
from bertjob_testing.cluster.components.apiserver import AUDIT_LOG
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.operator import CHART, NAMESPACE, RELEASE, helm_binary
from bertjob_testing.cluster.rbac_audit import Request, audit, granted_rules, used_permissions
from tests.cluster.conftest import incomplete_tier

OWNERS = {(GROUP, KIND): PLURAL}
USER = "system:serviceaccount:ops:operator"

CHART_TEXT = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: operator
rules:
# The jobs: watched.
- apiGroups: [bertjob.dev]
  resources: [bertpretrainjobs]
  verbs: [list, watch]
# Children carry blockOwnerDeletion.
- apiGroups: [bertjob.dev]
  resources: [bertpretrainjobs/finalizers]
  verbs: [update]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: operator
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: operator}
subjects:
- {kind: ServiceAccount, name: operator, namespace: ops}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: tls
  namespace: ops
rules:
# update: only when the certificate is renewed.
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [tls]
  verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: tls
  namespace: ops
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: tls}
subjects:
- {kind: ServiceAccount, name: operator, namespace: ops}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: someone-else
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
"""


def _event(
    verb: str,
    group: str,
    resource: str,
    namespace: str = "",
    name: str = "",
    decision: str = "allow",
    user: str = USER,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    reference = {"apiGroup": group, "resource": resource, "namespace": namespace, "name": name}
    event = {
        "user": {"username": user},
        "verb": verb,
        "objectRef": {key: value for key, value in reference.items() if value},
        "responseStatus": {"code": 200 if decision == "allow" else 403},
        "annotations": {"authorization.k8s.io/decision": decision},
    }
    if body is not None:
        event["requestObject"] = body
    return event


def _child_of_a_job() -> dict[str, Any]:
    owner = {"apiVersion": f"{GROUP}/v1", "kind": KIND, "name": "a", "uid": "1", "blockOwnerDeletion": True}
    return {"metadata": {"name": "a", "ownerReferences": [owner]}}


# What the operator of CHART_TEXT uses: everything it is granted but the Secret's update.
FULL_USE = [
    _event("list", GROUP, PLURAL),
    _event("watch", GROUP, PLURAL),
    _event("create", "kubeflow.org", "pytorchjobs", "team", body=_child_of_a_job()),
    _event("get", "", "secrets", "ops", "tls"),
    # Discovery, and someone else's request: neither counts.
    {"user": {"username": USER}, "verb": "get", "requestURI": "/apis"},
    _event("delete", "", "pods", "team", "x", user="system:serviceaccount:ops:other"),
]


def _log(tmp_path: Path, events: list[dict[str, Any]]) -> Path:
    log = tmp_path / "audit.log"
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    return log


def _findings(tmp_path: Path, events: list[dict[str, Any]], chart: str = CHART_TEXT) -> Any:
    requests = used_permissions(_log(tmp_path, events), USER, OWNERS)
    return audit(requests, granted_rules(chart, "operator", "ops"))


def test_a_chart_that_grants_what_was_used_passes(tmp_path: Path) -> None:
    findings = _findings(tmp_path, FULL_USE)
    assert (findings.missing, findings.unused) == ([], [])


def test_a_create_with_block_owner_deletion_uses_the_owners_finalizers(tmp_path: Path) -> None:
    requests = used_permissions(_log(tmp_path, FULL_USE), USER, OWNERS)
    assert Request(GROUP, f"{PLURAL}/finalizers", "update", "team", "a") in requests
    without_owner = [event for event in FULL_USE if event["verb"] != "create"]
    findings = _findings(tmp_path, without_owner)
    assert any("update bertpretrainjobs/finalizers never used" in line for line in findings.unused)


def test_a_removed_rule_fails_naming_what_was_used(tmp_path: Path) -> None:
    chart = CHART_TEXT.replace("  verbs: [list, watch]", "  verbs: [list]")
    findings = _findings(tmp_path, FULL_USE, chart)
    assert findings.missing == ["watch bertpretrainjobs (bertjob.dev): allowed by no rule (cluster-wide)"]


def test_a_request_the_authorizer_refused_fails_even_when_a_rule_seems_to_allow_it(tmp_path: Path) -> None:
    findings = _findings(tmp_path, [*FULL_USE, _event("get", "", "secrets", "ops", "tls", decision="forbid")])
    assert findings.missing == ["get secrets (core): refused by the API server's authorizer (tls in ops)"]


def test_a_403_for_another_reason_than_rbac_is_no_finding(tmp_path: Path) -> None:
    # The API server's answer to a create in a namespace being deleted: allowed, then Forbidden.
    terminating = _event("create", "kubeflow.org", "pytorchjobs", "gone")
    terminating["responseStatus"] = {"code": 403, "reason": "Forbidden"}
    assert _findings(tmp_path, [*FULL_USE, terminating]).missing == []


def test_a_role_allows_only_in_its_namespace_and_only_the_named_objects(tmp_path: Path) -> None:
    elsewhere = _event("get", "", "secrets", "team", "tls")
    another = _event("get", "", "secrets", "ops", "other")
    findings = _findings(tmp_path, [*FULL_USE, elsewhere, another])
    assert findings.missing == ["get secrets (core): allowed by no rule (tls in team and 1 more)"]


def test_an_unused_rule_fails_naming_it_unless_its_comment_says_when(tmp_path: Path) -> None:
    added = "- apiGroups: [batch]\n  resources: [jobs]\n  verbs: [delete]\n"
    binding = "---\napiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding"
    chart = CHART_TEXT.replace(binding, added + binding, 1)
    findings = _findings(tmp_path, FULL_USE, chart)
    assert findings.unused == [
        "ClusterRole operator: apiGroups ['batch'] resources ['jobs']: delete jobs never used, and no "
        "comment line '# delete: only when ...' above the rule says when it is"
    ]
    explained = chart.replace(added, "# delete: only when a job is cancelled.\n" + added)
    assert _findings(tmp_path, FULL_USE, explained).unused == []
    # The Secret's update is explained; without its comment it is not.
    unexplained = CHART_TEXT.replace("# update: only when the certificate is renewed.\n", "")
    assert [line.split(": update")[0] for line in _findings(tmp_path, FULL_USE, unexplained).unused] == [
        "Role ops/tls: apiGroups [''] resources ['secrets'] resourceNames ['tls']"
    ]


def test_rules_written_in_another_style_are_refused_rather_than_misread() -> None:
    chart = CHART_TEXT.replace(
        "- apiGroups: [kubeflow.org]\n  resources: [pytorchjobs]",
        "- resources: [pytorchjobs]\n  apiGroups: [kubeflow.org]",
    )
    with pytest.raises(ValueError, match="ClusterRole operator: 3 rules but 2 lines"):
        granted_rules(chart, "operator", "ops")


def _installed_chart() -> str:
    """The chart rendered as tests/cluster/conftest.py's ``operator`` fixture installs it."""
    values = "--set=webhook.enabled=true"
    command = [helm_binary(), "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}", values]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout


def _service_account(rendered: str) -> str:
    [account] = [
        document["spec"]["template"]["spec"]["serviceAccountName"]
        for document in yaml.safe_load_all(rendered)
        if isinstance(document, dict) and document.get("kind") == "Deployment"
    ]
    return str(account)


@pytest.mark.tier_audit
def test_the_operator_used_each_permission_the_chart_grants_and_no_other(
    control_plane: ControlPlane, request: pytest.FixtureRequest
) -> None:
    rendered = _installed_chart()
    account = _service_account(rendered)
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    log = control_plane.workdir / AUDIT_LOG
    requests = used_permissions(log, user, OWNERS) if log.exists() else []
    partial = incomplete_tier(request.session)
    if partial and not requests:
        pytest.skip(f"the cluster tier did not run ({partial}): no request of the operator's to audit")
    assert requests, f"no request of {user} in {log}: the audit policy records none"
    findings = audit(requests, granted_rules(rendered, account, NAMESPACE))
    used = sorted({f"{r.verb} {r.resource} ({r.group or 'core'})" for r in requests})
    print(f"\nthe operator used {len(used)} (verb, resource) pairs:\n" + "\n".join(used))
    assert not findings.missing, "the operator asked for what the chart does not grant:\n" + "\n".join(
        findings.missing
    )
    if partial:
        pytest.skip(f"only part of the cluster tier ran ({partial}): unused rules are not judged")
    assert not findings.unused, "the chart grants what the cluster tier never used:\n" + "\n".join(
        findings.unused
    )
