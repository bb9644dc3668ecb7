"""OpenShift's restricted-v2 SCC, the default for a project's pods, as a check on what we render:
a user, group, fsGroup or supplemental group the pod names must lie in the namespace's range (the
SCC assigns one from it to a pod that names none), and the pod must run as non-root, without
privilege escalation, with every capability dropped, the runtime's default seccomp profile, and
volumes of the kinds the SCC allows. The first cluster example, with its `fsGroup` line deleted as
its comment and docs/operator.md ("OpenShift") say, and the chart with ci/openshift-values.yaml pass;
the example as written is refused for its fsGroup 10001. Nothing here ran on OpenShift."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob.render import render
from bertjob_api.jobfile import read_document
from bertjob_api.spec import parse_job
from tests.helm_chart import helm_or_skip

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "bert-tiny-cluster.yaml"
CHART = REPO / "charts" / "bertjob"
# A namespace's openshift.io/sa.scc.uid-range (and supplemental-groups, the same by default): first/size.
RANGE = (1000680000, 10000)
# restricted-v2's volumes.
VOLUMES = {
    "configMap",
    "downwardAPI",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "secret",
    "ephemeral",
    "csi",
}


def restricted_v2_problems(pod: dict[str, Any], uid_range: tuple[int, int] = RANGE) -> list[str]:
    """What restricted-v2 refuses in ``pod`` (a PodSpec): [] when it admits it."""
    first, size = uid_range
    problems = []

    def in_range(where: str, value: Any) -> None:
        if value is not None and not first <= int(value) < first + size:
            problems.append(f"{where}: {value} is outside the namespace's range {first}/{size}")

    context = pod.get("securityContext") or {}
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        in_range(f"securityContext.{key}", context.get(key))
    for group in context.get("supplementalGroups") or []:
        in_range("securityContext.supplementalGroups", group)
    if context.get("seccompProfile", {"type": "RuntimeDefault"}).get("type") != "RuntimeDefault":
        problems.append("securityContext.seccompProfile: not RuntimeDefault")
    for kind in ("containers", "initContainers"):
        for container in pod.get(kind) or []:
            own = container.get("securityContext") or {}
            where = f"{kind}[{container['name']}].securityContext"
            for key in ("runAsUser", "runAsGroup"):
                in_range(f"{where}.{key}", own.get(key))
            if own.get("privileged"):
                problems.append(f"{where}.privileged")
            if own.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}.allowPrivilegeEscalation is not false")
            if "ALL" not in (own.get("capabilities") or {}).get("drop", []):
                problems.append(f"{where}.capabilities.drop lacks ALL")
            if own.get("runAsNonRoot", context.get("runAsNonRoot")) is not True:
                problems.append(f"{where}: runAsNonRoot is not true")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= VOLUMES:
            problems.append(f"volumes[{volume['name']}]: {sorted(kinds - VOLUMES)} not allowed")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            problems.append(key)
    return problems


def _pods(node: Any) -> Iterator[dict[str, Any]]:
    """Every PodSpec inside ``node`` (a rendered object): each mapping with ``containers``."""
    if isinstance(node, dict):
        if "containers" in node:
            yield node
        for value in node.values():
            yield from _pods(value)
    elif isinstance(node, list):
        for value in node:
            yield from _pods(value)


def _example(without_fs_group: bool) -> list[dict[str, Any]]:
    document = read_document(EXAMPLE)
    if without_fs_group:
        del document["spec"]["pod"]["securityContext"]["fsGroup"]
    return render(parse_job(document, str(EXAMPLE)))


def test_the_first_cluster_example_says_what_to_delete_on_openshift() -> None:
    text = EXAMPLE.read_text()
    assert "OpenShift" in text and "delete the fsGroup line" in text
    assert "### OpenShift" in (REPO / "docs" / "operator.md").read_text()


def test_the_example_without_its_fsgroup_fits_restricted_v2() -> None:
    pods = [pod for obj in _example(without_fs_group=True) for pod in _pods(obj)]
    assert pods
    assert {str(pod["securityContext"]) for pod in pods if restricted_v2_problems(pod)} == set()


def test_the_example_as_written_is_refused_for_its_fsgroup() -> None:
    pods = [pod for obj in _example(without_fs_group=False) for pod in _pods(obj)]
    problems = {problem for pod in pods for problem in restricted_v2_problems(pod)}
    assert problems == {
        f"securityContext.fsGroup: 10001 is outside the namespace's range {RANGE[0]}/{RANGE[1]}"
    }


@pytest.mark.parametrize(("values", "fits"), [("openshift-values.yaml", True), (None, False)])
def test_the_operator_fits_restricted_v2_with_the_charts_openshift_values(
    values: str | None, fits: bool
) -> None:
    arguments = [helm_or_skip(), "template", "bertjob", str(CHART), "--set", "webhook.enabled=true"]
    if values:
        arguments.append(f"--values={CHART / 'ci' / values}")
    done = subprocess.run(arguments, capture_output=True, text=True, check=True, timeout=120)
    [deployment] = [obj for obj in yaml.safe_load_all(done.stdout) if obj and obj["kind"] == "Deployment"]
    problems = restricted_v2_problems(deployment["spec"]["template"]["spec"])
    assert (problems == []) is fits, problems
