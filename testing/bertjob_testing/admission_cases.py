"""The admission table: BertPretrainJob documents that admission must allow or refuse, and spec
changes (old object, new object) that it must allow or refuse, each with the field paths a refusal
names. One table for every admission check: the operator's validating webhook
(tests/bertjob/test_admission*.py) decides every case; the CRD's CEL rules decide the cases marked
``cel``.

Entries are plain data (dicts, lists, strings) so that any evaluator can iterate them:

``JOB_CASES``, documents sent to CREATE, each a dict with
    ``id``: a unique name, for test ids;
    ``document``: the object as the API server passes it to admission (``metadata.namespace`` set,
        no server-side defaults applied: a CEL evaluator applies the CRD's defaults first);
    ``allowed``: whether admission lets it be stored;
    ``fields``: the field paths, as :class:`bertjob_api.spec.SpecError` spells them
        (``spec.phases[0].globalBatchSize``), that a refusal must name, every one of them;
    ``cel``: True where the CRD's CEL rules decide the case as the webhook does (a refused case is
        refused by CEL too, naming the same field); every allowed case must pass the CEL rules,
        whatever its flag;
    ``schema``: True where the CRD's OpenAPI schema (types, enums, patterns) refuses it already.

``CHANGE_CASES``, updates, each a dict with ``id``, ``old`` and ``new`` (whole objects: metadata,
spec and status, as the API server passes ``oldObject`` and ``object``), ``allowed``, ``fields`` and
``cel`` as above (no change rule is stated in CEL: it depends on the status, which a CEL rule of
``spec`` cannot read), and ``accepted``: None, or the job document the children were rendered from
where it differs from ``old``'s (a change refused after the fact is stored, not applied); a test
stores it as ``job.yaml`` of the ConfigMap that ``old``'s ``status.configMap`` names.

The documents are built from :func:`bertjob_testing.jobs.valid_job` and ``examples/*.yaml``; each
call of :func:`job_cases` or :func:`change_cases` builds them anew, so a test may change what it
gets. ``JOB_CASES`` and ``CHANGE_CASES`` are built once, at import.
"""

from __future__ import annotations

import copy
from typing import Any

from bertjob_testing.jobs import EXAMPLES, example, valid_job, with_value

NAMESPACE = "default"
UID = "4b7c2a4e-0d6f-4c4e-9a59-5c3a8f0e7d11"
AT = "2026-11-27T08:00:00Z"


def stored(document: dict[str, Any], generation: int = 1) -> dict[str, Any]:
    """``document`` as the API server holds it: in :data:`NAMESPACE`, with a uid and a generation."""
    result = copy.deepcopy(document)
    meta = result.setdefault("metadata", {})
    meta.setdefault("namespace", NAMESPACE)
    meta.setdefault("uid", UID)
    meta.setdefault("generation", generation)
    return result


def _condition(type_: str, reason: str, message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": "True", "reason": reason, "message": message, "lastTransitionTime": AT}


def running(document: dict[str, Any], launcher: str = "PyTorchJob") -> dict[str, Any]:
    """``document`` stored, with the status of a job whose training child runs (phase Running)."""
    result = stored(document)
    name = result["metadata"]["name"]
    api_version = "trainer.kubeflow.org/v1alpha1" if launcher == "TrainJob" else "kubeflow.org/v1"
    result["status"] = {
        "phase": "Running",
        "conditions": [
            _condition("Created", "ChildrenCreated", f"Created {launcher} {name}"),
            _condition("Running", f"{launcher}Running"),
        ],
        "children": [{"apiVersion": api_version, "kind": launcher, "name": name}],
        "configMap": f"{name}-job",
        "observedGeneration": 1,
        "startTime": AT,
    }
    return result


def refused_as_invalid(document: dict[str, Any], message: str) -> dict[str, Any]:
    """``document`` stored, with the status of a job the operator failed as InvalidSpec."""
    result = stored(document)
    result["status"] = {
        "phase": "Failed",
        "conditions": [_condition("Failed", "InvalidSpec", message)],
        "observedGeneration": 1,
        "completionTime": AT,
    }
    return result


def _job(
    id_: str, document: dict[str, Any], fields: list[str], cel: bool, schema: bool = False
) -> dict[str, Any]:
    return {
        "id": id_,
        "document": stored(document),
        "allowed": not fields,
        "fields": fields,
        "cel": cel,
        "schema": schema,
    }


def _examples() -> list[dict[str, Any]]:
    # bert-tiny-local is a job for `bertjob run` on this machine: relative paths, refused on a cluster.
    local = {
        "bert-tiny-local.yaml": [
            "spec.data.shards",
            "spec.checkpoint.path",
            "spec.export.path",
            "spec.logging.path",
        ]
    }
    return [
        _job(f"example-{path.stem}", example(path.name), local.get(path.name, []), cel=path.name not in local)
        for path in sorted(EXAMPLES.glob("*.yaml"))
    ]


def job_cases() -> list[dict[str, Any]]:
    """The documents of CREATE requests, built anew (see the module's docstring for the keys)."""
    good = valid_job()
    three = with_value(good, "spec.topology", {"nodes": 1, "processesPerNode": 3})
    micro = with_value(good, "spec.phases.0.microBatchSize", 5)
    habana = with_value(with_value(good, "spec.launcher", "mpijob"), "spec.accelerator", "habana-hpu")
    no_spec = {key: value for key, value in good.items() if key != "spec"}
    micro_ramp = with_value(
        with_value(good, "spec.phases.0.microBatchSize", 16), "spec.phases.0.batchRampProportion", 0.1
    )
    return [
        _job("valid-job", good, [], cel=True),
        # World size 3, default micro-batch 64 // 3 = 21: 64 % 63 and 32 % 30 leave remainders.
        _job(
            "batch-not-divisible-by-world-size",
            three,
            ["spec.phases[0].globalBatchSize", "spec.phases[1].globalBatchSize"],
            cel=True,
        ),
        _job("batch-not-divisible-by-micro-batch", micro, ["spec.phases[0].globalBatchSize"], cel=True),
        # The lead's refusal in bertjob_api.validation (issue 30, item 3).
        _job("mpijob-on-habana-hpu", habana, ["spec.launcher"], cel=True),
        # 30% of 128 tokens is 38 masked positions, above phase 1's 20 (and 154 above phase 2's 80).
        _job(
            "masking-capped-below-its-rate",
            with_value(good, "spec.data.maskedLmProb", 0.3),
            ["spec.phases[0].maxPredictionsPerSeq", "spec.phases[1].maxPredictionsPerSeq"],
            cel=True,
        ),
        # NVIDIA's fine-tuning scripts need the NSP head that objective mlm never trains.
        _job(
            "mlm-with-nvidia-export",
            with_value(with_value(good, "spec.objective", "mlm"), "spec.export", {"nvidia": True}),
            ["spec.export.nvidia"],
            cel=True,
        ),
        # A ramp grows the accumulation: refused without any, and under Horovod.
        _job(
            "batch-ramp-without-accumulation",
            with_value(good, "spec.phases.1.batchRampProportion", 0.25),
            ["spec.phases[1].batchRampProportion"],
            cel=True,
        ),
        _job(
            "batch-ramp-under-horovod",
            with_value(
                with_value(micro_ramp, "spec.launcher", "trainjob"), "spec.trainJob", {"mlPolicy": "mpi"}
            ),
            ["spec.phases[0].batchRampProportion"],
            cel=True,
        ),
        _job("batch-ramp-under-ddp", micro_ramp, [], cel=True),
        # A budget fixes the steps: both at once are refused.
        _job(
            "budget-with-steps",
            with_value(good, "spec.budget", {"time": "2h"}),
            ["spec.phases[0].steps", "spec.phases[1].steps"],
            cel=True,
        ),
        _job("bad-name", with_value(good, "metadata.name", "Bad_Name"), ["metadata.name"], cel=False),
        _job(
            "schema-wrong-type",
            with_value(good, "spec.phases.0.steps", "many"),
            ["spec.phases[0].steps"],
            cel=False,
            schema=True,
        ),
        _job(
            "three-problems-all-named",
            # A name of 60 characters passes alone, but the names made from it would not.
            with_value(three, "metadata.name", "a" * 60),
            ["metadata.name", "spec.phases[0].globalBatchSize", "spec.phases[1].globalBatchSize"],
            cel=False,
        ),
        _job("no-spec", no_spec, ["spec"], cel=False, schema=True),
        # spec.pod.labels and annotations reach every pod; the operator's and the pods' controllers'
        # label keys are reserved, at apply too (the CRD's rule on spec.pod).
        _job(
            "pod-labels-and-annotations",
            with_value(
                good,
                "spec.pod",
                {"labels": {"team": "nlp"}, "annotations": {"sidecar.istio.io/inject": "false"}},
            ),
            [],
            cel=True,
        ),
        _job(
            "pod-label-of-the-operator",
            with_value(good, "spec.pod", {"labels": {"team": "nlp", "bertjob.dev/job": "other"}}),
            ["spec.pod.labels"],
            cel=True,
        ),
        _job(
            "pod-label-of-the-training-operator",
            with_value(good, "spec.pod", {"labels": {"training.kubeflow.org/replica-type": "master"}}),
            ["spec.pod.labels"],
            cel=True,
        ),
        _job(
            "pod-label-value-not-a-label-value",
            with_value(good, "spec.pod", {"labels": {"team": "n l p"}}),
            ["spec.pod.labels.team"],
            cel=False,
            schema=True,
        ),
        # What no schema or rule can say of a map's keys: the webhook's alone.
        _job(
            "pod-annotation-key-not-a-key",
            with_value(good, "spec.pod", {"annotations": {"not a key": "x"}}),
            ["spec.pod.annotations"],
            cel=False,
        ),
        # Trainer's TrainJob CRD bounds trainer.image at 500 characters; a pod template does not.
        _job(
            "trainjob-image-over-500",
            with_value(example("bert-base-trainjob.yaml"), "spec.image", "registry/" + "i" * 492),
            ["spec.image"],
            cel=False,
        ),
        *_examples(),
    ]


def change_cases() -> list[dict[str, Any]]:
    """The UPDATE requests, built anew (see the module's docstring for the keys)."""
    good = valid_job()
    old = running(good)
    labelled = copy.deepcopy(old)
    labelled["metadata"]["labels"] = {"team": "nlp"}
    labelled["metadata"]["finalizers"] = ["example.com/keep"]
    progressed = copy.deepcopy(old)
    progressed["status"]["progress"] = {"phase": 1, "step": 10}
    bad_batch = with_value(good, "spec.topology", {"nodes": 1, "processesPerNode": 3})
    refused = refused_as_invalid(bad_batch, "spec.phases[0].globalBatchSize: 64 is not divisible")
    trainjob = stored(example("bert-base-trainjob.yaml"))
    trainjob_running = running(trainjob, "TrainJob")
    new_image = "ghcr.io/bertjob/trainer:0.2.0"

    def change(id_: str, before: dict[str, Any], after: dict[str, Any], fields: list[str]) -> dict[str, Any]:
        return {
            "id": id_,
            "old": before,
            "new": after,
            "allowed": not fields,
            "fields": fields,
            "cel": False,
            "accepted": None,
        }

    def spec_set(obj: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
        after = with_value(obj, dotted, value)
        after["metadata"]["generation"] = obj["metadata"]["generation"] + 1
        return after

    # An image change stored before the webhook ran (and refused by the operator after the fact),
    # then set back: the children's spec is the one to compare with, not the stored one.
    reverted_accepted = with_value(
        with_value(good, "metadata.name", "reverted"), "metadata.namespace", NAMESPACE
    )
    reverted_old = spec_set(running(reverted_accepted), "spec.image", new_image)
    revert = change(
        "refused-change-set-back",
        reverted_old,
        spec_set(reverted_old, "spec.image", good["spec"]["image"]),
        [],
    )
    revert["accepted"] = reverted_accepted
    return [
        revert,
        change("suspend-toggled", old, spec_set(old, "spec.runPolicy", {"suspend": True}), []),
        change("backoff-limit-of-pytorchjob", old, spec_set(old, "spec.runPolicy", {"backoffLimit": 3}), []),
        change("image-changed-with-children", old, spec_set(old, "spec.image", new_image), ["spec.image"]),
        change(
            "image-and-suspend-changed-with-children",
            old,
            spec_set(spec_set(old, "spec.image", new_image), "spec.runPolicy", {"suspend": True}),
            ["spec.image"],
        ),
        # A TrainJob's launcher applies suspend alone to a running TrainJob (a TrainJob takes an
        # activeDeadlineSeconds when created, but not later).
        change(
            "deadline-of-trainjob",
            trainjob_running,
            spec_set(trainjob_running, "spec.runPolicy", {"activeDeadlineSeconds": 3600}),
            ["spec.runPolicy.activeDeadlineSeconds"],
        ),
        change(
            "deadline-of-pytorchjob",
            old,
            spec_set(old, "spec.runPolicy", {"activeDeadlineSeconds": 3600}),
            [],
        ),
        change(
            "invalid-change-refused-whole",
            old,
            spec_set(
                spec_set(old, "spec.topology", {"nodes": 1, "processesPerNode": 3}),
                "spec.runPolicy",
                {"suspend": True},
            ),
            ["spec.phases[0].globalBatchSize", "spec.phases[1].globalBatchSize"],
        ),
        # The defaults are compared, not the text: naming the default launcher changes nothing.
        change("default-written-out", old, spec_set(old, "spec.launcher", "pytorchjob"), []),
        change("metadata-only", old, labelled, []),
        change("status-only", old, progressed, []),
        # A job stored with a bad spec (before the webhook) must still take its finalizers' removal.
        change(
            "metadata-only-of-invalid-job",
            refused,
            with_value(refused, "metadata.finalizers", []),
            [],
        ),
        change(
            "fix-of-invalid-spec",
            refused,
            spec_set(refused, "spec.topology", {"nodes": 1, "processesPerNode": 2}),
            [],
        ),
        change(
            "fix-of-invalid-spec-still-invalid",
            refused,
            spec_set(refused, "spec.phases.0.steps", 0),
            ["spec.phases[0].steps"],
        ),
        # Before the operator handled it (no phase), the job has no children: any valid spec goes.
        change(
            "image-changed-before-children", stored(good), spec_set(stored(good), "spec.image", new_image), []
        ),
    ]


JOB_CASES = job_cases()
CHANGE_CASES = change_cases()
