"""The typed spec tree: parsing a BertPretrainJob, its field checks and messages, and the round
trip to a document."""

import pytest

from bertjob_api.jobfile import load_job
from bertjob_api.spec import SpecError, parse_job, parse_spec, to_document
from bertjob_testing.jobs import DELETE, valid_job, with_value


def test_valid_job_round_trips_through_its_document():
    job = parse_job(valid_job())
    assert parse_job(to_document(job)) == job
    assert job.spec.phases[0].max_seq_length == 128
    assert to_document(job)["spec"]["phases"][0]["maxSeqLength"] == 128


@pytest.mark.parametrize(
    ("field", "value", "path", "message"),
    [
        ("spec.topology.nodes", "two", "spec.topology.nodes", "valid integer"),
        ("spec.topology.nodes", 0, "spec.topology.nodes", "greater than or equal to 1"),
        ("spec.phases.0.learningRate", "0.1", "spec.phases[0].learningRate", "valid number"),
        ("spec.data.lowercase", "yes", "spec.data.lowercase", "valid boolean"),
        ("spec.precision", "fp8", "spec.precision", "'bf16', 'fp16' or 'fp32'"),
        ("spec.image", DELETE, "spec.image", "required field is missing"),
        ("spec.phases.0.learningRate", DELETE, "spec.phases[0].learningRate", "required field is missing"),
        ("spec.phases.1.maxSeqLen", 512, "spec.phases[1].maxSeqLen", "unknown field"),
        ("spec.topology.gpus", 8, "spec.topology.gpus", "unknown field"),
        ("spec.phases.0.maxPredictionsPerSeq", 200, "spec.phases[0]", "smaller than maxSeqLength"),
        ("spec.data.vocab", {}, "spec.data.vocab", "exactly one of trainSize and file"),
        ("metadata.name", "Bad_Name", "metadata.name", "not a DNS-1035 label"),
        ("kind", "PyTorchJob", "kind", "BertPretrainJob"),
        (
            "spec.distributed",
            {"gradientCompression": "int8"},
            "spec.distributed.gradientCompression",
            "'bf16'",
        ),
        (
            "spec.distributed",
            {"timeoutSeconds": 5},
            "spec.distributed.timeoutSeconds",
            "greater than or equal to 10",
        ),
        ("spec.elastic", {"minNodes": 1}, "spec.elastic.maxNodes", "required field is missing"),
        (
            "spec.elastic",
            {"minNodes": 0, "maxNodes": 2},
            "spec.elastic.minNodes",
            "greater than or equal to 1",
        ),
        (
            "spec.elastic",
            {"minNodes": 3, "maxNodes": 2},
            "spec.elastic",
            "minNodes 3 is greater than maxNodes 2",
        ),
        (
            "spec.elastic",
            {"minNodes": 1, "maxNodes": 2, "maxRestarts": -1},
            "spec.elastic.maxRestarts",
            "greater than or equal to 0",
        ),
    ],
)
def test_bad_field_is_refused_naming_it(field, value, path, message):
    with pytest.raises(SpecError) as caught:
        parse_job(with_value(valid_job(), field, value))
    problems = dict(caught.value.problems)
    assert path in problems, caught.value
    assert message in problems[path]
    assert path in str(caught.value)


def test_spec_errors_are_prefixed_with_spec():
    with pytest.raises(SpecError) as caught:
        parse_spec(with_value(valid_job(), "spec.topology.nodes", -1)["spec"])
    assert [path for path, _ in caught.value.problems] == ["spec.topology.nodes"]


def test_load_job_names_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match=r"nope\.yaml: no such file or directory$"):
        load_job(missing)
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_job(broken)


def test_a_long_list_of_problems_is_shown_by_its_first():
    document = with_value(valid_job(), "spec.data.sources", [{"path": 1}] * 100)
    with pytest.raises(SpecError) as caught:
        parse_job(document)
    lines = str(caught.value).splitlines()
    assert len(caught.value.problems) == 100
    assert len(lines) == 22 and lines[-1].startswith("  ... and ")


@pytest.mark.parametrize(
    ("accelerator", "compile", "compiles"),
    [
        ("nvidia-gpu", DELETE, True),  # unset: compiled where TorchInductor's kernels pay
        ("xeon-cpu", DELETE, False),
        ("habana-hpu", DELETE, False),
        ("nvidia-gpu", False, False),
        ("xeon-cpu", True, True),
        ("habana-hpu", True, True),
    ],
)
def test_compile_unset_means_compiled_on_nvidia_gpus_only(accelerator, compile, compiles):
    document = with_value(valid_job(), "spec.accelerator", accelerator)
    if compile is not DELETE:
        document = with_value(document, "spec.compile", compile)
    spec = parse_job(document).spec
    assert spec.compiles is compiles
    # Under DeepSpeed only when asked for: ZeRO-3 gathers parameters in hooks around each module.
    deepspeed = parse_job(with_value(document, "spec.distributed", {"deepspeed": {"zeroStage": 3}})).spec
    assert deepspeed.compiles is (compile is True)
    assert spec.compile is (None if compile is DELETE else compile)
    assert ("compile" in to_document(parse_job(document))["spec"]) is (compile is not DELETE)
