"""Run a command in namespaces of its own, for the controllers that insist on a fixed port or path,
so that two test runs on one machine do not fight over them:

    python -m bertjob_testing.cluster.namespaces [--forward PORT ...] [--bind SOURCE:TARGET ...] \
        [--netns PATH] -- COMMAND ...
    python -m bertjob_testing.cluster.namespaces --relay ADDRESS:PORT:TARGET_PORT

``--forward``: a network namespace of its own whose loopback forwards PORT to this machine's
127.0.0.1 (mpi-operator's health endpoint is a constant ``:8080``; it still reaches the API server
at the address in its kubeconfig). ``--bind``: a mount namespace of its own where directory SOURCE
is mounted on TARGET (training-operator's certificates are read from the fixed
``/tmp/k8s-webhook-server``), as a kubelet mounts a volume; TARGET is made, empty, when missing.

``--netns``: the network namespace at PATH (``/run/netns/NAME``), made by the caller: the real
node's containerd, kubelet, kube-proxy and CoreDNS run in one of the run's own. ``--relay``: no
command; relay connections to ADDRESS:PORT (an address of this machine's namespace) to
127.0.0.1:TARGET_PORT, until killed: the real node's way to the API server, which listens on
loopback alone.

The namespaces need CAP_SYS_ADMIN (root, as CI runs the tests); without it the command runs in
this machine's namespaces and says so on stderr. The exit status is the command's;
SIGTERM and SIGINT are passed on to it. A connection to a forwarded port of the namespace is
piped to the same port of the host's 127.0.0.1 by threads of this process, which stays in the
host's namespace (a namespace is a thread's: the listening sockets are made in the new one, then
this process returns, and only the command's child enters it before exec).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
_libc = ctypes.CDLL(None, use_errno=True)
# Looked up once here: the command's child calls setns between fork and exec, where it must not
# call into the dynamic loader (another thread may have held its lock at the fork).
_setns = _libc.setns
_unshare = _libc.unshare
_mount = _libc.mount


def _check(result: int, call: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"{call}: {os.strerror(error)}")


def _loopback_up() -> None:
    """Bring ``lo`` of the current namespace up (as ``ip link set lo up``, without iproute2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14s", b"lo", 0, b"")
        flags = struct.unpack("16sH14s", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


def private_namespace(ports: Sequence[int]) -> tuple[int, list[socket.socket]]:
    """A new network namespace with loopback up and a socket listening on each of ``ports`` of its
    127.0.0.1; a descriptor of the namespace and the sockets. The calling thread is back in its
    own namespace on return.

    Raises:
        OSError: the namespace could not be made (no CAP_SYS_ADMIN: EPERM).
    """
    host = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _check(_unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
        try:
            private = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
            _loopback_up()
            listeners = []
            for port in ports:
                listener = socket.socket()
                listener.bind(("127.0.0.1", port))
                listener.listen(64)
                listeners.append(listener)
        finally:
            _check(_setns(host, CLONE_NEWNET), "setns(host)")
    finally:
        os.close(host)
    return private, listeners


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, target):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


def _forward(listener: socket.socket, port: int | None = None) -> None:
    """Accept on ``listener`` and pipe each connection to ``port`` (by default the same port) of
    this machine's 127.0.0.1, both ways."""
    port = port or listener.getsockname()[1]
    while True:
        inside, _ = listener.accept()
        try:
            outside = socket.create_connection(("127.0.0.1", port), timeout=10)
            outside.settimeout(None)
        except OSError:
            inside.close()
            continue
        for source, target in ((inside, outside), (outside, inside)):
            threading.Thread(target=_pipe, args=(source, target), daemon=True).start()


def bind_in_own_mount_namespace(binds: Sequence[tuple[str, str]]) -> None:
    """In the calling process (a child between fork and exec, which has one thread, as
    ``unshare(CLONE_NEWNS)`` requires): a mount namespace of its own, nothing propagating back, with
    each (source, target) directory bind-mounted."""
    _check(_unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for source, target in binds:
        _check(
            _mount(source.encode(), target.encode(), None, MS_BIND, None), f"mount --bind {source} {target}"
        )


def main(argv: Sequence[str]) -> int:
    """Run the command as the module docstring says; its exit status."""
    parser = argparse.ArgumentParser(prog="python -m bertjob_testing.cluster.namespaces")
    parser.add_argument("--forward", type=int, action="append", default=[], metavar="PORT")
    parser.add_argument("--bind", action="append", default=[], metavar="SOURCE:TARGET")
    parser.add_argument("--netns", type=Path, metavar="PATH")
    parser.add_argument("--relay", metavar="ADDRESS:PORT:TARGET_PORT")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.relay:
        address, port, target = args.relay.rsplit(":", 2)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((address, int(port)))
        listener.listen(64)
        _forward(listener, int(target))
        return 0
    if not command:
        parser.error("no command after --")
    binds = [(source, target) for source, _, target in (pair.partition(":") for pair in args.bind)]
    for _, target in binds:
        Path(target).mkdir(parents=True, exist_ok=True)
    private = -1
    try:
        if args.netns:
            private = os.open(args.netns, os.O_RDONLY)
        elif args.forward:
            private, listeners = private_namespace(args.forward)
            for listener in listeners:
                threading.Thread(target=_forward, args=(listener,), daemon=True).start()
        if binds:
            # Tried here first, in a child of our own: a refusal is then said, not an exec failure.
            probe = subprocess.run(
                [sys.executable, "-c", "import sys; sys.exit(0)"],
                preexec_fn=lambda: bind_in_own_mount_namespace([]),
                check=False,
            )
            if probe.returncode != 0:
                raise OSError(1, "a mount namespace could not be made")
    except (OSError, subprocess.SubprocessError) as error:
        print(f"namespaces: {error}; running {command[0]} in this machine's namespaces", file=sys.stderr)
        return subprocess.call(command)

    def enter() -> None:
        if private >= 0:
            _check(_setns(private, CLONE_NEWNET), "setns(private)")
        if binds:
            bind_in_own_mount_namespace(binds)

    child = subprocess.Popen(command, preexec_fn=enter, pass_fds=(private,) if private >= 0 else ())
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda received, _frame: child.send_signal(received))
    return child.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
