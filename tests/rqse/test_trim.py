import pytest

from rqse import EventClient, ReceiptListener, message, receipt_for, trim_acknowledged


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("events", url=redis_url) as client:
        yield client


def ids_left(client):
    return [entry_id for entry_id, _ in client.range(count=None)]


def test_trimming_removes_only_entries_every_group_has_acknowledged(client, redis_client):
    ids = client.append_many([message({"n": n}, kind="k") for n in range(10)])
    redis_client.xgroup_create("events", "fast", id="0")
    redis_client.xgroup_create("events", "slow", id="0")
    redis_client.xreadgroup("fast", "f", {"events": ">"}, count=10)
    redis_client.xack("events", "fast", *ids)
    redis_client.xreadgroup("slow", "s", {"events": ">"}, count=6)
    redis_client.xack("events", "slow", *ids[:4])  # 4 and 5 still pending

    result = trim_acknowledged(client, receipt_group=None)
    assert (result.removed, result.bound) == (4, ids[4])
    assert ids_left(client) == ids[4:]


def test_a_stream_without_groups_is_not_trimmed(client):
    client.append_many([message(kind="k")] * 3)
    assert trim_acknowledged(client).removed == 0
    assert len(client) == 3


def test_trimming_keeps_targets_of_receipts_not_yet_archived(client, redis_client, redis_url):
    task, other = client.append_many([message(kind="start-task"), message(kind="end-task")])
    redis_client.xgroup_create("events", "worker", id="0")
    redis_client.xgroup_create("events", "__receipt__", id="0")
    redis_client.xreadgroup("__receipt__", "log", {"events": ">"})  # read both, not receipts
    redis_client.xack("events", "__receipt__", task, other)
    receipt = client.append(receipt_for(task))
    redis_client.xreadgroup("worker", "w", {"events": ">"})
    redis_client.xack("events", "worker", task, other, receipt)

    assert trim_acknowledged(client).removed == 0, "the receipt log still needs the task"

    ReceiptListener("events", logger=lambda *record: None, url=redis_url).listen(max_events=1)
    assert ids_left(client) == [other]
    assert trim_acknowledged(client).removed == 1
    assert ids_left(client) == []


def test_a_receipt_log_lagging_beyond_the_scan_limit_prevents_trimming(client, redis_client):
    ids = client.append_many([message(kind="k")] * 5)
    redis_client.xgroup_create("events", "__receipt__", id="0")
    redis_client.xreadgroup("__receipt__", "log", {"events": ">"}, count=1)
    redis_client.xack("events", "__receipt__", ids[0])
    assert trim_acknowledged(client, scan_limit=3).removed == 0
    assert trim_acknowledged(client, scan_limit=10).removed == 0  # bound is ids[0]: nothing below
    assert len(client) == 5


def test_trimming_a_raw_redis_client_needs_the_key(redis_client):
    with pytest.raises(ValueError, match="key is required"):
        trim_acknowledged(redis_client)
    assert trim_acknowledged(redis_client, "missing").removed == 0
