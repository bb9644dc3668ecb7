"""render(): the ConfigMap and the PyTorchJob a job becomes, through real `kubectl kustomize`.

Golden files: tests/bertjob/golden/*.yaml. After an intended change, regenerate them with

    BERTJOB_UPDATE_GOLDEN=1 .venv/bin/pytest tests/bertjob/test_render.py -k golden

and review the diff.
"""

from __future__ import annotations

import difflib
import os
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bertjob.defaults import with_defaults
from bertjob.render import KUSTOMIZE_DIR_ENV, RenderError, kustomize_dir, render
from bertjob.spec import SpecError, parse_job, to_document
from jobs import valid_job, with_value
from k8s_schema import assert_valid

GOLDEN = Path(__file__).parent / "golden"
KUBERNETES_VERSION = "1.33"
DEVICES = {"nvidia-gpu": "nvidia.com/gpu", "habana-hpu": "habana.ai/gaudi", "xeon-cpu": None}


def _job(
    nodes: int = 1, processes: int = 2, accelerator: str = "nvidia-gpu", changes: dict[str, Any] | None = None
) -> dict[str, Any]:
    document = valid_job()
    # 96 and 48 sequences divide over every world size used here (1 to 6 processes).
    for field, value in {
        "spec.topology.nodes": nodes,
        "spec.topology.processesPerNode": processes,
        "spec.accelerator": accelerator,
        "spec.phases.0.globalBatchSize": 96,
        "spec.phases.1.globalBatchSize": 48,
        **(changes or {}),
    }.items():
        document = with_value(document, field, value)
    return document


def _pods(pytorchjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: replica["template"] for name, replica in pytorchjob["spec"]["pytorchReplicaSpecs"].items()}


@pytest.mark.parametrize("accelerator", DEVICES)
@pytest.mark.parametrize("nodes", [1, 3])
def test_topology_and_accelerator(nodes: int, accelerator: str, pytorchjob_schema: dict[str, Any]) -> None:
    config_map, pytorchjob = render(parse_job(_job(nodes, 2, accelerator)))

    assert (config_map["kind"], config_map["metadata"]["name"]) == ("ConfigMap", "demo-config")
    assert (pytorchjob["apiVersion"], pytorchjob["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert pytorchjob["metadata"] == {
        "name": "demo",
        "namespace": "default",
        "labels": {"app.kubernetes.io/name": "bertjob", "bertjob.dev/job": "demo"},
    }
    assert pytorchjob["spec"]["nprocPerNode"] == "2"
    replicas = pytorchjob["spec"]["pytorchReplicaSpecs"]
    expected = {"Master": 1} if nodes == 1 else {"Master": 1, "Worker": nodes - 1}
    assert {name: replica["replicas"] for name, replica in replicas.items()} == expected
    assert {replica["restartPolicy"] for replica in replicas.values()} == {"OnFailure"}
    for pod in _pods(pytorchjob).values():
        [container] = pod["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert container["image"] == "ghcr.io/bertjob/trainer:0.1.0"
        assert container["command"] == [
            "torchrun",
            "--module",
            "bertpretrain",
            "run",
            "--config",
            "/etc/bertjob/job.yaml",
        ]
        device = DEVICES[accelerator]
        assert container.get("resources") == ({"limits": {device: 2}} if device else None)
        assert pod["metadata"]["labels"]["bertjob.dev/job"] == "demo"
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
        config_volume = next(volume for volume in pod["spec"]["volumes"] if volume["name"] == "job-config")
        assert config_volume["configMap"]["name"] == "demo-config"
        assert {"name": "job-config", "mountPath": "/etc/bertjob", "readOnly": True} in container[
            "volumeMounts"
        ]
    assert_valid(pytorchjob, pytorchjob_schema)
    kubernetes_validate.validate(config_map, KUBERNETES_VERSION, strict=True)


def test_the_config_map_holds_the_job_after_defaults() -> None:
    job = parse_job(_job(nodes=3))

    config_map, _ = render(job)

    document = yaml.safe_load(config_map["data"]["job.yaml"])
    assert document == to_document(job.model_copy(update={"spec": with_defaults(job.spec)}))
    assert document["spec"]["phases"][0]["microBatchSize"] == 16  # 96 over 3 x 2 processes
    assert parse_job(document).spec.export.path == "/data/checkpoints/hf"


@pytest.mark.parametrize(
    ("name", "document"),
    [
        ("single-node", valid_job()),
        ("multi-node", _job(nodes=3, processes=2, accelerator="habana-hpu")),
    ],
)
def test_golden(name: str, document: dict[str, Any]) -> None:
    rendered = render(parse_job(document))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("BERTJOB_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(_dump(rendered))
    golden = list(yaml.safe_load_all(path.read_text()))
    diff = "\n".join(
        difflib.unified_diff(
            _dump(golden).splitlines(), _dump(rendered).splitlines(), str(path), "rendered", lineterm=""
        )
    )
    assert rendered == golden, f"render() no longer matches {path}:\n{diff}"


HOSTILE = [
    "x\n  evil: true",
    "{{ 7*7 }}",
    "{% raw %}x{% endraw %}",
    "!!python/object/apply:os.system ['true']",
    '"; kind: Secret\n---\napiVersion: v1',
    "${HOME} $(id) `id`",
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_come_out_verbatim(value: str) -> None:
    shards = f"/data/{value}"  # on the data volume, as every path the job writes must be
    document = _job(
        nodes=2, changes={"spec.image": value, "spec.data.shards": shards, "metadata.namespace": value}
    )

    rendered = render(parse_job(document))

    assert [obj["kind"] for obj in rendered] == ["ConfigMap", "PyTorchJob"]
    config_map, pytorchjob = rendered
    assert {obj["metadata"]["namespace"] for obj in rendered} == {value}
    assert {pod["spec"]["containers"][0]["image"] for pod in _pods(pytorchjob).values()} == {value}
    job_file = yaml.safe_load(config_map["data"]["job.yaml"])
    assert (job_file["spec"]["image"], job_file["spec"]["data"]["shards"]) == (value, shards)
    assert (job_file["metadata"]["namespace"], pytorchjob["metadata"]["name"]) == (value, "demo")


def test_an_inconsistent_spec_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as refused:
        render(parse_job(_job(nodes=5)))

    assert [path for path, _ in refused.value.problems] == [
        "spec.phases[0].globalBatchSize",
        "spec.phases[1].globalBatchSize",
    ]


def _copy_of_kustomize(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    copy = tmp_path / "kustomize"
    shutil.copytree(kustomize_dir(), copy)
    monkeypatch.setenv(KUSTOMIZE_DIR_ENV, str(copy))
    return copy


def test_the_kustomize_tree_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _copy_of_kustomize(tmp_path, monkeypatch) / "base" / "pytorchjob.yaml"
    base.write_text(base.read_text().replace("restartPolicy: OnFailure", "restartPolicy: ExitCode"))

    _, pytorchjob = render(parse_job(_job()))

    assert pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "ExitCode"


def test_a_base_that_moved_the_container_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _copy_of_kustomize(tmp_path, monkeypatch) / "base" / "pytorchjob.yaml"
    base.write_text(base.read_text().replace("- name: pytorch", "- name: trainer"))

    with pytest.raises(RenderError, match="kustomize"):
        render(parse_job(_job()))


def test_without_kustomize_or_kubectl_render_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    with pytest.raises(RenderError, match="neither kustomize nor kubectl"):
        render(parse_job(_job()))


class _GoldenDumper(yaml.SafeDumper):
    """Multi-line strings (the job file) as literal blocks, so that golden diffs read well."""


def _literal_str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_GoldenDumper.add_representer(str, _literal_str)


def _dump(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_GoldenDumper, sort_keys=False)
