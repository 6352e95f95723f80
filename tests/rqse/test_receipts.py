import io

import orjson
import pytest

from rqse import (
    ConfigurationError,
    EventClient,
    JsonLinesArchive,
    ReceiptListener,
    message,
    receipt_for,
)


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("workflow:run", url=redis_url) as client:
        yield client


def test_the_receipt_log_archives_receipt_and_target_then_deletes_both(client, redis_url):
    target_id = client.append(message({"name": "a"}, kind="start-task"))
    other_id = client.append(message({"name": "b"}, kind="end-task"))
    receipt_id = client.append(receipt_for(target_id))
    archived = []
    log = ReceiptListener(
        "workflow:run", logger=lambda *record: archived.append(record), url=redis_url
    )
    assert log.listen(max_events=3) == 3
    [(r_id, receipt, t_id, target)] = archived
    assert (r_id, t_id) == (receipt_id, target_id)
    assert receipt["kind"] == "receipt" and target["name"] == "a"
    assert [entry_id for entry_id, _ in client.range(count=None)] == [other_id]


def test_an_archive_that_refuses_keeps_receipt_and_target(client, redis_url, redis_client):
    target_id = client.append(message(kind="start-task"))
    receipt_id = client.append(receipt_for(target_id))
    log = ReceiptListener("workflow:run", logger=lambda *record: False, url=redis_url)
    log.listen(idle_timeout=0.05)
    assert log.stats.failed == 1
    assert len(client) == 2
    pending = redis_client.xpending_range("workflow:run", "__receipt__", "-", "+", 10)
    assert [p["message_id"].decode() for p in pending] == [receipt_id]


def test_a_receipt_whose_target_is_gone_is_archived_and_deleted(client, redis_url):
    receipt_id = client.append(receipt_for("1-0"))
    archived = []
    log = ReceiptListener(
        "workflow:run", logger=lambda *record: archived.append(record), url=redis_url
    )
    log.listen(max_events=1)
    assert archived == [(receipt_id, archived[0][1], "1-0", None)]
    assert len(client) == 0


def test_json_lines_archive_writes_one_record_per_receipt(client, redis_url):
    target_id = client.append(message({"n": 1}, kind="start-task"))
    client.append(receipt_for(target_id, action="started"))
    out = io.StringIO()
    log = ReceiptListener("workflow:run", logger=JsonLinesArchive(out), url=redis_url)
    log.listen(max_events=2)
    [line] = out.getvalue().splitlines()
    record = orjson.loads(line)
    assert record["target_id"] == target_id and record["target"]["n"] == 1
    assert record["receipt"]["action"] == "started"


def test_a_logger_that_is_not_callable_is_refused(redis_url):
    class OldStyleLogger:
        def log(self, connection, receipt_id, event, receipt_for, target):
            return True

    with pytest.raises(ConfigurationError, match="not callable"):
        ReceiptListener("workflow:run", logger=OldStyleLogger(), url=redis_url)
