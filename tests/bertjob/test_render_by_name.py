"""render()'s core: the strategic merge that finds list entries by name, and the kustomize build
that runs once per overlay-and-components combination."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from bertjob.render import KUSTOMIZE_DIR_ENV, MergeError, component, kustomize_dir, merge, render
from bertjob_api.contract import DATA_VOLUME, JOB_CONFIG_VOLUME
from bertjob_api.spec import parse_job
from bertjob_testing.jobs import valid_job, with_value

REPLACE = {"$patch": "replace"}
DELETE = {"$patch": "delete"}

# (what it shows, original, patch, merged)
MERGES: list[tuple[str, Any, Any, Any]] = [
    (
        "a mapping merges key by key",
        {"a": 1, "b": {"c": 2}},
        {"b": {"d": 3}},
        {"a": 1, "b": {"c": 2, "d": 3}},
    ),
    ("null removes a key", {"a": 1, "b": 2}, {"b": None}, {"a": 1}),
    ("$patch: replace replaces a mapping", {"s": {"a": 1}}, {"s": {**REPLACE, "b": 2}}, {"s": {"b": 2}}),
    (
        "a replaced mapping is taken verbatim",
        {},
        {"s": {**REPLACE, "t": {"x": None}}},
        {"s": {"t": {"x": None}}},
    ),
    (
        "a list without a merge key is replaced",
        {"command": ["a", "b"]},
        {"command": ["c"]},
        {"command": ["c"]},
    ),
    (
        "volumes merge by name, wherever they are",
        {"volumes": [{"name": "x", "emptyDir": {}}, {"name": "data", "emptyDir": {}}]},
        {"volumes": [{**REPLACE, "name": "data", "hostPath": {"path": "/d"}}, {"name": "y", "emptyDir": {}}]},
        {
            "volumes": [
                {"name": "x", "emptyDir": {}},
                {"name": "data", "hostPath": {"path": "/d"}},
                {"name": "y", "emptyDir": {}},
            ]
        },
    ),
    (
        "an entry merges into the one of its name",
        {"volumes": [{"name": "cfg", "configMap": {"name": "a", "optional": True}}]},
        {"volumes": [{"name": "cfg", "configMap": {"name": "b"}}]},
        {"volumes": [{"name": "cfg", "configMap": {"name": "b", "optional": True}}]},
    ),
    (
        "env and volumeMounts merge by name; new entries come last, in order",
        {"env": [{"name": "B", "value": "1"}], "volumeMounts": [{"name": "m", "mountPath": "/m"}]},
        {
            "env": [{**REPLACE, "name": "Z", "value": "z"}, {**REPLACE, "name": "B", "value": "2"}],
            "volumeMounts": [{"name": "m", "readOnly": True}],
        },
        {
            "env": [{"name": "B", "value": "2"}, {"name": "Z", "value": "z"}],
            "volumeMounts": [{"name": "m", "mountPath": "/m", "readOnly": True}],
        },
    ),
    (
        "$patch: delete removes the entry of its name, if there is one",
        {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "C", "value": "3"}]},
        {"env": [{**DELETE, "name": "A"}, {**DELETE, "name": "Y"}, {"name": "C", "value": "c"}]},
        {"env": [{"name": "B", "value": "2"}, {"name": "C", "value": "c"}]},
    ),
    (
        "containers are found by name in another order",
        {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]},
        {"containers": [{"name": "b", "image": "B"}, {"name": "a", "image": "A"}]},
        {"containers": [{"name": "a", "image": "A"}, {"name": "b", "image": "B"}]},
    ),
]


@pytest.mark.parametrize(("original", "patch", "merged"), [m[1:] for m in MERGES], ids=[m[0] for m in MERGES])
def test_merge(original: Any, patch: Any, merged: Any) -> None:
    before = yaml.safe_dump(original)

    assert merge(original, patch) == merged
    assert yaml.safe_dump(original) == before, "merge must not change its argument"


@pytest.mark.parametrize(
    ("original", "patch", "message"),
    [
        ({"containers": [{"name": "a"}]}, {"containers": [{"name": "b"}]}, "no name 'b'"),
        ({"containers": [{"name": "a"}, {"name": "x"}]}, {"containers": [{"name": "a"}]}, r"\['x'\] besides"),
        ({"env": []}, {"env": [{"value": "1"}]}, "without its name"),
        ({"s": {}}, {"s": {"$patch": "delete"}}, "unknown directive"),
        ({"containers": [{"name": "a"}]}, {"containers": [{**DELETE, "name": "a"}]}, "unknown directive"),
    ],
)
def test_merge_refuses_what_does_not_fit(original: Any, patch: Any, message: str) -> None:
    with pytest.raises(MergeError, match=message):
        merge(original, patch)


def _reordered_copy(tmp_path: Path) -> Path:
    """A copy of kustomize/ whose trainer pod lists its env, volumeMounts and volumes backwards."""
    copy = tmp_path / "reordered"
    shutil.copytree(kustomize_dir(), copy)
    pod_file = copy / "base" / "trainer-pod.yaml"
    pod = yaml.safe_load(pod_file.read_text())
    spec = pod["template"]["spec"]
    spec["volumes"].reverse()
    [container] = spec["containers"]
    container["env"].reverse()
    container["volumeMounts"].reverse()
    pod_file.write_text(yaml.safe_dump(pod))
    return copy


def _by_name(obj: Any, field: str = "") -> Any:
    """``obj`` with the lists merged by name sorted by name, so that two children compare equal
    whatever order the base listed them in."""
    if isinstance(obj, dict):
        return {key: _by_name(value, key) for key, value in obj.items()}
    if isinstance(obj, list):
        items = [_by_name(item) for item in obj]
        if field in ("env", "volumes", "volumeMounts"):
            return sorted(items, key=lambda item: item["name"])
        return items
    return obj


def _document(changes: dict[str, Any]) -> dict[str, Any]:
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    return document


DATA_PVC = {
    "name": DATA_VOLUME,
    "mountPath": "/data",
    "source": {"persistentVolumeClaim": {"claimName": "d"}},
}
EXTRA = {"name": "corpus", "mountPath": "/corpus", "readOnly": True}
ENV = [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "BERTJOB_NAME", "value": "mine"}]
JOBS = {
    "pytorchjob": {},
    "pytorchjob, data volume and env": {"spec.volumes": [EXTRA, DATA_PVC], "spec.pod": {"env": ENV}},
    "pytorchjob multi-node habana": {
        "spec.topology": {"nodes": 2, "processesPerNode": 1},
        "spec.accelerator": "habana-hpu",
        "spec.volumes": [DATA_PVC],
    },
    "mpijob": {"spec.launcher": "mpijob", "spec.volumes": [DATA_PVC, EXTRA]},
    "mpijob with the data Job": {
        "spec.launcher": "mpijob",
        "spec.accelerator": "xeon-cpu",
        "spec.prepare": {"enabled": True},
        "spec.pod": {"env": ENV},
    },
}


@pytest.mark.parametrize("changes", JOBS.values(), ids=list(JOBS))
def test_the_patch_finds_volumes_mounts_and_env_by_name_in_a_reordered_base(
    changes: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = parse_job(_document(changes))
    expected = render(job)
    monkeypatch.setenv(KUSTOMIZE_DIR_ENV, str(_reordered_copy(tmp_path)))

    rendered = render(job)

    assert _by_name(rendered) == _by_name(expected)
    for obj in rendered:
        if component(obj) not in ("train", "prepare"):
            continue
        spec = obj["spec"]
        replicas = spec.get("pytorchReplicaSpecs") or spec.get("mpiReplicaSpecs") or {"Job": spec}
        for name, replica in replicas.items():
            if name == "Launcher":
                continue
            pod = replica["template"]["spec"]
            volumes = {volume["name"]: volume for volume in pod["volumes"]}
            assert volumes[JOB_CONFIG_VOLUME]["configMap"] == {"name": "demo-job"}
            if DATA_PVC in changes.get("spec.volumes", []):
                assert volumes[DATA_VOLUME] == {"name": DATA_VOLUME, **DATA_PVC["source"]}
                [mount] = [
                    mount for mount in pod["containers"][0]["volumeMounts"] if mount["name"] == DATA_VOLUME
                ]
                assert mount == {"name": DATA_VOLUME, "mountPath": "/data"}


def _counting_kubectl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Puts a kubectl on PATH (and nothing else) that logs each call and runs the real one."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl")
    log = tmp_path / "calls.log"
    log.touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "kubectl"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {kubectl} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(bin_dir))
    return log


def test_each_combination_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "kustomize"  # a tree of its own: no build of it is cached yet
    shutil.copytree(kustomize_dir(), copy)
    monkeypatch.setenv(KUSTOMIZE_DIR_ENV, str(copy))
    log = _counting_kubectl(tmp_path, monkeypatch)
    mpijob = {"spec.launcher": "mpijob", "spec.topology": {"nodes": 2, "processesPerNode": 1}}

    for index in range(3):
        for changes in ({}, mpijob):
            document = _document({**changes, "metadata.name": f"job-{index}"})
            child = render(parse_job(document))[-1]
            assert child["metadata"]["name"] == f"job-{index}"

    calls = log.read_text().splitlines()
    assert len(calls) == 2, calls
    assert all(call.startswith("kustomize ") for call in calls)
