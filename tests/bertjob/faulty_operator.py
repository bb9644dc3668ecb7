"""The operator with a fault point, for tests only: ``kopf run -m faulty_operator`` serves the
handlers of :mod:`bertjob.handlers`, and dies (``os._exit``, no cleanup, as under SIGKILL) right
after the API call that ``$BERTJOB_TEST_DIE_AFTER`` names:

- ``status:<Phase>``: the status patch that moves a job to ``<Phase>``;
- ``event:<Reason>``: the posting of the Event with ``<Reason>``.

Nothing is changed when the variable is unset or empty.
"""

from __future__ import annotations

import os
from typing import Any

from bertjob import handlers

FAULT_ENV = "BERTJOB_TEST_DIE_AFTER"
# The operator's exit status when it dies at the fault point, told apart from a crash.
FAULT_EXIT = 86

_what, _, _which = os.environ.get(FAULT_ENV, "").partition(":")


def _die() -> None:
    print(f"faulty_operator: dying after {_what}:{_which}", flush=True)
    os._exit(FAULT_EXIT)


def _patch_status(api: Any, job: Any, status: Any, **kwargs: Any) -> Any:
    written = _real_patch_status(api, job, status, **kwargs)
    if _what == "status" and status.get("phase") == _which:
        _die()
    return written


def _post_event(api: Any, job: Any, name: str, event: Any) -> bool:
    posted = _real_post_event(api, job, name, event)
    if _what == "event" and event.reason == _which:
        _die()
    return posted


_real_patch_status = handlers.patch_status
handlers.patch_status = _patch_status
_real_post_event = getattr(handlers, "post_event", None)
if _real_post_event is not None:
    handlers.post_event = _post_event
