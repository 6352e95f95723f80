from rqse import EventClient, message
from tests.conftest import wait_until
from tests.rqse.seed_sleep_listener import SleepListener


def test_the_seeds_sleep_listener_runs_unchanged(redis_client, redis_url, run_listener):
    kwargs = redis_client.connection_pool.connection_kwargs
    listener = SleepListener("workflow:run", host=kwargs["host"], port=kwargs["port"])
    run = run_listener(listener)
    client = EventClient("workflow:run", url=redis_url)
    task = {"workflow": "workflow:w-1", "index": 3, "input": {}, "parameters": {"for": 0}}
    declined = client.append(message({**task, "name": "sleep:later"}, kind="start-task"))
    started = client.append(message({**task, "name": "compute:nap"}, kind="start-task"))

    def kinds():
        return [event["kind"] for _, event in client.range(count=None)]

    wait_until(lambda: "end-task" in kinds(), what="end-task event")
    wait_until(lambda: listener.stats.handled == 4, what="its own receipt and end-task read")
    run.stop()
    events = [event for _, event in client.range(count=None)]
    receipt = next(e for e in events if e["kind"] == "receipt")
    end = next(e for e in events if e["kind"] == "end-task")
    assert receipt["for"] == started and receipt["action"] == "processed"
    assert end["name"] == "compute:nap" and end["status"] == "SUCCESS" and end["index"] == 3
    assert listener.stats.declined == 1 and listener.stats.processed == 1
    assert listener.stats.ignored == 2  # its own receipt and end-task
    assert declined not in {e.get("for") for e in events}
    client.close()
