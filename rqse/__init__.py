"""rqse: events on Redis Streams (client, listeners, receipts).

The public API keeps the shape of rqse 0.5::

    from rqse import EventClient, EventListener, ReceiptListener, message, receipt_for

Wire format, delivery guarantees and trimming: ``docs/events.md``.
"""

from rqse.backoff import Backoff
from rqse.batch import ListenerStats
from rqse.client import EventClient
from rqse.cluster import Connections
from rqse.connection import RedisSettings, mask_url, resolve_url
from rqse.durability import server_warnings
from rqse.errors import (
    BatchWeather,
    ConfigurationError,
    EventEncodingError,
    MalformedEntry,
    ReceiptNotArchived,
    RedisCommandError,
    RedisUnavailable,
    RqseError,
)
from rqse.events import message, receipt_for
from rqse.keys import RECEIPT_GROUP, dead_letter_key
from rqse.listener import EventListener
from rqse.receipts import JsonLinesArchive, ReceiptListener
from rqse.trim import TrimResult, trim_acknowledged
from rqse.weather import describe, is_weather

__all__ = [
    "RECEIPT_GROUP",
    "ReceiptNotArchived",
    "Backoff",
    "BatchWeather",
    "ConfigurationError",
    "Connections",
    "EventClient",
    "EventEncodingError",
    "EventListener",
    "JsonLinesArchive",
    "ListenerStats",
    "MalformedEntry",
    "ReceiptListener",
    "RedisCommandError",
    "RedisSettings",
    "RedisUnavailable",
    "RqseError",
    "TrimResult",
    "dead_letter_key",
    "describe",
    "is_weather",
    "mask_url",
    "message",
    "receipt_for",
    "resolve_url",
    "server_warnings",
    "trim_acknowledged",
]
