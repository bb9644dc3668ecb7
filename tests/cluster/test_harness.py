"""The test cluster's own promises (bertjob_testing.cluster), each with real processes:

- a component is registered before its probe runs, so a probe that raises leaves nothing running;
- ``stop`` tries every process and reports every one it could not stop;
- the reaper stops a cluster whose test run died without stopping it, and a pytest run killed with
  SIGKILL leaves no process of its control plane behind;
- two runs on one machine share no fixed port or directory: mpi-operator's constant ``:8080`` is
  inside a network namespace of its own, training-operator's fixed certificate directory is a
  directory of the run's, mounted in a mount namespace of its own;
- the build script and the Python side read one table of components.

Why kwok: no pod runs here, fake or real: these are the harness's own processes (sleepers, a bare
API server, its reaper); tests/node/test_real_node.py checks that the real node leaves nothing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bertjob_testing.cluster import catalog, process, reaper
from bertjob_testing.cluster.controlplane import ControlPlane
from bertjob_testing.cluster.process import Registry, StopError, running, stop_all, with_testing_on_path

REPO = Path(__file__).resolve().parents[2]
GONE_WAIT_S = 30.0


def wait_gone(pids: list[int], wait_s: float = GONE_WAIT_S) -> list[int]:
    """The pids of ``pids`` still alive after ``wait_s`` seconds (none, at once, when all end)."""
    deadline = time.monotonic() + wait_s
    while (left := [pid for pid in pids if running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def sleeper() -> subprocess.Popen[bytes]:
    """A process in a session of its own, as the cluster's components are."""
    return subprocess.Popen(["sleep", "600"], start_new_session=True)


@dataclass
class Sleeper:
    """A component that sleeps, whose probe raises ``error`` (or answers ready)."""

    error: Exception | None = None
    extra_args: list[str] = field(default_factory=list)
    name: str = "sleeper"
    version: str = "v0"

    def command(self) -> list[str]:
        return ["sleep", "600"]

    def environment(self) -> dict[str, str] | None:
        return None

    def ready(self) -> bool:
        if self.error is not None:
            raise self.error
        return True


def test_a_probe_that_raises_leaves_nothing_running(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path)
    with pytest.raises(ConnectionResetError):
        plane.start_component(Sleeper(ConnectionResetError("probe failed")))
    [pid] = plane.pids.values()
    assert running(pid), "registered before its probe ran"
    plane.stop()
    assert not wait_gone([pid])
    assert plane.pids == {}


def test_extra_args_follow_the_components_own(tmp_path: Path) -> None:
    # sleep adds up its arguments: "600" and the extra "30".
    plane = ControlPlane(tmp_path, extra_args={"sleeper": ["30"]})
    started = plane.start_component(Sleeper())
    try:
        assert started.command == ["sleep", "600", "30"]
    finally:
        plane.stop()


def test_stop_tries_every_process_and_names_each_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Registry(tmp_path / "processes")
    first, second, third = sleeper(), sleeper(), sleeper()
    for name, started in (("first", first), ("second", second), ("third", third)):
        registry.add(name, started.pid)
        time.sleep(0.01)
    real = process.stop_group

    def stop_group(pid: int, timeout_s: float = 10.0) -> None:
        if pid == second.pid:
            raise PermissionError("refused")
        real(pid, timeout_s)

    monkeypatch.setattr(process, "stop_group", stop_group)
    with pytest.raises(StopError, match=rf"second \(process group {second.pid}\): PermissionError"):
        stop_all(registry)
    for started in (first, third):
        started.wait(timeout=GONE_WAIT_S)
    assert list(registry.groups()) == ["second"], "the stopped ones are forgotten, the failed one kept"
    monkeypatch.setattr(process, "stop_group", real)
    stop_all(registry)
    second.wait(timeout=GONE_WAIT_S)


def test_the_reaper_stops_the_registry_when_its_owner_ends(tmp_path: Path) -> None:
    owner, component = sleeper(), sleeper()
    registry = Registry(tmp_path / "processes")
    registry.add("component", component.pid)
    watcher = subprocess.Popen(
        [sys.executable, "-m", "bertjob_testing.cluster.reaper", str(registry.directory), str(owner.pid)],
        env=with_testing_on_path(),
    )
    time.sleep(1.0)
    assert component.poll() is None and watcher.poll() is None, "nothing happens while the owner runs"
    owner.kill()
    owner.wait()
    assert watcher.wait(timeout=GONE_WAIT_S) == 0
    assert component.wait(timeout=GONE_WAIT_S) == -signal.SIGTERM
    assert registry.groups() == {}


# A test run that starts a control plane (etcd and the API server, with its reaper) and then waits
# to be killed: its pids go to a file the outer test reads.
HOLDER = """
import json, os, time
from pathlib import Path
from bertjob_testing.cluster.controlplane import ControlPlane

def test_hold(tmp_path):
    plane = ControlPlane(tmp_path / "plane")
    plane.start(api_only=True)
    pids = {**plane.pids, "reaper": plane.reaper}
    Path(os.environ["HOLDER_STATE"]).write_text(json.dumps(pids))
    time.sleep(600)
"""


def killed_holder(tmp_path: Path, source: str, check: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run pytest on test module ``source`` in ``tmp_path``, outside this run (no owner, no shared
    cluster of ours), until it writes its JSON state to ``$HOLDER_STATE``; ``check`` it, then kill
    the run with SIGKILL (whatever ``check`` did); the state."""
    (tmp_path / "test_holder.py").write_text(textwrap.dedent(source))
    state = tmp_path / "state.json"
    environment = {**with_testing_on_path(), "HOLDER_STATE": str(state)}
    environment["PYTHONPATH"] = os.pathsep.join([str(REPO), environment["PYTHONPATH"]])
    for inherited in (reaper.OWNER_ENV, "BERTJOB_CLUSTER_ROOT"):
        environment.pop(inherited, None)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(tmp_path)],
        cwd=tmp_path,
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 180
        while not state.exists():
            assert run.poll() is None, "the inner test run ended before it was up"
            assert time.monotonic() < deadline, "the inner test run was not up in 180 s"
            time.sleep(0.2)
        found: dict[str, Any] = json.loads(state.read_text())
        check(found)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait()
    return found


@pytest.mark.slow
def test_a_test_run_killed_with_sigkill_leaves_no_process(tmp_path: Path) -> None:
    def up(pids: dict[str, Any]) -> None:
        assert {"etcd", "kube-apiserver", "reaper"} <= set(pids)
        assert all(running(pid) for pid in pids.values())

    pids = killed_holder(tmp_path, HOLDER, up)
    left = wait_gone(list(pids.values()))
    for pid in left:  # not to leave them to the rest of the run when this fails
        os.killpg(pid, signal.SIGKILL)
    assert not left, f"left running after SIGKILL: {[n for n, p in pids.items() if p in left]}"


NETNS_ROOT = "a network namespace needs root (CAP_SYS_ADMIN)"


@pytest.mark.skipif(os.geteuid() != 0, reason=NETNS_ROOT)
def test_two_processes_hold_the_same_fixed_port_in_namespaces_of_their_own(tmp_path: Path) -> None:
    """What mpi-operator's ``:8080`` needs: two at once, each reaching this machine's 127.0.0.1
    through the forwarded port."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            connection, _ = server.accept()
            connection.sendall(b"host")
            connection.close()

    threading.Thread(target=answer, daemon=True).start()
    inside = (
        "import socket, sys, time\n"
        "held = socket.socket(); held.bind(('127.0.0.1', 8080)); held.listen()\n"
        f"reply = socket.create_connection(('127.0.0.1', {port})).recv(10)\n"
        "print(reply.decode(), open('/proc/net/dev').read().count(':'), flush=True)\n"
        "time.sleep(2)\n"
    )
    runs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bertjob_testing.cluster.namespaces",
                f"--forward={port}",
                "--",
                sys.executable,
                "-c",
                inside,
            ],
            env=with_testing_on_path(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for run in runs:
        out, err = run.communicate(timeout=60)
        assert run.returncode == 0, err
        # The host answered through the forwarded port; the namespace has loopback alone.
        assert out.split() == ["host", "1"], out


@pytest.mark.skipif(os.geteuid() != 0, reason=NETNS_ROOT.replace("network", "mount"))
def test_a_bound_directory_is_seen_at_the_fixed_path_by_the_command_alone(tmp_path: Path) -> None:
    """What training-operator's fixed /tmp/k8s-webhook-server needs: the run's directory there,
    for the command only."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "tls.crt").write_text("this run's")
    fixed = tmp_path / "fixed"
    inside = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertjob_testing.cluster.namespaces",
            f"--bind={tmp_path / 'run'}:{fixed}",
            "--",
            "cat",
            str(fixed / "tls.crt"),
        ],
        env=with_testing_on_path(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert (inside.returncode, inside.stdout) == (0, "this run's"), inside.stderr
    assert list(fixed.iterdir()) == [], "outside, the fixed path is an empty mount point"
    assert str(fixed) not in Path("/proc/self/mountinfo").read_text()


def test_the_build_script_reads_the_catalog(tmp_path: Path) -> None:
    """hack/build-cluster.sh --check names each component of the catalog at its version, in a
    tools directory where none is built."""
    result = subprocess.run(
        [str(REPO / "hack" / "build-cluster.sh"), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "BERTJOB_TOOLS_DIR": str(tmp_path)},
        check=False,
    )
    assert result.returncode == 1
    named = [
        line.split()[1:3]
        for line in result.stderr.splitlines()
        if line.endswith("(run hack/build-cluster.sh)")
    ]
    assert named == [[each.name, each.version] for each in catalog.COMPONENTS]


def test_each_crd_file_is_listed_by_one_component() -> None:
    files = [Path(path).name for each in catalog.COMPONENTS for path in each.crds]
    assert len(files) == len(set(files))
    owner, inside = catalog.crd_owner("kubeflow.org_mpijobs.yaml")
    assert owner.name == "mpi-operator" and inside.endswith("kubeflow.org_mpijobs.yaml")
