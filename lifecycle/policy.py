"""Retry and timeout policy, as the lifecycle applies it.

The rule lives in :mod:`flowlang.policy` (the compiler checks it with line and
column); here :func:`split_params` raises :class:`LifecycleError` for a graph
stored by other means, as it always has.
"""

from __future__ import annotations

from typing import Any

from flowlang.errors import FlowPolicyError
from flowlang.policy import NO_POLICY, RESERVED, Policy
from flowlang.policy import split_params as _split_params
from lifecycle.errors import LifecycleError

__all__ = ["NO_POLICY", "RESERVED", "Policy", "split_params"]


def split_params(params: Any) -> tuple[Any, Policy]:
    """(the parameters a task sees, its policy). Raises LifecycleError on a bad value."""
    try:
        return _split_params(params)
    except FlowPolicyError as error:
        raise LifecycleError(error.message) from None
