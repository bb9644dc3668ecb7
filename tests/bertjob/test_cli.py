import yaml

from bertjob.cli import main
from jobs import EXAMPLES, valid_job, with_value


def _write(tmp_path, document):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_validate_accepts_a_valid_job(tmp_path, capsys):
    assert main(["validate", str(_write(tmp_path, valid_job()))]) == 0
    assert "valid BertPretrainJob 'demo'" in capsys.readouterr().out


def test_validate_refuses_each_bad_field_by_name(tmp_path, capsys):
    document = with_value(valid_job(), "spec.topology.nodes", "2")
    document = with_value(document, "spec.phases.0.batchSize", 64)
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    err = capsys.readouterr().err
    assert "spec.topology.nodes: Input should be a valid integer" in err
    assert "spec.phases[0].batchSize: unknown field" in err


def test_validate_refuses_an_inconsistent_job(tmp_path, capsys):
    document = with_value(valid_job(), "spec.topology.processesPerNode", 3)
    assert main(["validate", str(_write(tmp_path, document))]) == 2
    assert "spec.phases[0].globalBatchSize: 64 is not divisible by world size 3" in capsys.readouterr().err


def test_validate_checks_as_the_operator_would(capsys):
    # The demo writes under the working directory, which a pod has no volume for.
    assert main(["validate", str(EXAMPLES / "bert-tiny-local.yaml")]) == 2
    assert "spec.data.shards: runs/bert-tiny-local/data must be an absolute path" in capsys.readouterr().err
