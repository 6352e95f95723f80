"""Request and response shapes, for the OpenAPI document and for checking bodies.

JSON bodies are read by :func:`flowstream.api.context.json_body` (within the
limits) rather than by the framework, so each model's schema is attached to its
route by :func:`body_of`, and :func:`check` reports the first bad field in one
line (``body.input: ...``).
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from flowstream.api.problems import Problem

M = TypeVar("M", bound=BaseModel)

__all__ = [
    "Action",
    "ActionBody",
    "BulkBody",
    "CheckBody",
    "LimitBody",
    "ScheduleBody",
    "RequeueBody",
    "SessionBody",
    "StartBody",
    "body_of",
    "check",
]

Action = Literal["terminate", "pause", "resume", "restart", "delete"]


class StartBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flow: str = Field(description="the flow text")
    input: Any = Field(None, description="the workflow's input (any JSON)")
    id: str | None = Field(None, description="the workflow id (default: a new one); 409 if taken")
    # Strict: JSON true is not a priority of 1.
    priority: int = Field(
        0, strict=True, description="the workflow's priority, -9 to 9 (higher first)"
    )
    concurrency_key: str | None = Field(
        None, description="with max_running: at most that many runs of the key at once"
    )
    max_running: int | None = Field(None, strict=True, description="with concurrency_key")


class ScheduleBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="1 to 64 letters, digits, '.', '_', '-'")
    flow: str = Field(description="the flow text, compiled and stored now")
    cron: str | None = Field(None, description="5 fields, or 6 with seconds first")
    every: str | None = Field(None, description="an interval: 30s, 15m, 1h (give cron or every)")
    input: Any = Field(None, description="every run's input (any JSON)")
    overlap: Literal["skip", "allow", "cancel-previous"] = "skip"
    catch_up: Literal["none", "one", "all"] = "one"
    timezone: str = Field("UTC", description="an IANA time zone, for cron")
    priority: int = Field(0, strict=True, description="each run's priority, -9 to 9")
    concurrency_key: str | None = Field(None, description="with max_running")
    max_running: int | None = Field(None, strict=True, description="with concurrency_key")


class LimitBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = Field(strict=True, description="at most this many tasks of the kind at once")


class CheckBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flow: str = Field(description="the flow text")


class ActionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, description="why (terminate: kept as the workflow's error)")


class Filter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    state: str | list[str] | None = None
    flow: str | None = None
    schedule: str | None = None
    older_than: str | float | None = Field(
        None, description="created longer ago than this: seconds, or 30m, 12h, 7d"
    )


class BulkBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: Action
    filter: Filter = Field(default_factory=lambda: Filter.model_validate({}))
    reason: str | None = None


class RequeueBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stream: str | None = Field(
        None, description="the dead letter's source: a task kind or 'lifecycle'"
    )
    id: str = Field(description="the dead letter's entry id")


class SessionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    token: str


def body_of(model: type[BaseModel], required: bool = True) -> dict[str, Any]:
    """``openapi_extra`` that documents ``model`` as the route's JSON body."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    text = _inline(schema, defs)
    return {
        "requestBody": {
            "required": required,
            "content": {"application/json": {"schema": text}},
        }
    }


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            return _inline(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    return schema


def check(model: type[M], value: Any, required: bool = True) -> M:
    """``value`` (a decoded body) as ``model``; 400 naming the first bad field."""
    if value is None and not required:
        value = {}
    if value is None:
        raise Problem(400, "the body is empty: expected a JSON object")
    if not isinstance(value, dict):
        raise Problem(400, f"the body is {type(value).__name__}, expected a JSON object")
    try:
        return model.model_validate(value)
    except Exception as error:  # noqa: BLE001 - pydantic's ValidationError, shown in one line
        errors: list[Any] = getattr(error, "errors", list)()
        first = errors[0] if errors else {}
        where = ".".join(["body", *(str(part) for part in first.get("loc", ()))])
        raise Problem(400, f"{where}: {first.get('msg', error)}") from None


# Answers, for the OpenAPI document only (routes return the readers' data as is).
class Started(BaseModel):
    id: str


class Checked(BaseModel):
    ok: bool
    name: str | None
    nodes: int
    kinds: list[str]


class ListItem(BaseModel):
    id: str
    flow: str | None
    state: str
    created: str | None
    ended: str | None
    tasks_ended: int | None
    tasks_total: int | None


class Listing(BaseModel):
    items: list[ListItem]
    next: str | None


class NodeRow(BaseModel):
    key: str
    name: str | None
    kind: str
    state: str
    started: str | None
    ended: str | None
    attempt: int | None
    worker: str | None


class Workflow(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    flow: str | None
    state: str
    created: str | None
    ended: str | None
    input: Any
    output: Any
    error: str | None
    nodes: list[NodeRow]


class GraphNode(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    label: str
    kind: str
    state: str | None


class GraphEdge(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    from_: str = Field(alias="from")
    to: str
    label: str | None = None


class GraphAnswer(BaseModel):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class AppliedAnswer(BaseModel):
    id: str
    applied: bool
    event: str | None
    before: str | None
    state: str | None


def answer(model: type[BaseModel], status: int = 200) -> dict[int | str, dict[str, Any]]:
    """``responses=`` that documents ``model`` as the route's answer."""
    schema = model.model_json_schema(by_alias=True, ref_template="#/components/schemas/{model}")
    defs = schema.pop("$defs", {})
    return {status: {"content": {"application/json": {"schema": _inline(schema, defs)}}}}
