"""Checks across fields (batch split, phases, volumes and paths, pass-through objects), by
purpose: cluster, training, no-training."""

import re
from decimal import Decimal

import pytest

from bertjob_api import kubenames, passthrough
from bertjob_api.defaults import with_defaults
from bertjob_api.jobfile import MAX_BYTES, dump
from bertjob_api.spec import SpecError, parse_job, to_document
from bertjob_api.validation import (
    MAX_OBJECT_BYTES,
    check,
    checked,
    cluster_job,
    cluster_problems,
    json_bytes,
    object_size_problems,
    problems,
)
from bertjob_testing.jobs import DELETE, valid_job, with_value


def _problems(document):
    return dict(problems(with_defaults(parse_job(document).spec)))


def test_valid_job_has_no_problems():
    assert _problems(valid_job()) == {}


def test_a_budget_in_place_of_steps_is_accepted():
    budgeted = with_value(valid_job(), "spec.budget", {"time": "1h30m", "calibrationProportion": 0.05})
    for index in (0, 1):
        budgeted = with_value(budgeted, f"spec.phases.{index}.steps", DELETE)
    assert _problems(budgeted) == {}
    assert _problems(with_value(budgeted, "spec.phases.0.budgetProportion", 0.8)) == {}


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        ({"time": "2 hours"}, "String should match pattern"),
        ({"time": "0h0m"}, "time must be longer than 0s"),
        ({"time": "1h", "calibrationProportion": 1.0}, "less than 1"),
        ({"time": "1h", "calibrationProportion": 0}, "greater than 0"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_field(budget, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        parse_job(with_value(valid_job(), "spec.budget", budget))


def test_a_ramp_with_accumulation_under_ddp_is_accepted():
    ramped = with_value(
        with_value(valid_job(), "spec.phases.0.batchRampProportion", 0.2), "spec.phases.0.microBatchSize", 32
    )
    assert _problems(ramped) == {}


@pytest.mark.parametrize(
    ("changes", "path", "message"),
    [
        (
            {"spec.phases.0.globalBatchSize": 65, "spec.phases.0.microBatchSize": 8},
            "spec.phases[0].globalBatchSize",
            "not divisible by world size 1 x microBatchSize 8",
        ),
        (
            {"spec.topology": {"nodes": 3, "processesPerNode": 1}},
            "spec.phases[0].globalBatchSize",
            "not divisible by world size 3",
        ),
        (
            {"spec.phases.1.maxSeqLength": 64, "spec.phases.1.maxPredictionsPerSeq": 10},
            "spec.phases[1].maxSeqLength",
            "shorter sequences than phase 1",
        ),
        (
            {"spec.data.maskedLmProb": 0.3},
            "spec.phases[0].maxPredictionsPerSeq",
            "20 caps the masking: spec.data.maskedLmProb 0.3 masks 38 of maxSeqLength 128 tokens, so the "
            "rate would silently drop to 15.6%; set maxPredictionsPerSeq to at least 38",
        ),
        (
            {"spec.phases.1.maxPredictionsPerSeq": 76},
            "spec.phases[1].maxPredictionsPerSeq",
            "masks 77 of maxSeqLength 512 tokens",
        ),
        (
            {"spec.objective": "mlm", "spec.export": {"nvidia": True}},
            "spec.export.nvidia",
            "NVIDIA's format holds the NSP head",
        ),
        (
            {"spec.budget": {"time": "2h"}},
            "spec.phases[1].steps",
            "set steps or spec.budget, not both",
        ),
        (
            {"spec.phases.0.steps": DELETE},
            "spec.phases[0].steps",
            "required: set steps, or spec.budget for every phase",
        ),
        (
            {"spec.phases.1.budgetProportion": 0.5},
            "spec.phases[1].budgetProportion",
            "needs spec.budget",
        ),
        (
            {
                "spec.budget": {"time": "90m"},
                "spec.phases.0.steps": DELETE,
                "spec.phases.1.steps": DELETE,
                "spec.phases.0.budgetProportion": 0.7,
                "spec.phases.1.budgetProportion": 0.4,
            },
            "spec.budget",
            "the phases' budgetProportion must add up to 1",
        ),
        (
            {"spec.phases.0.batchRampProportion": 0.2},
            "spec.phases[0].batchRampProportion",
            "the ramp grows the gradient accumulation from 1, and this phase has none",
        ),
        (
            {
                "spec.phases.0.batchRampProportion": 0.2,
                "spec.phases.0.microBatchSize": 8,
                "spec.launcher": "mpijob",
            },
            "spec.phases[0].batchRampProportion",
            "Horovod's backward_passes_per_step and DeepSpeed's config fix it",
        ),
        (
            {
                "spec.phases.1.batchRampProportion": 0.5,
                "spec.phases.1.microBatchSize": 8,
                "spec.optimizer": {"lrScaling": "sqrt", "referenceGlobalBatchSize": 256},
            },
            "spec.phases[1].batchRampProportion",
            "set lrScaling none with a ramp",
        ),
        (
            {"spec.model": {"preset": "bert-tiny", "numAttentionHeads": 3}},
            "spec.model.numAttentionHeads",
            "not divisible by 3 heads",
        ),
        (
            {"spec.model": {"preset": "bert-tiny", "maxPositionEmbeddings": 256}},
            "spec.phases[1].maxSeqLength",
            "exceeds the model's maxPositionEmbeddings 256",
        ),
        (
            {"spec.data.numShards": 8, "spec.data.maxShardMB": 64.0},
            "spec.data.maxShardMB",
            "set numShards or maxShardMB, not both",
        ),
        (
            {"spec.data.packing": "spfhp", "spec.data.masking": "dynamic"},
            "spec.data.packing",
            "packing needs static masking",
        ),
        (
            {"spec.data.finalMaskedLmProb": 0.1},
            "spec.data.finalMaskedLmProb",
            "needs dynamic masking without wholeWordMask",
        ),
        (
            {
                "spec.data.masking": "dynamic",
                "spec.data.maskedLmProb": 0.15,
                "spec.data.finalMaskedLmProb": 0.3,
            },
            "spec.data.finalMaskedLmProb",
            "a masking schedule falls from maskedLmProb",
        ),
        (
            {"spec.model": {"preset": "bert-base", "initFrom": "/models/bert-base-uncased"}},
            "spec.data.vocab.file",
            "needs its own vocabulary",
        ),
        (
            {"spec.evaluation": {"everySteps": 100}},
            "spec.evaluation.everySteps",
            "set spec.data.heldoutFraction",
        ),
        (
            {"spec.launcher": "mpijob", "spec.distributed": {"gradientCompression": "bf16"}},
            "spec.distributed.gradientCompression",
            "bf16 is not available under launcher mpijob",
        ),
        (
            {"spec.launcher": "mpijob", "spec.accelerator": "habana-hpu"},
            "spec.launcher",
            "launcher mpijob cannot run accelerator habana-hpu: its ranks use Horovod",
        ),
        (
            {
                "spec.launcher": "trainjob",
                "spec.trainJob": {"mlPolicy": "mpi"},
                "spec.accelerator": "habana-hpu",
            },
            "spec.launcher",
            "launcher trainjob with trainJob.mlPolicy mpi cannot run accelerator habana-hpu",
        ),
        (
            {
                "spec.launcher": "trainjob",
                "spec.trainJob": {"mlPolicy": "torch"},
                "spec.image": "r/" + "i" * 499,
            },
            "spec.image",
            "501 characters; a TrainJob's trainer.image holds at most 500",
        ),
        (
            {"spec.elastic": {"minNodes": 2, "maxNodes": 4}},
            "spec.elastic.minNodes",
            "2 is more than the 1 nodes of spec.topology",
        ),
        (
            {
                "spec.topology": {"nodes": 4, "processesPerNode": 1},
                "spec.elastic": {"minNodes": 1, "maxNodes": 2},
            },
            "spec.elastic.maxNodes",
            "2 is fewer than the 4 nodes of spec.topology",
        ),
        (
            {"spec.launcher": "mpijob", "spec.elastic": {"minNodes": 1, "maxNodes": 2}},
            "spec.mpi.command",
            "needs horovodrun (elastic Horovod), not mpirun",
        ),
        (
            {
                "spec.launcher": "mpijob",
                "spec.mpi": {"command": "horovodrun"},
                "spec.elastic": {"minNodes": 1, "maxNodes": 2},
            },
            "spec.topology.nodes",
            "elastic Horovod starts on at least 2 nodes",
        ),
    ],
)
def test_inconsistent_spec_names_the_field(changes, path, message):
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    found = problems(with_defaults(parse_job(document).spec))
    assert any(where == path and message in text for where, text in found), found


def test_check_raises_with_every_problem():
    document = with_value(valid_job(), "spec.topology", {"nodes": 3, "processesPerNode": 1})
    with pytest.raises(SpecError) as caught:
        check(with_defaults(parse_job(document).spec), "job.yaml")
    assert len(caught.value.problems) == 2
    assert str(caught.value).startswith("job.yaml: invalid BertPretrainJob")


def test_packed_shards_train():
    assert _problems(with_value(valid_job(), "spec.data.packing", "nnlshp")) == {}


def test_evaluation_is_checked_only_for_training():
    document = with_value(valid_job(), "spec.evaluation", {"everySteps": 100})
    assert problems(with_defaults(parse_job(document).spec), training=False) == []
    assert _problems(with_value(document, "spec.data.heldoutFraction", 0.05)) == {}


def _cluster_problems(document):
    return dict(cluster_problems(with_defaults(parse_job(document).spec)))


def test_the_default_data_volume_holds_every_output():
    assert _cluster_problems(valid_job()) == {}


PVC = {"persistentVolumeClaim": {"claimName": "bert"}}


@pytest.mark.parametrize(
    ("changes", "path", "message"),
    [
        ({"spec.checkpoint.path": "/ckpt"}, "spec.checkpoint.path", "/ckpt is on no writable volume"),
        ({"spec.data.shards": "shards"}, "spec.data.shards", "must be an absolute path"),
        ({"spec.export": {"path": "/models/out"}}, "spec.export.path", "mounted: /data"),
        (
            {"spec.volumes": [{"name": "data", "mountPath": "/data", "readOnly": True, "source": PVC}]},
            "spec.data.shards",
            "on no writable volume (mounted: none)",
        ),
        ({"spec.volumes": [{"name": "dshm", "mountPath": "/x"}]}, "spec.volumes[0].name", "operator's own"),
        (
            {"spec.volumes": [{"name": "a", "mountPath": "/a"}, {"name": "a", "mountPath": "/b"}]},
            "spec.volumes[1].name",
            "also spec.volumes[0]",
        ),
        ({"spec.volumes": [{"name": "a", "mountPath": "/etc/bertjob/"}]}, "spec.volumes[0].mountPath", "own"),
    ],
)
def test_an_output_off_every_volume_names_the_field(changes, path, message):
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    found = _cluster_problems(document)
    assert path in found and message in found[path], found


def test_a_claim_mounted_elsewhere_holds_the_checkpoints():
    document = with_value(valid_job(), "spec.checkpoint.path", "/ckpt/run-1")
    document = with_value(document, "spec.volumes", [{"name": "ckpt", "mountPath": "/ckpt", "source": PVC}])
    assert _cluster_problems(document) == {}


def test_cluster_checks_are_only_made_when_asked():
    spec = with_defaults(parse_job(with_value(valid_job(), "spec.data.shards", "shards")).spec)
    assert check(spec) is spec
    with pytest.raises(SpecError, match=r"spec\.data\.shards"):
        check(spec, cluster=True)


# (a change to valid_job, the field each purpose refuses it for: cluster, training, no-training)
PURPOSES = [
    ({}, None, None, None),
    ({"spec.data.shards": "shards"}, "spec.data.shards", None, None),
    ({"spec.evaluation": {"everySteps": 100}}, *["spec.evaluation.everySteps"] * 2, None),
    ({"spec.topology.processesPerNode": 3}, *["spec.phases[0].globalBatchSize"] * 3),
]


@pytest.mark.parametrize(("changes", "cluster", "training", "no_training"), PURPOSES)
def test_each_purpose_has_its_checks(changes, cluster, training, no_training):
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    spec = parse_job(document).spec
    for purpose, refused in {"cluster": cluster, "training": training, "no-training": no_training}.items():
        if refused is None:
            assert checked(spec, "job.yaml", purpose) == with_defaults(spec)
            continue
        with pytest.raises(SpecError) as caught:
            checked(spec, "job.yaml", purpose)
        assert refused in dict(caught.value.problems), (purpose, caught.value.problems)


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.distributed": {"gradientCompression": "bf16", "timeoutSeconds": 30}},
        {"spec.launcher": "mpijob", "spec.distributed": {"gradientCompression": "fp16"}},
        {"spec.elastic": {"minNodes": 1, "maxNodes": 1, "maxRestarts": 0}},
        {"spec.accelerator": "habana-hpu"},
        {
            "spec.launcher": "trainjob",
            "spec.trainJob": {"mlPolicy": "torch"},
            "spec.accelerator": "habana-hpu",
        },
        {"spec.launcher": "mpijob", "spec.accelerator": "xeon-cpu"},
        {
            "spec.launcher": "mpijob",
            "spec.mpi": {"command": "horovodrun"},
            "spec.topology": {"nodes": 2, "processesPerNode": 1},
            "spec.elastic": {"minNodes": 1, "maxNodes": 8},
        },
    ],
)
def test_distributed_settings_every_launcher_can_run(changes):
    document = valid_job()
    for field, value in changes.items():
        document = with_value(document, field, value)
    assert _problems(document) == {}


# What a real API server or Kubeflow operator would refuse, refused before anything is created
# (issue 15, items 13 and 14): by parse_job for one field, by cluster_job across fields.


def _refusals(document):
    """Every problem parse_job and then cluster_job (what `bertjob validate` and the operator run)
    find in ``document``, by path; empty when the job is accepted."""
    try:
        cluster_job(parse_job(document))
    except SpecError as error:
        return dict(error.problems)
    return {}


def _changed(changes):
    """valid_job() with each dotted field set, the objects on the way made as needed."""
    document = valid_job()
    for field, value in changes.items():
        *parents, last = field.split(".")
        node = document
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        node[int(last) if isinstance(node, list) else last] = value
    return document


def test_a_volume_source_cannot_rename_the_volume():
    # The source's name would replace the volume's own and slip past the reserved-name check.
    volume = {
        "name": "scratch",
        "mountPath": "/scratch",
        "source": {"name": "job-config", "hostPath": {"path": "/etc"}},
    }
    found = _refusals(_changed({"spec.volumes": [volume]}))
    assert "spec.volumes[0].source.name" in found, found
    assert "spec.volumes[0].name" in found["spec.volumes[0].source.name"]


LONG_NAME = "j" * 63
API_REFUSALS = [
    # name, changes, path, part of the message
    (
        "prepare-job-name-over-63",
        {"metadata.name": LONG_NAME, "spec.prepare": {"enabled": True}},
        "metadata.name",
        f"{LONG_NAME}-prepare",
    ),
    (
        "worker-name-over-63",
        {
            "metadata.name": "j" * 54,
            "spec.topology.nodes": 12,
            "spec.phases.0.globalBatchSize": 72,
            "spec.phases.1.globalBatchSize": 36,
        },
        "metadata.name",
        "-worker-10",
    ),
    ("name-starting-with-a-digit", {"metadata.name": "1job"}, "metadata.name", "start with a letter"),
    ("namespace-not-a-dns-label", {"metadata.namespace": "Team_A"}, "metadata.namespace", "DNS label"),
    ("namespace-with-newline", {"metadata.namespace": "team\nb"}, "metadata.namespace", "DNS label"),
    ("queue-name-not-a-label-value", {"spec.queueName": "queue one!"}, "spec.queueName", "label value"),
    ("queue-name-over-63", {"spec.queueName": "q" * 64}, "spec.queueName", "label value"),
    (
        "quantity-shell",
        {"spec.pod.resources": {"requests": {"cpu": "; rm -rf / #"}}},
        "spec.pod.resources.requests.cpu",
        "quantity",
    ),
    (
        "quantity-negative",
        {"spec.pod.resources": {"requests": {"cpu": -1}}},
        "spec.pod.resources.requests.cpu",
        "negative",
    ),
    (
        "quantity-negative-string",
        {"spec.pod.resources": {"limits": {"memory": "-1Gi"}}},
        "spec.pod.resources.limits.memory",
        "negative",
    ),
    (
        "quantity-huge-string",
        {"spec.pod.resources": {"requests": {"cpu": "1e30"}}},
        "spec.pod.resources.requests.cpu",
        "2^63",
    ),
    (
        "quantity-huge-number",
        {"spec.pod.resources": {"requests": {"cpu": 1e30}}},
        "spec.pod.resources.requests.cpu",
        "2^63",
    ),
    (
        "quantity-nan",
        {"spec.pod.resources": {"requests": {"cpu": float("nan")}}},
        "spec.pod.resources.requests.cpu",
        "quantity",
    ),
    (
        "quantity-bool",
        {"spec.prepare": {"resources": {"limits": {"cpu": True}}}},
        "spec.prepare.resources.limits.cpu",
        "quantity",
    ),
    (
        "quantity-trailing-newline",
        {"spec.pod.resources": {"requests": {"cpu": "1\n"}}},
        "spec.pod.resources.requests.cpu",
        "quantity",
    ),
    (
        "resource-name",
        {"spec.pod.resources": {"requests": {"c p u": 1}}},
        "spec.pod.resources.requests",
        "resource name",
    ),
    (
        "backoff-limit-over-int32",
        {"spec.runPolicy": {"backoffLimit": 2**31}},
        "spec.runPolicy.backoffLimit",
        "2147483647",
    ),
    (
        "ttl-over-int32",
        {"spec.runPolicy": {"ttlSecondsAfterFinished": 2**31}},
        "spec.runPolicy.ttlSecondsAfterFinished",
        "2147483647",
    ),
    (
        # kustomize reads numbers as 64-bit floats: beyond 2^53 they come out rounded.
        "deadline-over-2^53",
        {"spec.runPolicy": {"activeDeadlineSeconds": 2**53 + 1}},
        "spec.runPolicy.activeDeadlineSeconds",
        "9007199254740992",
    ),
    (
        "min-available-over-int32",
        {"spec.runPolicy": {"schedulingPolicy": {"minAvailable": 2**31}}},
        "spec.runPolicy.schedulingPolicy.minAvailable",
        "2147483647",
    ),
    (
        "schedule-timeout-over-int32",
        {"spec.runPolicy": {"schedulingPolicy": {"scheduleTimeoutSeconds": 2**40}}},
        "spec.runPolicy.schedulingPolicy.scheduleTimeoutSeconds",
        "2147483647",
    ),
    (
        "elastic-over-int32",
        {"spec.elastic": {"minNodes": 1, "maxNodes": 2**31}},
        "spec.elastic.maxNodes",
        "2147483647",
    ),
    (
        "restarts-over-int32",
        {"spec.elastic": {"minNodes": 1, "maxNodes": 1, "maxRestarts": 2**31}},
        "spec.elastic.maxRestarts",
        "2147483647",
    ),
    ("steps-over-int64", {"spec.phases.0.steps": 2**64}, "spec.phases[0].steps", "9223372036854775807"),
    (
        "learning-rate-inf",
        {"spec.phases.0.learningRate": float("inf")},
        "spec.phases[0].learningRate",
        "finite",
    ),
    (
        "affinity-unknown-field",
        {"spec.pod.affinity": {"nodeAffinity": {"preferred": []}}},
        "spec.pod.affinity.nodeAffinity.preferred",
        "unknown field",
    ),
    ("env-without-name", {"spec.pod.env": [{"value": "1"}]}, "spec.pod.env[0].name", "required"),
    (
        "env-name-not-a-variable-name",
        {"spec.pod.env": [{"name": "A=B", "value": "1"}]},
        "spec.pod.env[0].name",
        "environment variable name",
    ),
    (
        "toleration-seconds-string",
        {"spec.pod.tolerations": [{"operator": "Exists", "tolerationSeconds": "60"}]},
        "spec.pod.tolerations[0].tolerationSeconds",
        "integer",
    ),
    (
        "security-context-user-name",
        {"spec.pod.securityContext": {"runAsUser": "root"}},
        "spec.pod.securityContext.runAsUser",
        "integer",
    ),
    (
        "security-context-over-2^53",
        {"spec.pod.securityContext": {"runAsUser": 2**63 - 1}},
        "spec.pod.securityContext.runAsUser",
        "2^53",
    ),
    (
        "volume-mode-over-int32",
        {
            "spec.volumes": [
                {"name": "x", "mountPath": "/x", "source": {"configMap": {"name": "c", "defaultMode": 2**31}}}
            ]
        },
        "spec.volumes[0].source.configMap.defaultMode",
        "32-bit",
    ),
    (
        "volume-source-field-type",
        {"spec.volumes": [{"name": "x", "mountPath": "/x", "source": {"hostPath": {"path": 5}}}]},
        "spec.volumes[0].source.hostPath.path",
        "string",
    ),
    (
        "volume-source-unknown",
        {"spec.volumes": [{"name": "x", "mountPath": "/x", "source": {"s3": {"bucket": "b"}}}]},
        "spec.volumes[0].source.s3",
        "unknown field",
    ),
    (
        "volume-two-sources",
        {
            "spec.volumes": [
                {"name": "x", "mountPath": "/x", "source": {"emptyDir": {}, "hostPath": {"path": "/x"}}}
            ]
        },
        "spec.volumes[0].source",
        "exactly one",
    ),
    (
        "volume-size-nan",
        {
            "spec.volumes": [
                {"name": "x", "mountPath": "/x", "source": {"emptyDir": {"sizeLimit": float("nan")}}}
            ]
        },
        "spec.volumes[0].source.emptyDir.sizeLimit",
        "JSON",
    ),
    ("node-selector-key", {"spec.pod.nodeSelector": {"a b": "c"}}, "spec.pod.nodeSelector", "label key"),
    (
        "node-selector-value",
        {"spec.pod.nodeSelector": {"zone": "a b"}},
        "spec.pod.nodeSelector.zone",
        "label value",
    ),
    (
        "service-account-name",
        {"spec.pod.serviceAccountName": "Trainer SA"},
        "spec.pod.serviceAccountName",
        "DNS subdomain",
    ),
    ("image-with-trailing-space", {"spec.image": "trainer:1 "}, "spec.image", "whitespace"),
    # spec.pod.labels and annotations land on every pod: keys and values as the API server takes
    # them, and no key the operator or the pods' controllers set (spec.cluster.reserved_pod_label).
    (
        "pod-label-key-with-space",
        {"spec.pod.labels": {"a b": "x"}},
        "spec.pod.labels",
        "not a valid label key",
    ),
    ("pod-label-key-two-slashes", {"spec.pod.labels": {"a/b/c": "x"}}, "spec.pod.labels", "label key"),
    ("pod-label-value", {"spec.pod.labels": {"team": "-nlp"}}, "spec.pod.labels.team", "valid label value"),
    (
        "pod-label-value-over-63",
        {"spec.pod.labels": {"team": "x" * 64}},
        "spec.pod.labels.team",
        "at most 63",
    ),
    (
        "pod-label-of-the-operator",
        {"spec.pod.labels": {"app.kubernetes.io/component": "x"}},
        "spec.pod.labels",
        "'app.kubernetes.io/component' is a reserved key",
    ),
    (
        "pod-label-of-jobset",
        {"spec.pod.labels": {"jobset.sigs.k8s.io/jobset-name": "x"}},
        "spec.pod.labels",
        "reserved key",
    ),
    (
        "pod-label-of-kueue",
        {"spec.pod.labels": {"kueue.x-k8s.io/queue-name": "x"}},
        "spec.pod.labels",
        "set spec.queueName for Kueue",
    ),
    (
        "pod-labels-over-64",
        {"spec.pod.labels": {f"label-{index}": "x" for index in range(65)}},
        "spec.pod.labels",
        "at most 64",
    ),
    (
        "pod-annotation-key",
        {"spec.pod.annotations": {"-x": "y"}},
        "spec.pod.annotations",
        "not a valid annotation key",
    ),
    (
        "pod-annotations-over-256-kib",
        {"spec.pod.annotations": {"a": "x" * 256 * 1024}},
        "spec.pod.annotations",
        "262145 bytes, over the 262144",
    ),
]


@pytest.mark.parametrize(
    ("changes", "path", "says"), [case[1:] for case in API_REFUSALS], ids=[case[0] for case in API_REFUSALS]
)
def test_what_the_api_server_refuses_is_refused_naming_the_field(changes, path, says):
    found = _refusals(_changed(changes))
    assert path in found, found
    assert says in found[path], found[path]
    assert "\n" not in found[path]


@pytest.mark.parametrize(
    "changes",
    [
        {
            "spec.pod.resources": {
                "requests": {"cpu": 0.5, "memory": "1.5Gi"},
                "limits": {"cpu": "1500m", "memory": 2**33},
            }
        },
        {"spec.pod.resources": {"requests": {"hugepages-2Mi": "1Gi", "example.com/fpga": 1}}},
        # The training operator's Service <name>-master-0 is the longest name made from it.
        {"metadata.name": "j" * 54, "spec.prepare": {"enabled": True}},
        {"metadata.namespace": "team-a", "spec.queueName": "Team_A.queue-1"},
        {"spec.runPolicy": {"backoffLimit": 2**31 - 1, "activeDeadlineSeconds": 2**40}},
        {
            "spec.pod.affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]
                    }
                }
            }
        },
        {
            "spec.pod.env": [
                {"name": "HF_HOME", "value": "/data/hf"},
                {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}},
            ]
        },
        {"spec.pod.tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
        {"spec.pod.securityContext": {"runAsUser": 1000, "fsGroup": 1000, "runAsNonRoot": True}},
        {
            "spec.volumes": [
                {
                    "name": "data",
                    "mountPath": "/data",
                    "source": {"emptyDir": {"sizeLimit": "10Gi", "medium": "Memory"}},
                }
            ]
        },
        {"spec.pod.nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}},
        {
            "spec.pod.labels": {
                **{f"label-{index}": "x" for index in range(62)},
                "example.com/empty": "",
                "app.kubernetes.io/part-of": "kubeflow",
            },
            "spec.pod.annotations": {
                "sidecar.istio.io/inject": "false",
                # The operator's own keys are reserved in labels only: it sets no pod annotation.
                "bertjob.dev/note": "x"
                * (256 * 1024 - len("sidecar.istio.io/inject") - 5 - len("bertjob.dev/note")),
            },
        },
    ],
)
def test_what_the_api_server_takes_is_accepted(changes):
    assert _refusals(_changed(changes)) == {}


def test_the_kubernetes_types_are_generated_from_kubernetes_validate():
    assert passthrough.SCHEMA_FILE.read_text(encoding="utf-8") == passthrough.schema_text(
        passthrough.generate()
    ), f"{passthrough.SCHEMA_FILE} is stale: run python -m bertjob_api.passthrough"


@pytest.mark.parametrize(
    ("value", "amount"),
    [("500m", "0.5"), ("1Gi", "1073741824"), ("1e3", "1000"), ("+.5", "0.5"), ("5.", "5"), (0.25, "0.25")],
)
def test_quantities_mean_what_kubernetes_reads(value, amount):
    assert kubenames.parse_quantity(value) == (Decimal(amount), None)


@pytest.mark.parametrize("value", ["1.5.5", "1Ki5", "1 Gi", "Gi", "", "1e", "0x10", "１"])
def test_malformed_quantities_are_refused(value):
    parsed, problem = kubenames.parse_quantity(value)
    assert parsed is None and "not a Kubernetes quantity" in str(problem)


# Found by tests/bertjob/test_fuzz.py: each was accepted, then failed or changed in render().


@pytest.mark.parametrize(
    ("changes", "path"),
    [
        # kustomize refuses DEL and the C1 controls ("control characters are not allowed").
        ({"spec.pod.env": [{"name": "A", "value": "a\x7fb"}]}, "spec.pod.env[0].value"),
        # ... and turns NEL into a line break.
        ({"spec.data.shards": "/data/a\x85b"}, "spec.data.shards"),
        ({"spec.image": "trainer\ufffe"}, "spec.image"),
        ({"spec.pod.affinity": {"nodeAffinity\x9f": {}}}, "spec.pod.affinity"),
    ],
)
def test_text_yaml_cannot_carry_is_refused(changes, path):
    found = _refusals(_changed(changes))
    assert path in found and "control character" in found[path], found


def test_integers_kustomize_would_round_are_refused():
    # kustomize reads the patch's numbers as 64-bit floats: 2^63-1 came out as 9223372036854776000.
    found = _refusals(_changed({"spec.pod.securityContext": {"fsGroup": 2**63 - 1}}))
    assert "2^53" in found["spec.pod.securityContext.fsGroup"]


@pytest.mark.parametrize(
    ("metadata", "path", "says"),
    [
        # Serialising the job for its ConfigMap overflowed: "Maximum serialization depth exceeded".
        ({"labels": {"a": {"a": {"a": {"a": {}}}}}}, "metadata.labels.a", "must be of type string"),
        ({"labels": {"team": "a b"}}, "metadata.labels.team", "label value"),
        ({"labels": {"a b": "x"}}, 'metadata.labels["a b"]', "label key"),
        ({"annotations": {"note": 5}}, "metadata.annotations.note", "must be of type string"),
        ({"lables": {}}, "metadata.lables", "unknown field"),
    ],
)
def test_metadata_the_api_server_refuses_is_refused(metadata, path, says):
    document = valid_job()
    document["metadata"].update(metadata)
    found = _refusals(document)
    assert path in found and says in found[path], found


def test_metadata_nested_without_end_is_refused_without_overflowing():
    labels: dict = {}
    document = valid_job()
    document["metadata"]["labels"] = labels
    for _ in range(100_000):
        labels["a"] = {}
        labels = labels["a"]
    found = _refusals(document)
    assert any("nested deeper than" in message for message in found.values()), found


# The job as the operator stores it (its ConfigMap's job.yaml) must fit the 1 MiB Kubernetes allows
# a ConfigMap, after defaults; a job file within that size may still grow past it (issue 29, item 8).


def _big_env(value_bytes):
    return [{"name": "SMALL", "value": "1"}, {"name": "BLOB", "value": "x" * value_bytes}]


def test_a_job_too_large_for_its_configmap_is_refused_naming_the_field():
    refusals = _refusals(_changed({"spec.pod.env": _big_env(MAX_BYTES)}))
    assert list(refusals) == ["spec.pod.env[1].value"]
    assert refusals["spec.pod.env[1].value"].startswith(
        "takes 1.0 MiB of the 1.0 MiB job file the operator stores"
    )
    assert "limits to 1.0 MiB" in refusals["spec.pod.env[1].value"]


def test_a_job_just_within_its_configmap_is_accepted():
    # A value of one character ("x", unquoted) grows the file by a byte per character added.
    stored = len(dump(to_document(cluster_job(parse_job(_changed({"spec.pod.env": _big_env(1)}))))).encode())
    fits = 1 + MAX_BYTES - stored
    document = _changed({"spec.pod.env": _big_env(fits)})
    assert _refusals(document) == {}
    assert len(dump(to_document(cluster_job(parse_job(document)))).encode()) == MAX_BYTES
    assert list(_refusals(_changed({"spec.pod.env": _big_env(fits + 1)}))) == ["spec.pod.env[1].value"]


def test_many_small_fields_are_named_by_their_list():
    env = [{"name": f"VAR_{index}", "value": "x" * 100} for index in range(10_000)]
    assert list(_refusals(_changed({"spec.pod.env": env}))) == ["spec.pod.env"]


# Each object rendered for a job must fit what the API server stores (1 MiB as compact JSON); the
# refusal names the field that accounts for most of the object (tests/bertjob/test_object_size.py
# renders real jobs). Here the objects are made by hand: only the values they hold matter.


def _document(changes):
    return to_document(cluster_job(parse_job(_changed(changes))))


def _object(kind, *held):
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": "demo"}, "spec": {"held": list(held)}}


def test_objects_within_the_limit_pass():
    document = _document({})
    fits = _object("PyTorchJob", "x" * (MAX_OBJECT_BYTES - json_bytes(_object("PyTorchJob", ""))))
    assert json_bytes(fits) == MAX_OBJECT_BYTES
    assert object_size_problems(document, [fits]) == []


def test_a_value_held_twice_is_named_with_the_object_its_size_and_the_limit():
    env = [{"name": "SMALL", "value": "1"}, {"name": "BLOB", "value": "y" * 600_000}]
    document = _document({"spec.pod.env": env})
    big = _object("PyTorchJob", *env, *env, document["spec"]["image"])
    [(field, message)] = object_size_problems(document, [_object("Role"), big])
    assert field == "spec.pod.env[1].value"
    assert message.startswith(
        f"takes 1.1 MiB of PyTorchJob/demo, which would be {json_bytes(big)} bytes as JSON"
    )
    assert "more than the 1048576 bytes (1.0 MiB)" in message


def test_a_value_the_object_holds_most_often_is_named_not_the_largest_in_the_job():
    # The ConfigMap holds the largest field of the job once; a child holds the image once per replica.
    env = [{"name": "A", "value": "a" * 500_000}]
    document = _document({"spec.image": "i" * 300_000, "spec.pod.env": env})
    child = _object("PyTorchJob", *[document["spec"]["image"]] * 4, document["spec"]["pod"]["env"][0])
    assert [field for field, _ in object_size_problems(document, [child])] == ["spec.image"]
    config_map = {
        "kind": "ConfigMap",
        "metadata": {"name": "demo-job"},
        "data": {"job.yaml": "j" * MAX_OBJECT_BYTES},
    }
    assert [field for field, _ in object_size_problems(document, [config_map])] == ["spec.pod.env[0].value"]


def test_many_small_values_held_are_named_by_their_list():
    env = [{"name": f"VAR_{index}", "value": "x" * 100} for index in range(6_000)]
    document = _document({"spec.pod.env": env})
    [(field, _)] = object_size_problems(document, [_object("MPIJob", *env, *env)])
    assert field == "spec.pod.env"


@pytest.mark.parametrize(
    ("launcher", "length"), [("trainjob", 500), ("pytorchjob", 501), ("mpijob", 100_000)]
)
def test_only_a_trainjob_bounds_the_image(launcher, length):
    document = with_value(valid_job(), "spec.launcher", launcher)
    document = with_value(document, "spec.image", "r/" + "i" * (length - 2))
    found = problems(with_defaults(parse_job(document).spec))
    assert not [where for where, _ in found if where == "spec.image"], found
