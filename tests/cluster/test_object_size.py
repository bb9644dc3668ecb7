"""What only a real server shows: an object larger than etcd stores. A hostile job (an image name of
900,000 characters, on two nodes) renders a PyTorchJob of about 1.8 MB. The real API server refuses
to store it, and our validation refuses the job itself at ``kubectl apply`` (through the webhook, as
the API server calls it), naming ``spec.image``, before the operator would accept it and fail to
create its child.

Why kwok: no pod needs to run: etcd and the API server refuse the oversized child, and the webhook
the job, before any pod could exist."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bertjob_api.spec import parse_job
from bertjob_api.validation import MAX_OBJECT_BYTES
from bertjob_testing.cluster.operator import RealCluster
from bertjob_testing.jobs import valid_job, with_value

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group("operator")]

HUGE_IMAGE = "x" * 900_000


def _two_nodes(image: str, namespace: str) -> dict[str, Any]:
    document = with_value(with_value(valid_job(), "spec.topology.nodes", 2), "spec.image", image)
    return with_value(with_value(document, "metadata.name", "huge"), "metadata.namespace", namespace)


def _child_as_rendered_without_the_size_check(document: dict[str, Any]) -> dict[str, Any]:
    """The PyTorchJob the job renders to, with the huge image put in after rendering (rendering
    itself refuses it now)."""
    from bertjob.render import render

    small = with_value(document, "spec.image", "trainer:1")
    [child] = [obj for obj in render(parse_job(small)) if obj["kind"] == "PyTorchJob"]
    text = json.dumps(child).replace('"trainer:1"', json.dumps(document["spec"]["image"]))
    return dict(json.loads(text))


def test_the_real_server_refuses_to_store_the_rendered_child(operator: RealCluster, namespace: str) -> None:
    assert operator.plane is not None
    child = _child_as_rendered_without_the_size_check(_two_nodes(HUGE_IMAGE, namespace))
    size = len(json.dumps(child, separators=(",", ":")))
    assert size > 1_500_000
    result = operator.plane.kubectl("create", "-f", "-", input=json.dumps(child), check=False)
    assert result.returncode != 0
    # etcd's request limit (--max-request-bytes, 1.5 MiB by default) as the API server reports it.
    assert "request is too large" in result.stderr, result.stderr
    print(f"a {size}-byte PyTorchJob: {result.stderr.strip()}")


def test_client_side_apply_cannot_store_a_job_over_256_kib(operator: RealCluster, namespace: str) -> None:
    """``kubectl apply`` (client-side) copies the whole object into its last-applied annotation,
    and the API server allows an object 256 KiB of annotations: a job document larger than that
    needs ``kubectl apply --server-side`` (or ``kubectl create``), as docs/operator.md says."""
    assert operator.plane is not None
    document = _two_nodes("x" * 300_000, namespace)
    result = operator.plane.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=json.dumps(document), check=False
    )
    assert result.returncode != 0
    assert "metadata.annotations: Too long: may not be more than 262144 bytes" in result.stderr, result.stderr
    server_side = operator.plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=json.dumps(document), check=False
    )
    assert server_side.returncode == 0, server_side.stderr


def test_apply_refuses_the_job_naming_the_field(operator: RealCluster, namespace: str) -> None:
    assert operator.plane is not None
    document = _two_nodes(HUGE_IMAGE, namespace)
    result = operator.plane.kubectl(
        "apply", "--server-side", "--dry-run=server", "-f", "-", input=json.dumps(document), check=False
    )
    assert result.returncode != 0
    assert 'admission webhook "bertpretrainjobs.bertjob.dev" denied the request' in result.stderr
    assert "spec.image: takes 1.7 MiB of PyTorchJob/huge" in result.stderr, result.stderr
    assert f"{MAX_OBJECT_BYTES} bytes" in result.stderr
