import pytest

from bertjob.defaults import with_defaults
from bertjob.spec import SpecError, parse_job
from bertjob.validation import check, cluster_problems, problems
from jobs import valid_job, with_value


def _problems(document):
    return dict(problems(with_defaults(parse_job(document).spec)))


def test_valid_job_has_no_problems():
    assert _problems(valid_job()) == {}


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


@pytest.mark.parametrize(
    "changes",
    [
        {"spec.distributed": {"gradientCompression": "bf16", "timeoutSeconds": 30}},
        {"spec.launcher": "mpijob", "spec.distributed": {"gradientCompression": "fp16"}},
        {"spec.elastic": {"minNodes": 1, "maxNodes": 1, "maxRestarts": 0}},
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
