"""Retry and timeout policy: reserved parameter names, stripped before a task sees them.

Reserved names start with ``$``, which no task parameter may use: ``$retries``
(extra attempts after a failure, default 0), ``$backoff`` (seconds before the
first retry, doubled each time, default 0) and ``$timeout`` (seconds a task
attempt may run before the lifecycle fails it, default none). They may stand
in an ``@task`` declaration (defaults) or at the invocation:
``fetch (- {url: "...", $retries: 3, $backoff: 0.5, $timeout: 30} -)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lifecycle.errors import LifecycleError

__all__ = ["Policy", "split_params"]

RESERVED = ("$retries", "$backoff", "$timeout")


@dataclass(frozen=True, slots=True)
class Policy:
    retries: int = 0
    backoff: float = 0.0
    timeout: float | None = None

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (exponential from ``backoff``)."""
        return self.backoff * (2 ** (attempt - 1)) if self.backoff else 0.0


NO_POLICY = Policy()


def split_params(params: Any) -> tuple[Any, Policy]:
    """(the parameters a task sees, its policy). Raises LifecycleError on a bad value."""
    if not isinstance(params, dict) or not any(key.startswith("$") for key in params):
        return params, NO_POLICY
    task_params = {k: v for k, v in params.items() if not k.startswith("$")}
    unknown = [k for k in params if k.startswith("$") and k not in RESERVED]
    if unknown:
        raise LifecycleError(
            f"unknown reserved parameter {unknown[0]!r} (expected one of {', '.join(RESERVED)})"
        )
    return task_params, Policy(
        retries=_number(params, "$retries", int, 0),
        backoff=_number(params, "$backoff", float, 0.0),
        timeout=_number(params, "$timeout", float, None),
    )


def _number(params: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = params.get(name, default)
    if value is default:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise LifecycleError(f"{name} must be a non-negative number, got {value!r}")
    return kind(value)
