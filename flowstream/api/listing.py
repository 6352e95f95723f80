"""The workflow list over every partition: pages merged newest first, and a cursor that
holds one position per partition.

Each partition's index is paged by :func:`lifecycle.inspect.list_page` (by creation
time and id); a page of the whole deployment reads up to ``limit`` rows from each
partition after its own position, merges them in that same order and keeps the first
``limit``. The cursor of the next page is each partition's position after the rows it
gave: ``p<P>.`` and the positions as base64url JSON, each a ``list_page`` cursor,
``null`` for a partition not read yet, ``false`` for one read to its end. With one
partition the cursor is ``list_page``'s own, unchanged.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from typing import Any

import orjson

from flowstream.api.context import Api, Place
from flowstream.api.problems import Problem
from lifecycle.inspect import list_page
from lifecycle.schedules import Schedules

__all__ = ["list_merged", "list_workflows_page"]

_DONE = False  # a partition read to its end, in a cursor's positions


def list_workflows_page(
    api: Api,
    state: str | None,
    flow: str | None,
    limit: int,
    cursor: str | None,
    schedule: str | None,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the list and the cursor of the next (None at the end): a schedule's
    runs from its partition alone, else every partition merged (:func:`list_merged`)."""
    if schedule:  # an unknown schedule is a 404, not an empty list
        place = api.for_tag(schedule)
        Schedules(place.redis, place.keys).get(schedule)
        index = place.keys.schedule_runs(schedule)
        return list_page(place.redis, place.keys, state, flow, limit, cursor, place.graphs, index)
    places = api.places()
    if len(places) == 1:
        place = places[0]
        return list_page(place.redis, place.keys, state, flow, limit, cursor, place.graphs)
    return list_merged(places, state, flow, limit, cursor)


def list_merged(
    places: list[Place], state: str | None, flow: str | None, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """Up to ``limit`` rows of every partition newest first, after ``cursor``."""
    positions = _positions(cursor, len(places))
    read: list[tuple[tuple[float, str], int, dict[str, Any]]] = []
    following: list[str | None] = []
    for index, (place, position) in enumerate(zip(places, positions, strict=True)):
        if position is _DONE:
            following.append(None)
            continue
        since = position if isinstance(position, str) else None
        rows, after = list_page(place.redis, place.keys, state, flow, limit, since, place.graphs)
        following.append(after)
        for row, score in zip(rows, _scores(place, rows), strict=True):
            if score is None:
                continue  # removed since it was read (deleted, or retention's)
            # The partition's own order (score, then id, both descending): merged in it,
            # a partition's rows stay in the order its cursor follows.
            read.append(((score, row["id"]), index, row))
    read.sort(key=lambda item: item[0], reverse=True)
    taken = read[:limit]
    last = {index: order for order, index, _ in taken}  # the last row taken of each
    count = Counter(index for _, index, _ in taken)
    given = Counter(index for _, index, _ in read)
    after_page: list[str | bool | None] = []
    for index, position in enumerate(positions):
        if position is _DONE:
            after_page.append(_DONE)
        elif count[index] < given[index]:
            # Rows of this partition were left for the next page: go on after the last taken.
            if index in last:
                score, workflow_id = last[index]
                after_page.append(f"{int(score)}:{workflow_id}")
            else:
                after_page.append(position)
        else:  # every row it gave is on this page: on after its own cursor, or at its end
            after_page.append(following[index] if following[index] is not None else _DONE)
    if all(position is _DONE for position in after_page):
        return [row for _, _, row in taken], None
    return [row for _, _, row in taken], _encode(after_page)


def _scores(place: Place, rows: list[dict[str, Any]]) -> list[float | None]:
    """Each row's score in the partition's index, the order its pages follow (the rows
    show the record's creation time, which need not be the score to the millisecond);
    None for a row no longer indexed."""
    if not rows:
        return []
    pipe = place.redis.pipeline(transaction=False)
    for row in rows:
        pipe.zscore(place.keys.workflows, row["id"])
    return [None if score is None else float(score) for score in pipe.execute()]


def _encode(positions: list[str | bool | None]) -> str:
    text = base64.urlsafe_b64encode(orjson.dumps(positions)).decode().rstrip("=")
    return f"p{len(positions)}.{text}"


def _positions(cursor: str | None, count: int) -> list[str | bool | None]:
    """The positions a cursor of :func:`list_merged` holds, one per partition; 400 for a
    cursor this listing did not give (another partition count, a one-partition cursor)."""
    if not cursor:
        return [None] * count
    head, dot, text = cursor.partition(".")
    bad = Problem(
        400,
        f"cursor {cursor[:80]!r}: not a cursor a listing of this deployment's {count} "
        "partitions gave",
    )
    if not dot or head != f"p{count}":
        raise bad
    try:
        positions = orjson.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(positions, list) or len(positions) != count:
        raise bad
    for position in positions:
        if not (position is None or position is _DONE or isinstance(position, str)):
            raise bad
    return positions
