"""A job whose rendered objects are too large for the API server to store is refused before anything
is created, naming the field that makes them large: by ``bertjob validate``, by the admission
webhook, and by what the operator's handlers call (:func:`bertjob.render.rendered`, through
``render``). A hostile run found a 900,000-character image that every check accepted: it renders a
1.8 MB PyTorchJob of two nodes (the image once per replica), more than etcd stores."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from bertjob import admission
from bertjob.cli import main
from bertjob.render import rendered
from bertjob_api.spec import SpecError, parse_job
from bertjob_api.validation import MAX_OBJECT_BYTES, json_bytes
from bertjob_testing.jobs import valid_job, with_value

HUGE_IMAGE = "x" * 900_000


def _job(**changes: Any) -> dict[str, Any]:
    """The valid job on two nodes (a Master and a Worker, each with the image and env), changed."""
    document = with_value(valid_job(), "spec.topology.nodes", 2)
    for dotted, value in changes.items():
        document = with_value(document, dotted.replace("__", "."), value)
    return document


def _refused(document: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as refused:
        rendered(parse_job(document))
    return list(refused.value.problems)


# What every door says of the 900,000-character image (the byte count depends on the kustomize base).
IMAGE_REFUSAL = re.compile(
    r"spec\.image: takes 1\.7 MiB of PyTorchJob/demo, which would be 18\d{5} bytes as JSON, more than "
    r"the 1048576 bytes \(1\.0 MiB\) the operator allows one object it creates \(etcd stores at most "
    r"1\.5 MiB\); use a smaller value \(a large one belongs in a file on a volume\)"
)


def test_bertjob_validate_refuses_a_huge_image_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job(spec__image=HUGE_IMAGE)))
    assert main(["validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"{path}: invalid BertPretrainJob\n  spec.image: takes")
    assert IMAGE_REFUSAL.search(captured.err), captured.err
    # render says the same, and prints nothing.
    assert main(["render", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and IMAGE_REFUSAL.search(captured.err), captured.err


def test_admission_refuses_a_huge_image_naming_it() -> None:
    document = _job(spec__image=HUGE_IMAGE)
    [(field, _)] = admission.problems(document)
    assert field == "spec.image"
    assert [field for field, _ in admission.review("CREATE", None, document)] == ["spec.image"]
    with pytest.raises(kopf.AdmissionError) as refused:
        admission.validate_job(
            body=kopf.Body(document), memo=kopf.Memo(), logger=logging.getLogger("test"), operation="CREATE"
        )
    assert refused.value.code == admission.REFUSED_CODE
    assert str(refused.value).startswith("invalid BertPretrainJob, 1 problem: spec.image: takes")
    assert IMAGE_REFUSAL.search(str(refused.value)), str(refused.value)
    # A change to a stored job that makes it too large is refused too.
    valid = _job()
    assert [field for field, _ in admission.review("UPDATE", valid, document, valid)] == ["spec.image"]


def test_what_the_operator_renders_refuses_a_huge_image_naming_it() -> None:
    # handlers.launch and handlers.change call rendered() (launch through render()), and record a
    # SpecError as the InvalidSpec condition and event.
    [(field, message)] = _refused(_job(spec__image=HUGE_IMAGE))
    assert IMAGE_REFUSAL.fullmatch(f"{field}: {message}"), message


def _image_filling(limit: int) -> str:
    """An image that makes the two-node PyTorchJob, the largest object, ``limit`` bytes or one less
    (the image is in it twice)."""
    short = "ghcr.io/bertjob/trainer:0.1.0"
    size = json_bytes(rendered(parse_job(_job(spec__image=short))).objects[-1])
    return short + "x" * ((limit - size) // 2)


def test_a_job_just_within_the_limit_passes_and_one_byte_more_is_refused() -> None:
    image = _image_filling(MAX_OBJECT_BYTES)
    objects = rendered(parse_job(_job(spec__image=image))).objects
    assert max(map(json_bytes, objects)) in (MAX_OBJECT_BYTES - 1, MAX_OBJECT_BYTES)
    assert [obj["kind"] for obj in objects if json_bytes(obj) >= MAX_OBJECT_BYTES - 1] == ["PyTorchJob"]
    assert [field for field, _ in _refused(_job(spec__image=image + "x"))] == ["spec.image"]


@pytest.mark.parametrize(
    ("changes", "field", "kind"),
    [
        # One large value of a pass-through list, in each replica's container.
        (
            {
                "spec__pod": {
                    "env": [{"name": "SMALL", "value": "1"}, {"name": "BLOB", "value": "y" * 600_000}]
                }
            },
            "spec.pod.env[1].value",
            "PyTorchJob",
        ),
        # Many small values: named by their list.
        (
            {
                "spec__pod": {
                    "tolerations": [
                        {"key": f"k{i}", "operator": "Exists", "effect": "NoSchedule"} for i in range(12_000)
                    ]
                }
            },
            "spec.pod.tolerations",
            "PyTorchJob",
        ),
        # A mount path, in each replica's volumeMounts (the ConfigMap holds it once).
        (
            {
                "spec__volumes": [
                    {"name": "data", "mountPath": "/data"},
                    {"name": "corpus", "mountPath": "/" + "c" * 600_000, "readOnly": True},
                ]
            },
            "spec.volumes[1].mountPath",
            "PyTorchJob",
        ),
        # An env name that Trainer v2's MPI policy also lists in OMPI_MCA_mca_base_env_list, and a
        # TrainJob's launcher container repeats: found inside that string too.
        (
            {
                "spec__topology__nodes": 1,
                "spec__launcher": "trainjob",
                "spec__trainJob": {"mlPolicy": "mpi"},
                "spec__accelerator": "xeon-cpu",
                "spec__pod": {"env": [{"name": "B" * 400_000, "value": "1"}]},
            },
            "spec.pod.env[0].name",
            "TrainJob",
        ),
        # The MPIJob's Launcher and Worker each run the image, even on one node.
        (
            {"spec__topology__nodes": 1, "spec__launcher": "mpijob", "spec__image": HUGE_IMAGE},
            "spec.image",
            "MPIJob",
        ),
    ],
    ids=["env-value", "many-tolerations", "mount-path", "trainjob-mpi-env-name", "mpijob-one-node"],
)
def test_the_field_that_makes_an_object_large_is_named(
    changes: dict[str, Any], field: str, kind: str
) -> None:
    document = _job(**changes)
    [(named, message)] = _refused(document)
    assert (named, f" of {kind}/demo, " in message) == (field, True), message
    assert admission.problems(document) == [(named, message)]


def test_a_huge_image_on_one_node_fits() -> None:
    # Once in the PyTorchJob and once in the ConfigMap: about 900 kB each, within the limit.
    document = with_value(valid_job(), "spec.image", HUGE_IMAGE)
    objects = rendered(parse_job(document)).objects
    assert MAX_OBJECT_BYTES > max(map(json_bytes, objects)) > len(HUGE_IMAGE)
