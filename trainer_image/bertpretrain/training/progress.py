"""Live progress in the BertPretrainJob's status, so that `kubectl get bertpretrainjobs` shows it.

In a pod rendered by the operator, rank 0 patches ``status.progress`` of its own job through the
status subresource, with the pod's service-account token. The operator gives that account a Role
allowing ``get`` and ``patch`` on ``bertpretrainjobs/status`` of this one job and nothing else,
and passes the job's name and namespace as ``BERTJOB_NAME`` and ``BERTJOB_NAMESPACE``. Outside a
cluster (no ``KUBERNETES_SERVICE_HOST``, or no such variables) nothing is reported.

The request is one JSON merge patch of ``status.progress`` alone, so it never touches what the
operator writes (phase, conditions). Reporting is best effort: a failure is printed once, and
training goes on. The standard library's urllib is enough for one PATCH; the trainer image does
not carry the kubernetes client.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from bertjob_api.contract import NAME_ENV, NAMESPACE_ENV, PROGRESS_FIELD, PROGRESS_FIELDS, status_path

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class StatusReporter:
    """Sends a phase's progress to ``url`` (the job's status subresource) as JSON merge patches.

    ``token_file`` holds the bearer token, read at each request because Kubernetes rotates
    bound service-account tokens; ``ca_file`` verifies the API server (for ``https`` URLs).
    At most one request per ``min_interval_s`` seconds, except for the phase's last step, which
    is always sent; each request waits at most ``timeout_s`` seconds.
    """

    def __init__(
        self,
        url: str,
        total_steps: int,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        min_interval_s: float = 10.0,
        timeout_s: float = 5.0,
    ):
        self.url = url
        self.total_steps = total_steps
        self.token_file = token_file
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self._last_sent = -math.inf
        self._failing = False

    @classmethod
    def from_environment(
        cls, total_steps: int, env: Mapping[str, str] = os.environ, secrets: Path = SERVICE_ACCOUNT
    ) -> StatusReporter | None:
        """The reporter for the job this pod runs, from the variables the operator and the
        kubelet set; None outside a cluster or without the operator's variables."""
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
        name, namespace = env.get(NAME_ENV), env.get(NAMESPACE_ENV)
        if not (host and name and namespace):
            return None
        # An IPv6 service address needs brackets in a URL.
        host = f"[{host}]" if ":" in host else host
        url = f"https://{host}:{port}" + status_path(namespace, name)
        ca_file = secrets / "ca.crt"
        return cls(url, total_steps, secrets / "token", ca_file if ca_file.is_file() else None)

    def report(self, phase: int, step: int, values: Mapping[str, float], force: bool = False) -> bool:
        """Patch ``status.progress`` with phase ``phase`` (from 1), optimizer step ``step`` and
        the finite ones of ``values``' loss, mlm_accuracy and sequences_per_second.

        Returns:
            Whether a request was sent and accepted; False when rate-limited or refused.
        """
        now = time.monotonic()
        if not force and step < self.total_steps and now - self._last_sent < self.min_interval_s:
            return False
        self._last_sent = now
        progress: dict[str, object] = {"phase": phase, "step": step, "totalSteps": self.total_steps}
        progress |= {
            field: round(float(values[key]), 6)
            for key, field in PROGRESS_FIELDS.items()
            if key in values and math.isfinite(values[key])
        }
        progress["updateTime"] = (
            datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")
        )
        return self.send_status({PROGRESS_FIELD: progress})

    def send_status(self, fields: Mapping[str, object]) -> bool:
        """Patch these fields of ``status`` (``progress``, or ``results``: the fine-tuning results)
        in one JSON merge patch, unthrottled. Returns whether the request was sent and accepted."""
        return self._send({"status": dict(fields)})

    def _send(self, patch: dict[str, object]) -> bool:
        headers = {"Content-Type": "application/merge-patch+json", "Accept": "application/json"}
        try:
            if self.token_file is not None:
                headers["Authorization"] = "Bearer " + self.token_file.read_text().strip()
            request = urllib.request.Request(
                self.url, data=json.dumps(patch).encode(), headers=headers, method="PATCH"
            )
            with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.context):
                pass
        except (OSError, ValueError) as error:
            if not self._failing:
                print(f"bertpretrain: cannot report progress to {self.url}: {error}", file=sys.stderr)
            self._failing = True
            return False
        if self._failing:
            print(f"bertpretrain: reporting progress to {self.url} again", file=sys.stderr)
        self._failing = False
        return True
