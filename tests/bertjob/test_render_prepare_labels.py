"""The data-preparation Job's pod keeps spec.pod.labels beside the operator's own (prepare component)
labels, as every training pod does (tests/bertjob/test_render_pod_metadata.py): bertjob.render's
_prepare_job sets the labels of the pod it copies from the trainer's."""

from __future__ import annotations

import pytest

from bertjob.render import job_labels, render
from bertjob_api.spec import parse_job
from tests.bertjob.test_render_pod_metadata import ANNOTATIONS, CASES, LABELS, _document, pod_templates


@pytest.mark.parametrize("changes", [case[1] for case in CASES], ids=[case[0] for case in CASES])
def test_the_prepare_jobs_pod_keeps_the_labels(changes: dict) -> None:
    objects = render(parse_job(_document(changes, {"labels": LABELS, "annotations": ANNOTATIONS})))

    metadata = pod_templates(objects)[("Job", "demo-prepare")]["metadata"]
    assert metadata["labels"] == {**LABELS, **job_labels("demo", "prepare")}
    assert metadata["annotations"] == ANNOTATIONS
