"""The receipt log: archive each receipt with its target, then delete both.

A receipt (``receipt_for(id)``) says that entry ``id`` of the same stream has
been taken care of. :class:`ReceiptListener` reads receipts as group
``__receipt__``, fetches the target entry, hands both to an archive callable
and, once that returned, deletes receipt and target (XDEL) in the same
transaction that acknowledges the receipt. If the archive raises or returns
False, nothing is deleted and the receipt is retried (then dead-lettered after
``max_deliveries``).

Deleting the target removes it for every group: write a receipt only once the
event needs no further processing by anyone (as the seed's workers do when
they take a task on).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import IO, Any

import orjson

from rqse.errors import ConfigurationError, ReceiptNotArchived
from rqse.events import FOR, RECEIPT, decode_lenient
from rqse.keys import RECEIPT_GROUP
from rqse.listener import EventListener

__all__ = ["Archive", "JsonLinesArchive", "ReceiptListener", "log_receipt"]

logger = logging.getLogger(__name__)

# archive(receipt_id, receipt, target_id, target) -> anything but False
Archive = Callable[[str, dict[str, Any], str | None, dict[str, Any] | None], object]

_ENTRY_ID = re.compile(r"\d+-\d+")


def log_receipt(
    receipt_id: str, receipt: dict[str, Any], target_id: str | None, target: dict[str, Any] | None
) -> None:
    """Default archive: one INFO record on the ``rqse.receipts`` logger."""
    logger.info(
        "receipt %s for %s: %s target: %s",
        receipt_id,
        target_id,
        orjson.dumps(receipt).decode(),
        orjson.dumps(target).decode() if target is not None else "(gone)",
    )


class JsonLinesArchive:
    """Archive receipts as JSON lines, ``{"id", "receipt", "target_id", "target"}``,
    to a text file (standard output by default)."""

    def __init__(self, file: IO[str] | None = None) -> None:
        self._file = file

    def __call__(
        self,
        receipt_id: str,
        receipt: dict[str, Any],
        target_id: str | None,
        target: dict[str, Any] | None,
    ) -> None:
        record = {"id": receipt_id, "receipt": receipt, "target_id": target_id, "target": target}
        file = self._file or sys.stdout
        file.write(orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS).decode() + "\n")
        file.flush()


class ReceiptListener(EventListener):
    """Listener of ``receipt`` events on ``key`` that archives and deletes them.

    ``logger`` is the archive callable (default :func:`log_receipt`); other
    keyword arguments are those of :class:`rqse.listener.EventListener`.
    """

    def __init__(
        self,
        key: str | Sequence[str],
        logger: Archive | None = None,
        *,
        group: str = RECEIPT_GROUP,
        **options: Any,
    ) -> None:
        options.setdefault("select", [RECEIPT])
        super().__init__(key, group, **options)
        self.logger = logger

    @property
    def logger(self) -> Archive:
        return self._archive

    @logger.setter
    def logger(self, value: Archive | None) -> None:
        if value is not None and not callable(value):
            raise ConfigurationError(
                f"receipt logger {value!r} is not callable (expected "
                "archive(receipt_id, receipt, target_id, target); rqse 0.5 logger objects "
                "with log()/commit() are not supported)"
            )
        self._archive = value or log_receipt

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        stream = self.current_stream or self.key
        named = event.get(FOR)
        target_id = named if isinstance(named, str) and _ENTRY_ID.fullmatch(named) else None
        target = None
        if target_id is not None:
            rows: Any = self._redis.xrange(stream, target_id, target_id, count=1)
            if rows:
                target = decode_lenient(rows[0][1])
        if self._archive(event_id, event, target_id, target) is False:
            raise ReceiptNotArchived(f"receipt {event_id} for {target_id}: the archive refused it")
        if target_id is not None and target is not None:
            self._outbox.delete(stream, target_id, event_id)
        else:
            self._outbox.delete(stream, event_id)
        return True
