"""Retry and timeout policy: reserved parameter names, stripped before a task sees them.

Reserved names start with ``$``, which no task parameter may use: ``$retries``
(extra attempts after a failure, default 0), ``$backoff`` (seconds before the
first retry, doubled each time, default 0) and ``$timeout`` (seconds a task
attempt may run before the lifecycle fails it, default none). They may stand
in an ``@task`` declaration (defaults) or at the invocation:
``fetch (- {url: "...", $retries: 3, $backoff: 0.5, $timeout: 30} -)``.

The compiler checks every parameter literal of a task, URI source or sink with
:func:`split_params`, so an unknown name (``$retrys``) or a bad value is an error
at the literal's line and column; the engine applies the policy at run time.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

from flowlang.errors import FlowPolicyError

__all__ = ["NO_POLICY", "RESERVED", "Policy", "split_params"]

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
    """(the parameters a task sees, its policy). Raises :class:`FlowPolicyError` (no
    position: the caller knows where the parameters come from) on a bad name or value."""
    if not isinstance(params, dict) or not any(key.startswith("$") for key in params):
        return params, NO_POLICY
    task_params = {k: v for k, v in params.items() if not k.startswith("$")}
    unknown = [k for k in params if k.startswith("$") and k not in RESERVED]
    if unknown:
        close = difflib.get_close_matches(unknown[0], RESERVED, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise FlowPolicyError(
            f"unknown reserved parameter {unknown[0]!r} "
            f"(expected one of {', '.join(RESERVED)}){hint}"
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
        raise FlowPolicyError(f"{name} must be a non-negative number, got {value!r}")
    return kind(value)
