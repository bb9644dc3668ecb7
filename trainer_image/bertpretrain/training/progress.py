"""Live progress in the BertPretrainJob's status, so that `kubectl get bertpretrainjobs` shows it.

In a pod rendered by the operator, rank 0 sends its progress to the operator, which checks it and
merges it into ``status.progress`` of the job (``status.results`` for fine-tuning's results); the
pod itself may do nothing on the API server. The job's ConfigMap, mounted at ``/etc/bertjob``,
holds the operator's URL for this job and the CA of the operator's certificate
(:data:`~bertjob_api.contract.PROGRESS_URL_KEY`, :data:`~bertjob_api.contract.PROGRESS_CA_KEY`);
the request carries the pod's service-account token that Kubernetes projects for the audience
``bertjob.dev`` alone (at :data:`~bertjob_api.contract.PROGRESS_TOKEN_DIR`), by which the operator
knows the pod and so the job. Without the URL file (outside a cluster, or an operator that
serves no progress) nothing is reported.

A report is one POST of a JSON object of status fields (``{"progress": {...}}``), as Kubeflow
Trainer's progress reports (KEP-2779). Reporting is best effort: a failure (the operator
restarting, a refusal) is printed once, and training goes on. The standard library's urllib is
enough for one POST.
"""

from __future__ import annotations

import datetime
import json
import math
import ssl
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from bertjob_api.contract import (
    CONFIG_DIR,
    PROGRESS_CA_KEY,
    PROGRESS_FIELD,
    PROGRESS_FIELDS,
    PROGRESS_TOKEN_DIR,
    PROGRESS_TOKEN_FILE,
    PROGRESS_URL_KEY,
)


class StatusReporter:
    """Sends a phase's progress to ``url`` (the operator's progress endpoint for this job).

    ``token_file`` holds the bearer token, read at each request because the kubelet renews the
    projected token; ``ca_file`` verifies the operator's certificate (for ``https`` URLs).
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
        cls,
        total_steps: int,
        config_dir: Path = Path(CONFIG_DIR),
        token_dir: Path = Path(PROGRESS_TOKEN_DIR),
    ) -> StatusReporter | None:
        """The reporter for the job this pod runs, from the files the operator's ConfigMap and
        the kubelet put in the pod; None without the operator's URL file (nothing to report to).
        """
        url_file = config_dir / PROGRESS_URL_KEY
        if not url_file.is_file():
            return None
        ca_file = config_dir / PROGRESS_CA_KEY
        return cls(
            url_file.read_text().strip(),
            total_steps,
            token_dir / PROGRESS_TOKEN_FILE,
            ca_file if ca_file.is_file() else None,
        )

    def report(self, phase: int, step: int, values: Mapping[str, float], force: bool = False) -> bool:
        """Report ``status.progress``: phase ``phase`` (from 1), optimizer step ``step`` and
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
        """Send these fields of ``status`` (``progress``, or ``results``: the fine-tuning results)
        in one report, unthrottled. Returns whether the report was sent and accepted."""
        return self._send(dict(fields))

    def _send(self, fields: dict[str, object]) -> bool:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        try:
            if self.token_file is not None:
                headers["Authorization"] = "Bearer " + self.token_file.read_text().strip()
            request = urllib.request.Request(
                self.url, data=json.dumps(fields).encode(), headers=headers, method="POST"
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
