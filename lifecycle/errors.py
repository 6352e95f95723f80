"""The one error hierarchy of the lifecycle package."""


class LifecycleError(Exception):
    """Base of every error the lifecycle raises on purpose."""


class BadEvent(LifecycleError):
    """Raised when an event lacks a field or has one of the wrong type.

    The message names the event id and the field, e.g.
    ``event 1700000000000-0 (end-task): field 'workflow' is missing``.
    """


class UnknownWorkflow(LifecycleError):
    """Raised when a workflow id has no record in Redis."""


class NotAllowed(LifecycleError):
    """Raised when a workflow's state does not allow what was asked (pausing a finished
    workflow, restarting a running one): the command exits 1."""


class FlowNotStored(LifecycleError):
    """Raised when a workflow names a compiled graph that is not in Redis."""


def unknown_workflow(workflow_id: str, replay: str | None = None) -> UnknownWorkflow:
    """The error for an id with no record in Redis, saying where its history may still
    be: the one wording of every command (inspect, history, the controls). ``replay``:
    the command that shows it from the archive (lifecycle.inspect.replay_command names
    the recorded one)."""
    replay = replay or f"python -m lifecycle replay ARCHIVE --workflow {workflow_id} --offline"
    return UnknownWorkflow(
        f"no workflow {workflow_id!r} in Redis (never started, deleted, or removed by "
        f"retention; an archive keeps its history: {replay})"
    )
