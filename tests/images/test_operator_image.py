"""The operator image run as its Deployment runs it, against the Kubernetes API emulator on 127.0.0.1.

The container runs the image's own command (its CMD, which is the Deployment's) as the Deployment's
user, with a host directory at each of the Deployment's volume mounts (/tmp) and the kubeconfig of
the emulator read-only, on a read-only root filesystem as the Deployment's readOnlyRootFilesystem
makes it (so a write anywhere else, even to a file deleted at once, fails the operator). A
BertPretrainJob created in the emulator must become a PyTorchJob (rendered inside the image, by its
kubectl's kustomize), and the Kubeflow conditions reported on the child must move the job's phase.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from bertjob_testing.jobs import REPO, valid_job, with_value
from bertjob_testing.kube_emulator import answers, cluster_crds, running_cluster
from tests.images.buildah_images import BUILD_TIMEOUT_S, Buildah, Built, Mount, volume_dir
from tests.kubeflow_env import kubeflow_condition

# The first test waits for the session's image builds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT_S + 300)]

DEPLOYMENT = yaml.safe_load((REPO / "manifests" / "deployment.yaml").read_text())
PYTORCHJOBS = "kubeflow.org/v1/pytorchjobs"
# Where the container finds the emulator's kubeconfig (a cluster's operator uses its service
# account instead).
KUBECONFIG_IN_CONTAINER = "/etc/bertjob-test/kubeconfig"
# Seconds for the container to start and kopf to answer on its liveness endpoint.
START_WAIT_S = 120
# The image holds the job API and the operator, and not the trainer's code.
ONLY_ITS_PACKAGES = (
    "python -c 'import importlib.util as u, sys; "
    'sys.exit([u.find_spec(p) is not None for p in ("bertjob_api", "bertjob", "bertpretrain")] '
    "!= [True, True, False])'"
)


def _but_liveness(command: list[str]) -> list[str]:
    # The harness serves the liveness probe on a free port of 127.0.0.1 rather than 0.0.0.0:8080,
    # and runs its emulator's one operator --standalone, which the image's CMD leaves to kopf's
    # detection (standalone where no peering object is; the chart's replicas name theirs).
    return [arg for arg in command if not arg.startswith("--liveness=") and arg != "--standalone"]


def test_the_operator_image_turns_a_job_into_a_pytorchjob_and_follows_it(
    operator_image: Built, buildah: Buildah, tmp_path: Path
) -> None:
    pod = DEPLOYMENT["spec"]["template"]["spec"]
    [deployed] = pod["containers"]
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    image_command = buildah.config(operator_image.name)["Cmd"]
    assert image_command == deployed["command"]
    volumes = [
        Mount(volume_dir(tmp_path / "volumes" / mount["name"]), mount["mountPath"])
        for mount in deployed["volumeMounts"]
    ]
    assert deployed["securityContext"]["readOnlyRootFilesystem"] is True
    started: list[list[str]] = []

    kubeconfig = Mount(tmp_path / "operator-kubeconfig", KUBECONFIG_IN_CONTAINER, read_only=True)
    [tmp] = [mount for mount in volumes if mount.target == "/tmp"]
    with buildah.container(operator_image.name) as container:
        # The root filesystem refuses the Deployment's user, and its volumes take writes.
        probe = container.run_argv(
            [
                "sh",
                "-c",
                f"id -u; touch /tmp/probe && ! touch /var/tmp/probe && {ONLY_ITS_PACKAGES}",
            ],
            mounts=volumes,
            user=user,
            read_only_root=True,
        )
        result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr[-2000:]
        assert result.stdout.split() == [user.split(":")[0]] and "Read-only file system" in result.stderr
        assert (tmp.source / "probe").exists()

        def launch(command: list[str], env: dict[str, str]) -> list[str]:
            assert _but_liveness(command) == _but_liveness(image_command), (command, image_command)
            assert Path(env["KUBECONFIG"]) == kubeconfig.source
            started.append(command)
            return container.run_argv(
                command,
                {**env, "KUBECONFIG": kubeconfig.target},
                [*volumes, kubeconfig],
                user,
                read_only_root=True,
            )

        with running_cluster(tmp_path, cluster_crds(), launch=launch, start_wait_s=START_WAIT_S) as cluster:
            name = "from-the-image"
            cluster.create_job(with_value(valid_job(), "metadata.name", name))
            status = cluster.status_when(name, "Pending", wait_s=60)
            child = cluster.object(PYTORCHJOBS, name)
            assert child is not None, cluster.log_tail()
            assert [(c["apiVersion"], c["name"]) for c in status["children"]] == [("kubeflow.org/v1", name)]
            assert child["metadata"]["ownerReferences"][0]["name"] == name
            assert "Master" in child["spec"]["pytorchReplicaSpecs"]

            running = [kubeflow_condition("Created"), kubeflow_condition("Running")]
            cluster.report(PYTORCHJOBS, name, {"conditions": running})
            cluster.status_when(name, "Running")
            succeeded = [
                kubeflow_condition("Created"),
                kubeflow_condition("Running", "False"),
                kubeflow_condition("Succeeded"),
            ]
            cluster.report(PYTORCHJOBS, name, {"conditions": succeeded})
            assert cluster.status_when(name, "Succeeded")["phase"] == "Succeeded"
            # The readiness probe's endpoint, on the metrics port the Deployment sets.
            assert answers(f"{cluster.metrics}/readyz")

    assert len(started) == 1
    log = cluster.log.read_text()
    assert "Traceback" not in log and "Read-only file system" not in log, log[-4000:]
