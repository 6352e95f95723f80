"""Redis weather: the errors that pass by themselves, named in one place.

A full server, a replica promoted late, a restart, a slow script or a broken
network all make Redis refuse commands for a while; none of them is a bug of
the caller, and the right answer is always the same: keep what is in hand,
wait (capped backoff), try again. :func:`classify` says which of these states
an error reports (or None: a real error, e.g. WRONGTYPE or NOPERM), and
:func:`describe` gives the one line a log or a CLI prints.

:class:`Forecast` is what a loop keeps: it logs once when a spell starts, once
when its kind changes, and once when Redis is back, never a traceback.
"""

from __future__ import annotations

import logging
from time import monotonic

import redis

from rqse.errors import RedisUnavailable

__all__ = [
    "AUTH",
    "BUSY",
    "DOWN",
    "LOADING",
    "MASTERDOWN",
    "MISCONF",
    "MOVED",
    "OUT_OF_MEMORY",
    "READONLY",
    "TIMEOUT",
    "TRYAGAIN",
    "Forecast",
    "classify",
    "describe",
    "is_weather",
]

# States (the values are what logs and messages say after "Redis ").
OUT_OF_MEMORY = "is out of memory"
READONLY = "is a read-only replica"
LOADING = "is loading its data"
MISCONF = "refuses writes: its last save to disk failed (MISCONF)"
BUSY = "is busy running a script"
TRYAGAIN = "asks to try again (failover or resharding in progress)"
MASTERDOWN = "is a replica cut off from its master"
MOVED = "moved the slot to another node (failover or resharding)"
DOWN = "is unreachable"
TIMEOUT = "did not answer in time"
AUTH = "refused the credentials"  # a rotated password: retried, as the others

# Reply codes, for errors redis-py leaves as a plain ResponseError (or an older
# redis-py that maps fewer codes to classes). redis-py strips the code from the
# message of the errors it maps, so classes are checked first.
_CODES = {
    "OOM": OUT_OF_MEMORY,
    "READONLY": READONLY,
    "LOADING": LOADING,
    "MISCONF": MISCONF,
    "BUSY": BUSY,
    "MASTERDOWN": MASTERDOWN,
    "TRYAGAIN": TRYAGAIN,
    "CLUSTERDOWN": TRYAGAIN,
    "NOREPLICAS": TRYAGAIN,
    "MOVED": MOVED,
    "ASK": MOVED,
}


_PIPELINE_SAID = " of pipeline caused error: "


def classify(error: BaseException, chain: bool = True) -> str | None:
    """The weather ``error`` reports (one of this module's states), or None.

    Looks through ``__cause__``/``__context__`` too (unless ``chain`` is False),
    so an rqse error raised ``from`` a redis-py error (or a handler's own
    exception raised while Redis refused its write) is classified by what Redis
    said.
    """
    if not chain:
        return _classify_one(error)
    seen = 0
    current: BaseException | None = error
    while current is not None and seen < 16:  # a chain is short; a cycle is not followed
        state = _classify_one(current)
        if state is not None:
            return state
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _classify_one(error: BaseException) -> str | None:
    if isinstance(error, redis.ResponseError):
        if isinstance(error, redis.exceptions.OutOfMemoryError):
            return OUT_OF_MEMORY
        if isinstance(error, redis.exceptions.ReadOnlyError):
            return READONLY
        if isinstance(error, redis.exceptions.MasterDownError):  # a ClusterDownError
            return MASTERDOWN
        if isinstance(error, (redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)):
            return TRYAGAIN
        if isinstance(error, redis.exceptions.AskError):  # MovedError too
            return MOVED
        if isinstance(error, redis.exceptions.ExecAbortError):
            # EXEC refused whole (memory ran out after its commands were queued):
            # "Transaction discarded because of: <the refusal>".
            _, _, refusal = str(error).partition("because of: ")
            return _CODES.get(refusal.split(" ", 1)[0])
        # redis-py words a pipeline's error "Command # 1 (<its arguments>) of pipeline
        # caused error: <the reply>" (the reply last: an argument cannot pose as it), and
        # its status_code is not always the reply's code.
        said = str(error).rpartition(_PIPELINE_SAID)[2] or str(error)
        code = said.split(" ", 1)[0]
        return _CODES.get(code) or _CODES.get(getattr(error, "status_code", None) or "")
    if isinstance(error, redis.exceptions.BusyLoadingError):
        return LOADING
    if isinstance(error, (redis.AuthenticationError, redis.exceptions.AuthorizationError)):
        return AUTH
    if isinstance(error, redis.TimeoutError):
        return TIMEOUT
    if isinstance(error, redis.ConnectionError):
        return DOWN
    if isinstance(error, RedisUnavailable):
        # rqse's wrapper: what Redis said, when it said something, else unreachable.
        cause = error.__cause__
        return (_classify_one(cause) if cause is not None else None) or DOWN
    return None


def is_weather(error: BaseException) -> bool:
    """True when ``error`` (or what caused it) is a passing Redis condition."""
    return classify(error) is not None


def describe(error: BaseException) -> str:
    """One line for ``error``: ``"Redis is out of memory"`` for weather, with the
    server's own words when they add something; the error text otherwise."""
    state = classify(error)
    if state is None:
        return f"{type(error).__name__}: {error}"
    detail = _detail(error)
    return f"Redis {state} ({detail})" if detail else f"Redis {state}"


def _detail(error: BaseException) -> str:
    """The innermost redis-py message of the chain (the server's or the socket's words)."""
    current: BaseException | None = error
    detail = str(error)
    seen = 0
    while current is not None and seen < 16:
        if isinstance(current, redis.RedisError) and str(current):
            detail = str(current)
        current = current.__cause__ or current.__context__
        seen += 1
    # The server's first sentence says it (MISCONF's message runs to five).
    first = detail.strip().split(". ", 1)[0].rstrip(".")
    return first if len(first) <= 120 else first[:117] + "..."


class Forecast:
    """Logs a loop's Redis weather once per change, never per retry.

    ``storm(error)`` when a step failed with weather (returns the state),
    ``clear()`` when a step succeeded. ``who`` starts every line (the consumer).
    """

    def __init__(self, who: str, logger: logging.Logger) -> None:
        self._who = who
        self._logger = logger
        self.state: str | None = None
        self._since = 0.0
        self.retries = 0

    def storm(self, error: BaseException, where: str, delay: float) -> str | None:
        """A step failed with ``error`` at ``where`` and the next try is in ``delay``
        seconds: a warning if the weather changed, a debug line if not. Returns the
        state (None, and nothing logged, when ``error`` is not weather)."""
        state = classify(error)
        if state is None:
            return None
        self.retries += 1
        if state != self.state:
            if self.state is None:
                self._since = monotonic()
            self.state = state
            self._logger.warning(
                "%s: %s at %s; retrying in %.2fs, backing off",
                self._who,
                describe(error),
                where,
                delay,
            )
        else:
            self._logger.debug("%s: %s; retry in %.2fs", self._who, describe(error), delay)
        return state

    def clear(self) -> None:
        """A step succeeded: one line if a spell just ended."""
        if self.state is None:
            return
        self._logger.info(
            "%s: Redis is back after %.1fs and %d retries (last: Redis %s)",
            self._who,
            monotonic() - self._since,
            self.retries,
            self.state,
        )
        self.state = None
        self.retries = 0

    @property
    def stormy(self) -> bool:
        return self.state is not None
