"""RBAC minimality from a real API server's audit log: what one ServiceAccount asked for, against
the rules the chart grants it.

:func:`used_permissions` reads the audit log (one JSON event per line, the policy of
:data:`bertjob_testing.cluster.components.apiserver.AUDIT_POLICY`) for every resource request of
one user: (API group, resource[/subresource], verb, namespace, name), with the HTTP status the
server answered. One permission is used without a request of its own: the
OwnerReferencesPermissionEnforcement admission plugin checks ``update`` on the owner's
``finalizers`` subresource for each object created with ``blockOwnerDeletion`` on an owner
reference, so such a create (logged with its body) counts as a use of that permission too.

:func:`granted_rules` reads ``helm template`` output: each Role and ClusterRole bound to the
ServiceAccount, each rule with the comment lines just above it. :func:`audit` compares the two both
ways: a request no rule allows (or one the server refused), and a verb of a rule that nothing used
unless the rule's comment has a line ``# <verb>[, <verb>]: only when <condition>`` saying when it is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from itertools import product
from pathlib import Path
from typing import Any

import yaml

# A comment line that says when a granted verb is used, for a verb the tests never use.
ONLY_WHEN = re.compile(r"^#\s*(?P<verbs>[a-z]+(?:,\s*[a-z]+)*):\s*only when\b", re.IGNORECASE)
RULE_START = re.compile(r"^\s*-\s+apiGroups:")
# The audit annotation in which the API server records its authorizer's decision.
DECISION = "authorization.k8s.io/decision"


@dataclass(frozen=True)
class Request:
    """One resource request of the audited user: ``resource`` is ``plural`` or
    ``plural/subresource``; ``namespace`` and ``name`` are empty when the request named none;
    ``denied``: the server's authorizer refused it (the event's ``authorization.k8s.io/decision``
    is ``forbid``; a 403 for another reason, such as a namespace being deleted, is not)."""

    group: str
    resource: str
    verb: str
    namespace: str = ""
    name: str = ""
    denied: bool = False


@dataclass(frozen=True)
class Rule:
    """One PolicyRule of a Role (``namespace`` set) or ClusterRole (``namespace`` empty) named
    ``role``, and the comment lines just above it in the rendered chart."""

    role: str
    namespace: str
    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()
    comment: tuple[str, ...] = ()

    def allows(self, request: Request) -> bool:
        """Whether this rule lets ``request`` through (RBAC's matching: ``*`` matches all; a Role
        only in its namespace; resourceNames only the named objects)."""
        return (
            _matches(self.groups, request.group)
            and _matches(self.resources, request.resource)
            and _matches(self.verbs, request.verb)
            and (not self.namespace or self.namespace == request.namespace)
            and (not self.names or request.name in self.names)
        )

    def only_when(self) -> set[str]:
        """The verbs its comment says are used only under some condition (:data:`ONLY_WHEN`)."""
        verbs: set[str] = set()
        for line in self.comment:
            if found := ONLY_WHEN.match(line.strip()):
                verbs.update(verb.strip() for verb in found["verbs"].split(","))
        return verbs

    def describe(self) -> str:
        """The rule as a reader finds it: role, groups, resources and verbs."""
        where = f"Role {self.namespace}/{self.role}" if self.namespace else f"ClusterRole {self.role}"
        names = f" resourceNames {list(self.names)}" if self.names else ""
        return f"{where}: apiGroups {list(self.groups)} resources {list(self.resources)}{names}"


def _matches(allowed: Iterable[str], value: str) -> bool:
    return "*" in allowed or value in allowed


@dataclass
class Findings:
    """What :func:`audit` found: each line names the permission or the rule."""

    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)


def used_permissions(log: Path, username: str, owner_plurals: Mapping[tuple[str, str], str]) -> list[Request]:
    """Every resource request of ``username`` in audit log ``log``, in order, each once per
    distinct (group, resource, verb, namespace, name, denied); plus, for each object it created with
    ``blockOwnerDeletion`` on an owner reference whose (apiVersion's group, kind) is a key of
    ``owner_plurals``, an ``update`` of that owner's ``<plural>/finalizers``.

    Non-resource requests (discovery: ``/api``, ``/apis``, ``/version``) are left out: every
    authenticated user may make them.

    Raises:
        FileNotFoundError: no log at ``log``.
        json.JSONDecodeError: a line is not JSON.
    """
    seen: dict[Request, None] = {}
    with log.open() as lines:
        for line in lines:
            if username not in line:
                continue
            event = json.loads(line)
            if (event.get("user") or {}).get("username") != username or not event.get("objectRef"):
                continue
            target = event["objectRef"]
            resource = target.get("resource", "")
            if target.get("subresource"):
                resource = f"{resource}/{target['subresource']}"
            denied = (event.get("annotations") or {}).get(DECISION) == "forbid"
            namespace = target.get("namespace", "")
            request = Request(
                target.get("apiGroup", ""), resource, event["verb"], namespace, target.get("name", ""), denied
            )
            seen.setdefault(request, None)
            for implied in _owner_finalizer_updates(event, namespace, owner_plurals):
                seen.setdefault(implied, None)
    return list(seen)


def _owner_finalizer_updates(
    event: dict[str, Any], namespace: str, owner_plurals: Mapping[tuple[str, str], str]
) -> list[Request]:
    if event.get("verb") != "create":
        return []
    metadata = (event.get("requestObject") or {}).get("metadata") or {}
    found = []
    for owner in metadata.get("ownerReferences") or []:
        group = str(owner.get("apiVersion", "")).rpartition("/")[0]
        plural = owner_plurals.get((group, str(owner.get("kind", ""))))
        if owner.get("blockOwnerDeletion") and plural:
            name = str(owner.get("name", ""))
            found.append(Request(group, f"{plural}/finalizers", "update", namespace, name))
    return found


def granted_rules(rendered: str, service_account: str, namespace: str) -> list[Rule]:
    """The rules of every Role and ClusterRole that a RoleBinding or ClusterRoleBinding in
    ``rendered`` (``helm template`` output, documents separated by ``---``) binds to the
    ServiceAccount ``namespace``/``service_account``, each with its comment.

    Raises:
        ValueError: a role's rules and the rule starts found in its text disagree in number (a
            rule written in another style than ``- apiGroups: ...`` first).
    """
    roles: dict[tuple[str, str, str], list[Rule]] = {}
    bound: list[tuple[str, str, str]] = []
    for text in re.split(r"^---\s*$", rendered, flags=re.MULTILINE):
        document = yaml.safe_load(text)
        if not isinstance(document, dict):
            continue
        kind, metadata = document.get("kind"), document.get("metadata") or {}
        role_namespace = metadata.get("namespace", namespace) if kind == "Role" else ""
        if kind in ("Role", "ClusterRole"):
            roles[(kind, role_namespace, metadata["name"])] = _rules(text, document, role_namespace)
        elif kind in ("RoleBinding", "ClusterRoleBinding"):
            subject = {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
            if any(_same_subject(given, subject) for given in document.get("subjects") or []):
                reference = document["roleRef"]
                where = metadata.get("namespace", namespace) if reference["kind"] == "Role" else ""
                bound.append((reference["kind"], where, reference["name"]))
    return [rule for key in bound for rule in roles.get(key, [])]


def _same_subject(given: dict[str, Any], wanted: dict[str, str]) -> bool:
    return all(given.get(key) == value for key, value in wanted.items())


def _rules(text: str, document: dict[str, Any], namespace: str) -> list[Rule]:
    comments: list[tuple[str, ...]] = []
    pending: list[str] = []
    for line in text.splitlines():
        if line.strip().startswith("#"):
            pending.append(line.strip())
        elif RULE_START.match(line):
            comments.append(tuple(pending))
            pending = []
        else:
            pending = []
    rules = document.get("rules") or []
    if len(rules) != len(comments):
        raise ValueError(
            f"{document['kind']} {document['metadata']['name']}: {len(rules)} rules but "
            f"{len(comments)} lines starting with '- apiGroups:'"
        )
    return [
        Rule(
            document["metadata"]["name"],
            namespace,
            tuple(rule.get("apiGroups") or ()),
            tuple(rule.get("resources") or ()),
            tuple(rule.get("verbs") or ()),
            tuple(rule.get("resourceNames") or ()),
            comment,
        )
        for rule, comment in zip(rules, comments, strict=True)
    ]


def audit(requests: Iterable[Request], rules: Iterable[Rule]) -> Findings:
    """Compare the requests one user made with the rules it is granted.

    ``missing``: each (verb, resource) of the requests that the server's authorizer refused or no
    rule allows, with the first such request's object and namespace and how many more there were.
    ``unused``: each verb of each rule, per resource (and per resourceName), that no request used,
    unless the rule's comment says when it is used (:meth:`Rule.only_when`).
    """
    requests, rules = list(requests), list(rules)
    findings = Findings()
    refused: dict[str, list[Request]] = {}
    for request in requests:
        if request.denied or not any(rule.allows(request) for rule in rules):
            how = "refused by the API server's authorizer" if request.denied else "allowed by no rule"
            kind = f"{request.verb} {request.resource} ({request.group or 'core'}): {how}"
            refused.setdefault(kind, []).append(request)
    for kind, alike in refused.items():
        first = alike[0]
        where = f"in {first.namespace}" if first.namespace else "cluster-wide"
        example = f"{first.name} {where}" if first.name else where
        more = f" and {len(alike) - 1} more" if len(alike) > 1 else ""
        findings.missing.append(f"{kind} ({example}{more})")
    allowed = [request for request in requests if not request.denied]
    for rule in rules:
        explained = rule.only_when()
        names = rule.names or ("",)
        for group, resource, verb, name in product(rule.groups, rule.resources, rule.verbs, names):
            # The rule narrowed to this one permission: used when it allows a request made.
            one = replace(
                rule, groups=(group,), resources=(resource,), verbs=(verb,), names=(name,) if name else ()
            )
            if verb in explained or any(one.allows(request) for request in allowed):
                continue
            named = f" of {name}" if name else ""
            findings.unused.append(
                f"{rule.describe()}: {verb} {resource}{named} never used, and no comment line "
                f"'# {verb}: only when ...' above the rule says when it is"
            )
    return findings


__all__ = ["ONLY_WHEN", "Findings", "Request", "Rule", "audit", "granted_rules", "used_permissions"]
