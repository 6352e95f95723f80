"""Garbage on a stream never stops a listener: each bad entry is dead-lettered with
its reason, and the good entries around it are processed."""

from __future__ import annotations

from typing import Any

from rqse import EventClient, EventListener, dead_letter_key, message
from rqse.deadletter import INVALID_JSON, INVALID_KIND, OVERSIZE
from rqse.errors import MalformedEntry

GARBAGE: dict[str, tuple[dict[bytes, bytes], str]] = {
    "deep array": ({b"kind": b'"job"', b"v": b"[" * 200_000}, INVALID_JSON),
    "deep object": (
        {b"kind": b'"job"', b"v": b'{"a":' * 20_000 + b"1" + b"}" * 20_000},
        INVALID_JSON,
    ),
    "name not UTF-8": ({b"kind": b'"job"', b"\xff\xfe": b"1"}, INVALID_JSON),
    "value not UTF-8": ({b"kind": b'"job"', b"v": b"\xc3\x28"}, INVALID_JSON),
    "empty value": ({b"kind": b'"job"', b"v": b""}, INVALID_JSON),
    "integer of 100k digits": ({b"kind": b'"job"', b"v": b"9" * 100_000}, INVALID_JSON),
    "kind a list": ({b"kind": b'["job"]'}, INVALID_KIND),
    "kind null": ({b"kind": b"null"}, INVALID_KIND),
    "kind not JSON": ({b"kind": b"job"}, INVALID_JSON),
    "huge value": ({b"kind": b'"job"', b"v": b'"' + b"x" * 300_000 + b'"'}, OVERSIZE),
    "binary soup": ({bytes(range(256)): bytes(range(255, -1, -1))}, INVALID_JSON),
}


class Worker(EventListener):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.good: list[int] = []

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        self.good.append(event["n"])
        return True


def test_garbage_entries_are_dead_lettered_with_their_reason_and_the_rest_flows(
    redis_url, redis_client
):
    client = EventClient("jobs", url=redis_url)
    ids = {}
    for n, (name, (fields, _)) in enumerate(GARBAGE.items()):
        client.append(message({"n": n}, kind="job"))
        ids[redis_client.xadd("jobs", fields).decode()] = name
    client.append(message({"n": len(GARBAGE)}, kind="job"))

    worker = Worker("jobs", "g", url=redis_url, max_entry_bytes=256 * 1024)
    handled = worker.listen(idle_timeout=0.3)

    assert worker.good == list(range(len(GARBAGE) + 1))
    assert handled == 2 * len(GARBAGE) + 1
    letters = {
        event["id"]: event
        for _, event in EventClient(dead_letter_key("jobs"), url=redis_url).range(count=None)
    }
    assert {ids[i]: letter["reason"] for i, letter in letters.items()} == {
        name: reason for name, (_, reason) in GARBAGE.items()
    }
    assert redis_client.xpending("jobs", "g")["pending"] == 0


def test_an_overridden_decoder_that_trips_on_garbage_dead_letters_the_entry(
    redis_url, redis_client
):
    class Strict(Worker):
        def decode_entry(self, fields: dict[bytes, bytes], event_id: str) -> dict[str, Any]:
            event = super().decode_entry(fields, event_id)
            event["n"] = int(event["n"])  # KeyError, TypeError... on what it did not expect
            return event

    client = EventClient("jobs", url=redis_url)
    bad = client.append(message({"m": [1]}, kind="job"))
    client.append(message({"n": 2}, kind="job"))
    worker = Strict("jobs", "g", url=redis_url)
    worker.listen(idle_timeout=0.3)

    assert worker.good == [2]
    [(_, letter)] = EventClient(dead_letter_key("jobs"), url=redis_url).range(count=None)
    assert (letter["id"], letter["reason"]) == (bad, INVALID_JSON)
    assert letter["error"].startswith("KeyError while decoding")


def test_malformed_entry_is_the_error_of_deep_values_not_recursion_error():
    from rqse.events import decode_fields

    try:
        decode_fields({b"kind": b'"job"', b"v": b"[" * 100_000}, "1-0")
    except MalformedEntry as error:
        assert error.reason == INVALID_JSON and "nested too deeply" in str(error)
    else:
        raise AssertionError("a value nested 100,000 deep decoded")
