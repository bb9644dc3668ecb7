"""A BertPretrainJob's status as pure functions: where each observation moves the job.

The handlers read the job and its children, call these functions, and write back only the status
fields that changed (:func:`status_patch`), never ``progress``, which belongs to the trainer.
An Event is recorded in the status (:func:`record`), in the same patch as the change it reports,
and posted from there, so that it follows from the state even when the operator dies in between.

Phases: ``Pending`` (children created, nothing running yet), ``Preparing`` (the data Job runs),
``Running``, ``Suspended`` (exactly while ``spec.runPolicy.suspend`` is true), ``Succeeded`` and
``Failed``. The last two are final, except that a job failed for an invalid spec is rendered again
when the user fixes the spec.

Beside them, the kstatus conditions that GitOps tools read (``Ready``, ``Reconciling``,
``Stalled``) are derived from the rest of the status by one function, :func:`with_kstatus`, on
every status write, so that they can never disagree with the phase.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, get_args

import pydantic

from bertjob_api.contract import EXIT_MEANINGS, PROGRESS_FIELD, RESULTS_FIELD
from bertjob_api.crd import ChildRef, Condition, ConditionType, JobStatus, PendingEvent, Phase

TERMINAL_PHASES = ("Succeeded", "Failed")
# Kubeflow's JobCondition types (PyTorchJob and MPIJob alike) that are copied into the job's own.
MIRRORED = ("Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
# Kubernetes caps an Event's message at 1 KiB; a condition's message is kept as short.
MESSAGE_LIMIT = 1024
# Status fields that the trainer writes (bertjob_api.contract), which the operator leaves alone.
FOREIGN_FIELDS = (PROGRESS_FIELD, RESULTS_FIELD)
# Kubernetes caps an object's name at 253 characters (a DNS subdomain).
NAME_LIMIT = 253

PrepareOutcome = Literal["Complete", "Failed"]


@dataclass(frozen=True)
class Transition:
    """An Event about the job (a phase change, a failure, a refused spec change): ``type`` is
    ``Normal`` or ``Warning``, ``reason`` CamelCase."""

    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def now() -> datetime:
    """The current time in UTC, in whole seconds as Kubernetes timestamps have them."""
    return datetime.now(UTC).replace(microsecond=0)


def of(obj: Mapping[str, Any]) -> JobStatus:
    """The status of a BertPretrainJob as read from the API server (:func:`read`, without the
    names of the fields it could not read)."""
    return read(obj)[0]


def read(obj: Mapping[str, Any]) -> tuple[JobStatus, tuple[str, ...]]:
    """The status of a BertPretrainJob as read from the API server, and the fields of it that
    were of the wrong shape (``("status",)`` when the status is not an object at all).

    Every handler and filter reads the status through here, so a status this operator did not
    write (hand-edited, of an older shape, or malformed: the API server keeps what it is sent when
    the CRD's schema is not enforced) never raises: a status that is not an object reads as empty,
    and each field of the wrong shape (a phase not among the phases, conditions that are not a
    list of conditions, pendingEvents that is not a map of Events, ...) reads as absent, the others
    as they are. The handlers remove those fields before their next status write."""
    raw = obj.get("status")
    if raw is None:
        return JobStatus(), ()
    if not isinstance(raw, Mapping):
        return JobStatus(), ("status",)
    fields = dict(raw)
    junk: set[str] = set()
    # Each round drops the top-level fields that failed; the rest validate on their own.
    for _ in range(len(fields) + 1):
        try:
            return JobStatus.model_validate(fields), tuple(sorted(junk))
        except pydantic.ValidationError as error:
            failed = {str(item["loc"][0]) for item in error.errors() if item["loc"]} & fields.keys()
            if not failed:
                break
            junk |= failed
            fields = {key: value for key, value in fields.items() if key not in failed}
    return JobStatus(), tuple(sorted(junk | set(fields)))


def dump(status: JobStatus) -> dict[str, Any]:
    """``status`` as the JSON the API server holds (camelCase, unset fields left out)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True)


def status_patch(old: JobStatus, new: JobStatus, junk: Collection[str] = ()) -> dict[str, Any]:
    """The JSON merge patch of ``status`` that takes ``old`` to ``new``: only top-level fields
    that differ (``None`` deletes one), and never those that the trainer writes. A field that is a
    map (``pendingEvents``) is patched key by key, so that two writers adding keys keep both.

    ``junk`` names the fields that :func:`read` found of the wrong shape (and read as absent): each
    is given whole, as ``new`` has it, or deleted (the trainer's too: it writes them again);
    ``"status"`` among them (the status was not an object) gives every field of ``new`` whole. A
    merge patch replaces what is not an object (RFC 7386), so the patch writes a well-formed
    status over them."""
    before, after = dump(old), dump(new)
    if "status" in junk:
        return after
    patch = {
        key: _diff(before.get(key), after.get(key))
        for key in sorted(before.keys() | after.keys())
        if key not in FOREIGN_FIELDS and before.get(key) != after.get(key)
    }
    return patch | {key: after.get(key) for key in sorted(junk)}


def _diff(before: object, after: object) -> object:
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return after
    keys = sorted(before.keys() | after.keys())
    return {key: after.get(key) for key in keys if before.get(key) != after.get(key)}


def short(message: str) -> str:
    """``message`` cut to what an Event or a condition may hold."""
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def with_condition(status: JobStatus, condition: Condition) -> JobStatus:
    """``status`` with ``condition`` replacing any earlier one of its type. An unchanged condition
    keeps its ``lastTransitionTime``, as Kubernetes conditions do."""
    for existing in status.conditions:
        if existing.type == condition.type and (existing.status, existing.reason, existing.message) == (
            condition.status,
            condition.reason,
            condition.message,
        ):
            return status
    kept = [existing for existing in status.conditions if existing.type != condition.type]
    return status.model_copy(update={"conditions": [*kept, condition]})


def condition(
    type_: ConditionType, reason: str, message: str, at: datetime, status: bool = True
) -> Condition:
    """A condition of ``type_`` that became ``status`` at ``at``."""
    return Condition(
        type=type_,
        status="True" if status else "False",
        reason=reason,
        message=short(message),
        last_transition_time=at,
    )


def moved(status: JobStatus, phase: Phase, at: datetime) -> JobStatus:
    """``status`` in ``phase``; a final phase records its completion time."""
    completion = at if phase in TERMINAL_PHASES and status.phase not in TERMINAL_PHASES else None
    return status.model_copy(update={"phase": phase, "completion_time": completion or status.completion_time})


def failed(
    status: JobStatus, reason: str, message: str, at: datetime, generation: int | None = None
) -> JobStatus:
    """``status`` Failed for ``reason`` (e.g. InvalidSpec, with the fields named in ``message``);
    ``generation``, if given, is the spec generation that failed (``observedGeneration``), so that
    a fixed spec reads as not yet reconciled rather than as failed until it is rendered again."""
    updated = moved(with_condition(status, condition("Failed", reason, message, at)), "Failed", at)
    if generation is None:
        return updated
    return updated.model_copy(update={"observed_generation": generation})


def launched(
    status: JobStatus,
    *,
    children: Sequence[ChildRef],
    config_map: str | None,
    preparing: bool,
    suspended: bool,
    generation: int | None,
    at: datetime,
) -> JobStatus:
    """``status`` once the job's children (all of them, or all but the training child while the
    data Job runs first) exist. Clears what a failed render of an earlier generation left."""
    names = ", ".join(f"{child.kind} {child.name}" for child in children)
    kept = [c for c in status.conditions if c.type not in ("Failed", "SpecChangeRefused")]
    fresh = status.model_copy(update={"conditions": kept, "completion_time": None, "phase": None})
    fresh = with_condition(fresh, condition("Created", "ChildrenCreated", f"Created {names}", at))
    if preparing:
        fresh = with_condition(fresh, condition("Preparing", "PrepareJobCreated", "Preparing the data", at))
    phase: Phase = "Suspended" if suspended else ("Preparing" if preparing else "Pending")
    return moved(fresh, phase, at).model_copy(
        update={
            "children": list(children),
            "config_map": config_map,
            "start_time": status.start_time or at,
            "observed_generation": generation,
        }
    )


def prepare_outcome(job_status: Mapping[str, Any]) -> tuple[PrepareOutcome, str, str] | None:
    """A batch/v1 Job's final outcome from its conditions, as ``(outcome, reason, message)``;
    None while it runs."""
    for item in job_status.get("conditions") or []:
        if (
            isinstance(item, Mapping)
            and item.get("status") == "True"
            and item.get("type") in get_args(PrepareOutcome)
        ):
            return item["type"], str(item.get("reason") or item["type"]), str(item.get("message") or "")
    return None


def prepared(
    status: JobStatus, training_child: ChildRef, reason: str, message: str, suspended: bool, at: datetime
) -> JobStatus:
    """``status`` once the data Job completed and the training child was created."""
    updated = with_condition(
        status, condition("Preparing", "PrepareJobCompleted", "Data prepared", at, False)
    )
    updated = with_condition(updated, condition("Prepared", reason, message or "The data Job completed", at))
    children = [child for child in updated.children if child != training_child]
    updated = updated.model_copy(update={"children": [*children, training_child]})
    if updated.phase in TERMINAL_PHASES:
        return updated
    return moved(updated, "Suspended" if suspended else "Pending", at)


def child_conditions(child_status: Mapping[str, Any], at: datetime) -> list[Condition]:
    """A Kubeflow training job's conditions of the mirrored types, as the job's own; a missing or
    malformed ``lastTransitionTime`` reads as ``at``."""
    found = []
    for item in child_status.get("conditions") or []:
        if not isinstance(item, Mapping) or item.get("type") not in MIRRORED:
            continue
        truth = item.get("status")
        try:
            since = pydantic.TypeAdapter(datetime).validate_python(item.get("lastTransitionTime"))
        except pydantic.ValidationError:
            since = at
        found.append(
            Condition(
                type=item["type"],
                status=truth if truth in ("True", "False") else "Unknown",
                reason=str(item.get("reason") or item["type"]),
                message=short(str(item.get("message") or "")),
                last_transition_time=since,
            )
        )
    return found


def has_child_conditions(child_status: Mapping[str, Any]) -> bool:
    """Whether :func:`child_conditions` finds any condition in ``child_status``, without building
    them (a filter run on kopf's event loop for every event of every training job)."""
    return _has_types(child_status, MIRRORED)


def _has_types(child_status: Mapping[str, Any], types: Collection[str]) -> bool:
    """Whether ``child_status`` lists a condition of one of ``types``."""
    return any(
        isinstance(item, Mapping) and item.get("type") in types
        for item in child_status.get("conditions") or []
    )


# Kubeflow Trainer v2's TrainJob condition types (kubeflow/trainer pkg/apis/trainer/v1alpha1/
# trainjob_types.go; Created in the releases before v2.3.0), as the job's own condition types.
TRAINJOB_CONDITIONS: dict[str, ConditionType] = {
    "Created": "Created",
    "Complete": "Succeeded",
    "Failed": "Failed",
    "Suspended": "Suspended",
}


def trainjob_conditions(child_status: Mapping[str, Any], at: datetime) -> list[Condition]:
    """A TrainJob's status as the job's conditions: its conditions by :data:`TRAINJOB_CONDITIONS`
    (Complete becomes Succeeded), and Running, which a TrainJob does not report: True while one of
    its child Jobs (``status.jobsStatus``) has all its pods ready and the TrainJob has not ended,
    False once the Jobs are listed and none is, or it ended. A missing time reads as ``at``."""
    items = child_status.get("conditions")
    renamed = [
        {**item, "type": TRAINJOB_CONDITIONS[item["type"]]}
        for item in (items if isinstance(items, list) else [])
        if isinstance(item, Mapping) and item.get("type") in TRAINJOB_CONDITIONS
    ]
    found = child_conditions({"conditions": renamed}, at)
    jobs = [item for item in child_status.get("jobsStatus") or [] if isinstance(item, Mapping)]
    if not jobs:
        return found
    ended = any(item.type in TERMINAL_PHASES and item.status == "True" for item in found)
    ready = sorted(str(item.get("name")) for item in jobs if _count(item.get("ready")) > 0)
    if ready and not ended:
        running = condition("Running", "JobsReady", f"ready: {', '.join(ready)}", at)
    else:
        why = "TrainJobFinished" if ended else "NoJobReady"
        running = condition("Running", why, "no child Job has all its pods ready", at, status=False)
    return [*found, running]


def has_trainjob_conditions(child_status: Mapping[str, Any]) -> bool:
    """Whether :func:`trainjob_conditions` finds anything in ``child_status``."""
    return bool(child_status.get("jobsStatus")) or _has_types(child_status, TRAINJOB_CONDITIONS)


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_failure(pods: Iterable[Mapping[str, Any]]) -> str | None:
    """Which of a job's ``pods`` (as the API server lists them) failed first and with what exit
    code, for the job's Failed condition: ``pod NAME exited with code N: meaning``; None when
    none of them failed with a non-zero code (the controller failed the job for another reason,
    such as a deadline, or its failed pods are gone)."""
    ended = []
    for pod in pods:
        status = pod.get("status") or {}
        if status.get("phase") != "Failed":
            continue
        for container in status.get("containerStatuses") or []:
            terminated = (container.get("state") or {}).get("terminated") or {}
            code = terminated.get("exitCode")
            if isinstance(code, int) and code != 0:
                ended.append((str(terminated.get("finishedAt") or ""), str(pod["metadata"]["name"]), code))
    if not ended:
        return None
    _, name, code = min(ended)
    meaning = EXIT_MEANINGS.get(code)
    return f"pod {name} exited with code {code}" + (f": {meaning}" if meaning else "")


def with_pod_failure(conditions: Sequence[Condition], failure: str | None) -> list[Condition]:
    """``conditions`` with ``failure`` (:func:`pod_failure`) added to the message of a True Failed
    one."""
    if failure is None:
        return list(conditions)
    return [
        item.model_copy(update={"message": short(f"{item.message.rstrip('.')}: {failure}")})
        if item.type == "Failed" and item.status == "True"
        else item
        for item in conditions
    ]


def child_phase(conditions: Sequence[Condition]) -> Phase | None:
    """The phase a training child's conditions put the job in: an outcome wins over Running
    (Restarting counts as Running), Running over Created; None before Kubeflow has written any."""
    true = {item.type for item in conditions if item.status == "True"}
    for types, phase in (
        (("Succeeded",), "Succeeded"),
        (("Failed",), "Failed"),
        (("Running", "Restarting"), "Running"),
        (("Created",), "Pending"),
    ):
        if true.intersection(types):
            return phase  # type: ignore[return-value]
    return None


def follow_child(
    status: JobStatus, conditions: Sequence[Condition], suspended: bool, at: datetime
) -> JobStatus:
    """``status`` after the training child reported ``conditions``. The phase is the child's,
    except that a suspended job stays Suspended until it ends, a queued one Pending until Kueue
    admits it, and a running one whose child Kueue suspends (preemption) becomes Suspended; a
    finished job no longer moves."""
    if status.phase in TERMINAL_PHASES:
        return status
    updated = status
    for item in conditions:
        updated = with_condition(updated, item)
    # training-operator removes Restarting once Running is True again, rather than turning it
    # False: when the child no longer reports it, the restart is over. (The other mirrored types
    # it turns False; Suspended may be the operator's own, from the spec.)
    reported = {item.type for item in conditions}
    for gone in [c for c in updated.conditions if c.type == "Restarting" and c.type not in reported]:
        if gone.status == "True":
            updated = with_condition(
                updated,
                condition(gone.type, gone.reason, "no longer reported by the training job", at, False),
            )
    phase = child_phase(conditions)
    if phase in TERMINAL_PHASES or (phase is not None and not suspended):
        return moved(updated, phase, at)
    if (
        suspended
        and status.phase == "Running"
        and any(item.type == "Suspended" and item.status == "True" for item in conditions)
    ):
        # Suspended under a running job without the job's own say: Kueue preempted it (its pods
        # are gone). Readmitted, the child runs again and so does the job.
        return moved(updated, "Suspended", at)
    return updated


def suspension(status: JobStatus, suspended: bool, has_training_child: bool, at: datetime) -> JobStatus:
    """``status`` after ``spec.runPolicy.suspend`` changed to ``suspended``. Resuming goes back to
    Preparing while the data Job has not finished, else to Pending until the child runs again."""
    if status.phase in TERMINAL_PHASES:
        return status
    if suspended:
        updated = with_condition(
            status, condition("Suspended", "SuspendedByUser", "spec.runPolicy.suspend", at)
        )
        return moved(updated, "Suspended", at)
    updated = with_condition(
        status, condition("Suspended", "ResumedByUser", "spec.runPolicy.suspend", at, status=False)
    )
    return moved(updated, "Pending" if has_training_child else "Preparing", at)


def spec_change(
    status: JobStatus, refused: Sequence[str], why: str, generation: int | None, at: datetime
) -> JobStatus:
    """``status`` after a spec change: ``refused`` names the fields that were not applied (``why``
    says why), and SpecChangeRefused turns False once a change is applied whole."""
    if refused:
        message = f"{why}: {', '.join(refused)}"
        updated = with_condition(status, condition("SpecChangeRefused", "UnsafeChange", message, at))
    elif any(item.type == "SpecChangeRefused" for item in status.conditions):
        updated = with_condition(
            status,
            condition("SpecChangeRefused", "ChangeApplied", "the latest spec change was applied", at, False),
        )
    else:
        updated = status
    return updated.model_copy(update={"observed_generation": generation})


# kstatus' standard condition types (sigs.k8s.io/cli-utils, pkg/kstatus/README.md): Reconciling and
# Stalled have abnormal-true polarity, present only while True; Ready is Flux's and most
# controllers' summary, always present.
KSTATUS_TYPES = ("Ready", "Reconciling", "Stalled")
# Phases in which the job is still on its way to training: children made, data prepared, pods
# scheduled; what GitOps tools wait for.
ON_ITS_WAY: dict[str, str] = {
    "Pending": "the children exist; waiting for the training job to run",
    "Preparing": "the data Job prepares the data; the training job follows",
}
# Phases in which the job is what its spec asks for.
READY: dict[str, str] = {
    "Running": "training runs",
    "Succeeded": "training finished",
}


@dataclass(frozen=True)
class KStatus:
    """The kstatus verdict on a job: ``ready`` (its status True/False, reason, message), and the
    reason and message of ``reconciling`` and ``stalled``, None where the condition is absent."""

    ready: tuple[bool, str, str]
    reconciling: tuple[str, str] | None = None
    stalled: tuple[str, str] | None = None


def kstatus(status: JobStatus, generation: int | None) -> KStatus:
    """What kstatus conditions ``status`` calls for, for a job whose ``metadata.generation`` is
    ``generation`` (docs/operator.md, "Status for GitOps tools", has the table), in this order:

    1. no phase yet, or ``observedGeneration`` behind ``generation``: Reconciling (the operator
       has not created the children, or not yet applied or refused the latest spec change);
    2. Failed: Stalled, with the failure's reason and message (final; an InvalidSpec job is
       rendered again when its spec changes, which step 1 reports meanwhile);
    3. SpecChangeRefused True: Stalled (reason SpecChangeRefused): the job runs, or ended, with a
       spec other than the one asked for, and will not take this one;
    4. Pending or Preparing: Reconciling; Running or Succeeded: Ready; Suspended: none of them
       (a state the user asked for, reached), Ready False.
    """
    observed = status.observed_generation
    if status.phase is None:
        why = "the operator has not created the job's children yet"
        return KStatus((False, "Launching", why), reconciling=("Launching", why))
    if generation is not None and observed is not None and observed < generation:
        why = f"spec generation {generation} is not yet applied (observed {observed})"
        return KStatus((False, "NewGeneration", why), reconciling=("NewGeneration", why))
    if status.phase == "Failed":
        cause = _true(status, "Failed")
        reason = cause.reason if cause else "Failed"
        message = cause.message if cause and cause.message else "the job failed"
        return KStatus((False, reason, message), stalled=(reason, message))
    refused = _true(status, "SpecChangeRefused")
    if refused is not None:
        message = refused.message or "a spec change was refused"
        return KStatus((False, "SpecChangeRefused", message), stalled=("SpecChangeRefused", message))
    if status.phase in ON_ITS_WAY:
        why = ON_ITS_WAY[status.phase]
        return KStatus((False, status.phase, why), reconciling=(status.phase, why))
    if status.phase in READY:
        return KStatus((True, status.phase, READY[status.phase]))
    return KStatus((False, status.phase, "spec.runPolicy.suspend is true"))


def with_kstatus(status: JobStatus, generation: int | None, at: datetime) -> JobStatus:
    """``status`` with its kstatus conditions (``Ready``, and ``Reconciling`` and ``Stalled``
    while True, absent otherwise) as :func:`kstatus` derives them from the rest of it; a condition
    that does not change keeps its ``lastTransitionTime``. Every status write passes here
    (:func:`bertjob.handlers._write`), so they describe the status they are written with."""
    verdict = kstatus(status, generation)
    truth, reason, message = verdict.ready
    updated = with_condition(status, condition("Ready", reason, message, at, truth))
    abnormal: tuple[tuple[ConditionType, tuple[str, str] | None], ...] = (
        ("Reconciling", verdict.reconciling),
        ("Stalled", verdict.stalled),
    )
    for type_, found in abnormal:
        if found is None:
            updated = without_condition(updated, type_)
        else:
            updated = with_condition(updated, condition(type_, found[0], found[1], at))
    return updated


def without_condition(status: JobStatus, type_: ConditionType) -> JobStatus:
    """``status`` without a condition of ``type_``."""
    if not any(item.type == type_ for item in status.conditions):
        return status
    kept = [item for item in status.conditions if item.type != type_]
    return status.model_copy(update={"conditions": kept})


def _true(status: JobStatus, type_: ConditionType) -> Condition | None:
    return next((item for item in status.conditions if item.type == type_ and item.status == "True"), None)


def event_name(job_name: str, stamp_ns: int) -> str:
    """The name an Event about the job is posted under: the job's name and ``stamp_ns``
    (nanoseconds since the epoch, in hex), as Kubernetes names its own Events, cut to fit a name."""
    suffix = f".{stamp_ns:x}"
    return job_name[: NAME_LIMIT - len(suffix)].rstrip("-.") + suffix


def record(status: JobStatus, events: Mapping[str, Transition], at: datetime) -> JobStatus:
    """``status`` with ``events`` (by the names they are to be posted under) waiting to be posted."""
    pending = dict(status.pending_events)
    for name, event in events.items():
        pending[name] = PendingEvent(type=event.type, reason=event.reason, message=event.message, time=at)
    return status.model_copy(update={"pending_events": pending})


def transition(old: JobStatus, new: JobStatus) -> Transition | None:
    """The Event for a phase change from ``old`` to ``new`` (None if the phase did not change): a
    warning named after the failure's reason for Failed, else one named after the new phase."""
    if new.phase is None or new.phase == old.phase:
        return None
    cause = next((item for item in new.conditions if item.type == new.phase and item.status == "True"), None)
    message = f"{old.phase or 'New'} -> {new.phase}" + (
        f": {cause.message}" if cause and cause.message else ""
    )
    if new.phase == "Failed":
        return Transition("Warning", cause.reason if cause else "Failed", short(message))
    return Transition("Normal", new.phase, short(message))
