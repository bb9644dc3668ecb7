"""The strict model every spec object derives from, the field types they share, and SpecError.

Each object of the API is a pydantic model in strict mode (:class:`_Spec`): a YAML ``"2"`` is not an
integer, a misspelt field is an error, and no string or integer gets through that the API server
could not hold. The annotated types here (quantities, int32 and int64, object names, label values,
Kubernetes objects passed through whole) carry their checks and their CRD schema with them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    field_validator,
)
from pydantic.alias_generators import to_camel

from bertjob_api import kubenames

# A Kubernetes object passed through to the pods as written (a toleration, an affinity, an env
# var, a volume source): the CRD keeps it whole, and bertjob_api.passthrough checks it against
# Kubernetes' own schema of its type before anything is created.
KubernetesObject = Annotated[
    dict[str, Any], WithJsonSchema({"type": "object", "x-kubernetes-preserve-unknown-fields": True})
]
# A resource quantity ("500m", "64Gi", 8 or 0.5) as Kubernetes takes it in a pod; a float becomes
# its decimal string, since the Kubeflow CRDs take an integer or a string only. The CRD leaves the
# type open, as int-or-string would refuse 0.5 at `kubectl apply`.
Quantity = Annotated[
    int | str,
    PlainValidator(kubenames.quantity),
    WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True}),
]
# Integers as the API server and the Kubeflow types hold them: int32 where a child's field is one
# (replicas, runPolicy, elasticPolicy), int64 everywhere else.
Int32 = Annotated[int, Field(le=kubenames.INT32_MAX, json_schema_extra={"format": "int32"})]


def _rule(check: Callable[[Any], str | None]) -> AfterValidator:
    """A validator that refuses a value ``check`` finds a problem with, saying what it is."""

    def validate(value: Any) -> Any:
        problem = check(value)
        if problem is not None:
            raise ValueError(problem)
        return value

    return AfterValidator(validate)


# Every integer field is checked against int64's range by _Spec (a constraint here would go into
# the CRD as a maximum on every integer).
Int64 = Annotated[int, Field(json_schema_extra={"format": "int64"})]
# Names of other objects: a ServiceAccount, Secret, PriorityClass, scheduler or Volcano queue.
DnsSubdomain = Annotated[
    str,
    _rule(kubenames.dns_subdomain_problem),
    Field(
        json_schema_extra={"pattern": kubenames.DNS_SUBDOMAIN_PATTERN, "maxLength": kubenames.MAX_SUBDOMAIN}
    ),
]
LabelValue = Annotated[
    str,
    _rule(kubenames.label_value_problem),
    Field(json_schema_extra={"pattern": kubenames.LABEL_VALUE_PATTERN, "maxLength": kubenames.MAX_LABEL}),
]


# A list of 100,000 wrong items is one mistake: its first problems say what it is.
MAX_PROBLEMS_SHOWN = 20


class SpecError(ValueError):
    """A job file or custom resource that does not fit the API.

    ``problems`` holds one ``(field path, message)`` pair per problem, the path in the YAML
    spelling (``spec.phases[0].maxSeqLength``) so that the user can find the line; the message
    shows the first :data:`MAX_PROBLEMS_SHOWN` of them.
    """

    def __init__(self, source: str, problems: list[tuple[str, str]]):
        self.source = source
        self.problems = problems
        lines = [f"  {path}: {message}" for path, message in problems[:MAX_PROBLEMS_SHOWN]]
        if len(problems) > MAX_PROBLEMS_SHOWN:
            lines.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN} more")
        super().__init__(f"{source}: invalid BertPretrainJob\n" + "\n".join(lines))


class _Spec(BaseModel):
    # strict: a YAML "2" is not the integer 2; extra="forbid": a misspelt field is an error,
    # as the API server's strict field validation makes it for `kubectl apply`; no NaN or
    # infinity, which JSON (and so the API server) cannot carry.
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        frozen=True,
        allow_inf_nan=False,
    )

    @field_validator("*", mode="after")
    @classmethod
    def _values_the_api_holds(cls, value: Any) -> Any:
        """Strings (and those of a list or map of them) that a path, an argument, YAML and the API
        server can hold (:func:`bertjob_api.kubenames.string_problem`), and integers that fit in 64 bits."""
        items = [value]
        if isinstance(value, list):
            items = value
        elif isinstance(value, dict):
            items = [*value, *value.values()]
        for item in items:
            problem = kubenames.string_problem(item) if isinstance(item, str) else None
            if problem is not None:
                raise ValueError(f"{kubenames.shown(item)} {problem}")
        if isinstance(value, int) and value > kubenames.INT64_MAX:
            raise ValueError(f"must be at most {kubenames.INT64_MAX} (a 64-bit integer)")
        return value
