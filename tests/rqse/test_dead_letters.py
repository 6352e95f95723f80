import pytest

from rqse import EventClient, EventListener, dead_letter_key, message
from tests.conftest import wait_until


class Worker(EventListener):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.good: list[int] = []
        self.poison_attempts = 0

    def process(self, event_id, event):
        if event.get("poison"):
            self.poison_attempts += 1
            raise ValueError(f"cannot handle {event['n']}")
        self.good.append(event["n"])
        return True


@pytest.fixture
def client(redis_url, redis_client):
    with EventClient("jobs", url=redis_url) as client:
        yield client


def test_poison_and_malformed_entries_end_in_the_dead_letter_stream_while_good_ones_flow(
    client, redis_url, redis_client, run_listener
):
    raw = {
        "not-json": {"kind": '"job"', "n": "{oops"},
        "no-kind": {"n": "1"},
        "kind-not-a-string": {"kind": "7"},
        "oversize": {"kind": '"job"', "blob": '"' + "x" * 4096 + '"'},
    }
    client.append(message({"n": 0}, kind="job"))
    poison_id = client.append(message({"n": 1, "poison": True}, kind="job"))
    raw_ids = {name: redis_client.xadd("jobs", fields).decode() for name, fields in raw.items()}
    client.append_many([message({"n": n}, kind="job") for n in range(2, 10)])

    worker = Worker(
        "jobs", "g", url=redis_url, max_deliveries=3, claim_idle=0.05, max_entry_bytes=1024
    )
    run = run_listener(worker)
    dead = EventClient(dead_letter_key("jobs"), url=redis_url)
    wait_until(lambda: len(dead) == 5, what="five dead letters")
    run.stop()

    assert worker.good == [0, *range(2, 10)]
    letters = {event["id"]: event for _, event in dead.range(count=None)}
    assert letters[poison_id]["reason"] == "process-error"
    assert letters[poison_id]["error"] == "ValueError: cannot handle 1"
    assert "Traceback" in letters[poison_id]["traceback"]
    assert letters[poison_id]["deliveries"] == 3 == worker.poison_attempts
    assert letters[poison_id]["fields"]["poison"] == "true"
    assert letters[raw_ids["not-json"]]["reason"] == "invalid-json"
    assert "'n'" in letters[raw_ids["not-json"]]["error"]
    assert letters[raw_ids["not-json"]]["fields"] == raw["not-json"]
    assert letters[raw_ids["no-kind"]]["reason"] == "invalid-kind"
    assert letters[raw_ids["kind-not-a-string"]]["reason"] == "invalid-kind"
    assert letters[raw_ids["oversize"]]["reason"] == "oversize"
    assert "fields" not in letters[raw_ids["oversize"]]
    assert all(
        letter["kind"] == "dead-letter" and letter["group"] == "g" for letter in letters.values()
    )
    assert redis_client.xpending("jobs", "g")["pending"] == 0
    assert worker.stats.dead_lettered == 5


def test_an_entry_delivered_too_often_is_dead_lettered_without_processing(
    client, redis_url, redis_client
):
    # A consumer that crashes on an entry (e.g. the process is killed) never
    # reports a failure; the delivery count alone must stop the loop.
    entry_id = client.append(message({"n": 1}, kind="job"))
    redis_client.xgroup_create("jobs", "g", id="0")
    redis_client.xreadgroup("g", "crashed-0", {"jobs": ">"})
    for attempt in (1, 2):
        redis_client.xclaim("jobs", "g", f"crashed-{attempt}", 0, [entry_id])
    worker = Worker("jobs", "g", url=redis_url, max_deliveries=3, claim_idle=0.01)
    worker.listen(max_events=1)
    assert worker.good == []
    [(_, letter)] = EventClient("jobs:dead", url=redis_url).range()
    assert letter["reason"] == "max-deliveries"
    assert letter["deliveries"] == 4


def test_a_reader_that_does_not_own_the_stream_acknowledges_garbage_without_a_dead_letter(
    redis_client,
) -> None:
    from rqse import EventListener
    from rqse.keys import dead_letter_key

    redis_client.xadd("shared", {"kind": "not json {"})
    seen: list[str] = []

    class Reader(EventListener):
        def process(self, event_id, event):  # type: ignore[no-untyped-def]
            seen.append(event_id)
            return True

    reader = Reader(
        "shared", "second", pool=redis_client.connection_pool, handle_signals=False,
        block_ms=50, own_garbage=False,
    )  # fmt: skip
    reader.listen(idle_timeout=0.3)
    assert seen == [] and reader.stats.ignored == 1
    assert redis_client.xlen(dead_letter_key("shared")) == 0
    assert redis_client.xpending("shared", "second")["pending"] == 0
