"""The one error hierarchy of rqse."""


class RqseError(Exception):
    """Base of every error rqse raises on purpose."""


class ConfigurationError(RqseError):
    """Raised when connection settings or listener options are invalid.

    The message names the offending value and what was expected, e.g. an
    unsupported URL scheme or a block time longer than the socket timeout.
    """


class RedisUnavailable(RqseError):
    """Raised when Redis cannot serve a command for now: unreachable (refused, reset,
    timed out), or refusing it until something passes (out of memory, read-only
    replica, loading, MISCONF, busy script). :func:`rqse.weather.describe` names which;
    a listener waits and retries these, never counting them against an entry."""


class BatchWeather(RedisUnavailable):
    """Raised by a handler when the batch's bookkeeping, not the entry's own work (a
    task kind's slots, say), met Redis weather, on whichever server: the listener then
    gives the entries' deliveries back as it does for weather of its own Redis,
    without asking its own Redis first. Raise it ``from`` the error met."""


class RedisCommandError(RqseError):
    """Raised when Redis rejects a command (wrong type, missing permission, ...)."""


class EventEncodingError(RqseError):
    """Raised when an event cannot be written in the wire format.

    An event must be a mapping with string field names whose values orjson can
    serialise; the message names the field that failed.
    """


class MalformedEntry(RqseError):
    """Raised when a stream entry does not follow the wire format.

    ``reason`` is one of the dead-letter reason codes of :mod:`rqse.deadletter`
    (``invalid-json``, ``invalid-kind``, ``oversize``); ``entry_id`` and
    ``field`` locate the problem when known.
    """

    def __init__(
        self, reason: str, detail: str, entry_id: str | None = None, field: str | None = None
    ) -> None:
        where = f"entry {entry_id}: " if entry_id else ""
        super().__init__(f"{where}{detail}")
        self.reason = reason
        self.detail = detail
        self.entry_id = entry_id
        self.field = field


class ReceiptNotArchived(RqseError):
    """Raised when a receipt logger reports that it did not archive a receipt."""
