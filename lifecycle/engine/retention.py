"""Retention: workflows that ended are compacted, then removed, when their time comes.

The commit that ends a workflow schedules its removal (``Keys.expiring``, scored by
the time it is due, when the lifecycle worker runs with a retention); the pump
made here removes the due ones with ``expire.lua`` — the record, its entry in the
workflow index and in the stopped set — in batches, at a cost that grows with
what expires, not with what is kept. Their history stays in the receipts archive.

A workflow that finished is compacted first: its commit schedules that step
(after ``--keep-details``) and records in the workflow when its removal is due
(``records.EXPIRES``); the same script then drops its task records — the archive
holds every start and end — and schedules the removal. What is left of it becomes
one entry of a shared hash (``Keys.compacted``, read by :mod:`lifecycle.compact`),
its removal an entry of a list in due order (``Keys.expiring_compacted``): what a
finished workflow keeps until then is that, its index entry, and its input and
output. Failed and terminated
workflows keep theirs: a restart runs from them.
"""

from __future__ import annotations

import re

import redis

from lifecycle import compact
from lifecycle import records as rec
from lifecycle.errors import LifecycleError
from lifecycle.keys import Keys
from rqse import lua
from rqse.pump import Pump

__all__ = ["DEFAULT_KEEP_DETAILS", "DEFAULT_RETENTION", "parse_duration", "retention_pump"]

_SCRIPTS = lua.scripts_dir(__file__)
DEFAULT_RETENTION = "7d"
DEFAULT_KEEP_DETAILS = "10m"
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``0``, ``90`` (seconds), ``500ms``, ``30s``, ``15m``, ``12h``,
    ``7d``, ``2w``; :class:`LifecycleError` naming the text otherwise."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise LifecycleError(
            f"{text!r} is not a duration (a number with ms, s, m, h, d or w, e.g. 7d)"
        )
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def retention_pump(
    client: redis.Redis, keys: Keys, interval: float = 1.0, batch: int = 500
) -> Pump:
    """The pump that compacts the finished workflows and removes the ended ones when
    their time comes (``start()`` it, or ``fire_due()``)."""
    return Pump(
        lua.load_script(client, "expire", _SCRIPTS),
        [
            keys.expiring,
            keys.workflows,
            keys.stopped,
            keys.compacted,
            keys.expiring_compacted,
            keys.expiring_compacted_last,
            keys.graph_refs,
        ],
        name="retention",
        interval=interval,
        batch=batch,
        args=[
            keys.workflow(""),
            rec.EXPIRES,
            rec.COMPACTED,
            " ".join(compact.KEPT),
            " ".join(compact.DROPPED),
            *rec.COMPACTED_PREFIXES,
        ],
    )
