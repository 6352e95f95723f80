"""process_batch(): a listener that takes the whole batch in one call."""

from typing import Any

from rqse import EventClient, EventListener, message
from rqse.keys import dead_letter_key
from tests.conftest import wait_until


class Batcher(EventListener):
    def __init__(self, *args: Any, fail_first: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.batches: list[list[int]] = []
        self.fail_first = fail_first

    def process_batch(self, batch: list[tuple[str, dict[str, Any]]]) -> list[str]:
        if self.fail_first:
            self.fail_first = False
            raise RuntimeError("transient")
        self.batches.append([event["n"] for _, event in batch])
        for event_id, event in batch:
            if event.get("bad"):
                self.reject(event_id, f"event {event_id}: field 'bad' is set")
        return []


def test_the_whole_batch_arrives_in_one_call_and_is_acknowledged(redis_url, run_listener) -> None:
    client = EventClient("jobs", url=redis_url)
    client.append_many([message({"n": n}, kind="job") for n in range(5)])
    worker = Batcher("jobs", "g", url=redis_url, batch_size=10)
    run_listener(worker)
    wait_until(lambda: worker.stats.processed == 5, what="five processed")
    assert worker.batches == [[0, 1, 2, 3, 4]]
    assert worker.connection.xpending("jobs", "g")["pending"] == 0


def test_a_raising_batch_stays_pending_and_is_retried(redis_url, run_listener) -> None:
    client = EventClient("jobs", url=redis_url)
    client.append_many([message({"n": n}, kind="job") for n in range(3)])
    worker = Batcher("jobs", "g", url=redis_url, fail_first=True, claim_idle=0.05)
    run_listener(worker)
    wait_until(lambda: worker.stats.processed == 3, what="retried batch processed")
    assert worker.batches[-1] == [0, 1, 2]


def test_reject_moves_one_event_to_the_dead_letters_and_the_rest_flow(
    redis_url, run_listener
) -> None:
    client = EventClient("jobs", url=redis_url)
    client.append_many([message({"n": 0}, kind="job"), message({"n": 1, "bad": True}, kind="job")])
    worker = Batcher("jobs", "g", url=redis_url)
    run_listener(worker)
    dead = EventClient(dead_letter_key("jobs"), url=redis_url)
    wait_until(lambda: len(dead) == 1, what="one dead letter")
    ((_, letter),) = dead.range()
    assert letter["reason"] == "rejected" and "field 'bad'" in letter["error"]
    wait_until(lambda: worker.connection.xpending("jobs", "g")["pending"] == 0, what="all acked")
