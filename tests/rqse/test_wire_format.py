"""The wire format, and interoperability with rqse 0.5 (which used json.dumps/json.loads).

The 0.5 side is written here from the format documented in docs/events.md: each
top-level key is a field, each value ``json.dumps(value)``; reading is
``json.loads(value.decode())`` per field.
"""

import json
import math
import re
from datetime import datetime, timedelta, timezone

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rqse import EventClient, EventEncodingError, MalformedEntry, message, receipt_for
from rqse.events import decode_fields, encode_event


def write_like_rqse_05(client: redis.Redis, key: str, event: dict) -> bytes:
    return client.xadd(key, {name: json.dumps(value) for name, value in event.items()})


def read_like_rqse_05(fields: dict[bytes, bytes]) -> dict:
    return {
        name.decode("utf-8"): json.loads(value.decode("utf-8")) for name, value in fields.items()
    }


ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00")

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | text
    | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=12,
)
events = st.dictionaries(text.filter(bool), json_values, min_size=1, max_size=6)
hypothesis_settings = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def test_message_adds_kind_api_version_at_and_for_without_overriding_data():
    event = message({"name": "a", "kind": "mine"}, kind="other", response_for="1-0")
    assert event["kind"] == "mine"
    assert event["apiVersion"] == "v1"
    assert ISO_UTC.fullmatch(event["at"])
    assert event["for"] == "1-0"
    data = {"x": 1}
    message(data, kind="k")
    assert data == {"x": 1}, "message() copies its data"


def test_message_times_are_iso_8601_in_utc():
    tokyo = timezone(timedelta(hours=9))
    assert message(kind="k", at=datetime(2024, 5, 1, 21, 0, tzinfo=tokyo))["at"] == (
        "2024-05-01T12:00:00+00:00"
    )
    assert message(kind="k", at=datetime(2024, 5, 1, 12, 0))["at"] == "2024-05-01T12:00:00+00:00"


def test_receipt_for_names_its_target_and_action():
    receipt = receipt_for("1700000000000-0", action="started", target="worker-1")
    assert receipt["kind"] == "receipt"
    assert receipt["for"] == "1700000000000-0"
    assert receipt["action"] == "started"
    assert receipt["target"] == "worker-1"
    assert "target" not in receipt_for("1-0")


@hypothesis_settings
@given(event=events)
def test_entries_written_like_rqse_05_decode_identically(redis_client, event):
    entry_id = write_like_rqse_05(redis_client, "interop", event)
    fields = redis_client.xrange("interop", entry_id, entry_id)[0][1]
    assert decode_fields(fields, kind_field=None) == event


@hypothesis_settings
@given(event=events)
def test_entries_we_write_decode_with_rqse_05_rules(redis_client, redis_url, event):
    client = EventClient("interop", url=redis_url)
    entry_id = client.append(event)
    fields = redis_client.xrange("interop", entry_id, entry_id)[0][1]
    assert read_like_rqse_05(fields) == event
    client.close()


def test_a_full_0_5_event_reads_back_through_the_client(redis_client, redis_url):
    event = {
        "kind": "start-task",
        "apiVersion": "v1",
        "at": "2024-05-01T12:00:00+00:00",
        "workflow": "workflow:w-1",
        "name": "sleep:nap",
        "index": 2,
        "input": {"naïve": "café", "n": [1, 2.5, None, True]},
        "parameters": {},
    }
    entry_id = write_like_rqse_05(redis_client, "workflow:run", event).decode()
    client = EventClient("workflow:run", url=redis_url)
    assert client.range(count=None) == [(entry_id, event)]
    assert client.read(count=5) == [(entry_id, event)]
    client.close()


def test_0_5_tokens_orjson_refuses_still_decode():
    fields = {
        b"kind": json.dumps("k").encode(),
        b"x": json.dumps(float("nan")).encode(),
        b"big": json.dumps(2**70).encode(),
        b"inf": b"-Infinity",
    }
    event = decode_fields(fields)
    assert math.isnan(event["x"]) and event["big"] == 2**70 and event["inf"] == -math.inf


def test_field_values_are_compact_utf8_json():
    fields = encode_event({"kind": "k", "s": "café", "n": {"a": [1, 2]}})
    assert fields == {"kind": b'"k"', "s": '"café"'.encode(), "n": b'{"a":[1,2]}'}


def test_events_that_cannot_be_encoded_name_the_field():
    with pytest.raises(EventEncodingError, match="field 'when'"):
        encode_event({"kind": "k", "when": object()})
    with pytest.raises(EventEncodingError, match="at least one field"):
        encode_event({})
    with pytest.raises(EventEncodingError, match="mapping"):
        encode_event(["kind", "k"])


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"kind": b"not json"}, "invalid-json"),
        ({b"kind": b'"k"', b"x": b"{"}, "invalid-json"),
        ({b"\xff": b"1", b"kind": b'"k"'}, "invalid-json"),
        ({b"name": b'"a"'}, "invalid-kind"),
        ({b"kind": b"42"}, "invalid-kind"),
        ({b"kind": b'"k"', b"blob": b'"' + b"x" * 2000 + b'"'}, "oversize"),
    ],
)
def test_malformed_entries_are_reported_with_a_reason(fields, reason):
    with pytest.raises(MalformedEntry) as caught:
        decode_fields(fields, entry_id="5-0", max_bytes=1024)
    assert caught.value.reason == reason
    assert "entry 5-0" in str(caught.value)


def test_decoding_many_distinct_field_names_keeps_the_name_cache_bounded():
    from rqse import events

    long_names = [b"%d-" % number + b"x" * 200 for number in range(50)]
    many_names = [b"name-%d" % number for number in range(2 * events._MAX_NAMES)]
    for name in long_names + many_names:
        assert decode_fields({name: b"1"}, kind_field=None) == {name.decode(): 1}
    assert len(events._NAMES) <= events._MAX_NAMES
    assert not any(len(name) > events._MAX_NAME_BYTES for name in events._NAMES)
    # Past the bound the cache starts afresh: names decode, and new ones are cached.
    assert decode_fields({b"kind": b'"k"', b"late-name": b"[1]"}) == {"kind": "k", "late-name": [1]}
    assert events._NAMES[b"late-name"] == "late-name"


def test_an_integer_past_64_bits_is_read_exactly_not_rounded_to_a_float() -> None:
    from rqse.events import decode_fields

    huge = 10**40
    event = decode_fields(
        {b"kind": b'"job"', b"n": str(huge).encode(), b"id": b'"1795616645598-0"'}
    )
    assert event["n"] == huge and type(event["n"]) is int
    assert decode_fields({b"kind": b'"job"', b"n": b"12"})["n"] == 12
