"""dead-letters list / show / requeue / purge: each with its reason; a requeue delivers
the entry again once, however often it is asked."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
import redis

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK
from lifecycle.dead_letters import find_dead_letter, list_dead_letters, requeue
from lifecycle.keys import TASK_GROUP, Keys
from rqse import EventListener
from rqse.keys import dead_letter_key
from tests.lifecycle.harness import Harness

KEYS = Keys()


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class Crashes(EventListener):
    """A task worker whose process() raises: rqse dead-letters the entry at once."""

    def process(self, event_id: str, event: dict[str, Any]) -> bool:
        raise RuntimeError("model file missing")


def dead_letter_a_task(client: redis.Redis, redis_url: str, harness: Harness, kind: str) -> str:
    """Submit ``kind:A``, advance, and let a crashing worker dead-letter its start-task;
    returns the workflow id."""
    workflow_id = harness.submit(compile_text(f"{kind}:A"))
    harness.advance()
    pool = redis.ConnectionPool.from_url(redis_url)
    worker = Crashes(
        KEYS.tasks(kind), TASK_GROUP, pool=pool, handle_signals=False, max_deliveries=1
    )
    worker.listen(idle_timeout=0.5)
    pool.disconnect()
    assert client.xlen(dead_letter_key(KEYS.tasks(kind))) == 1
    return workflow_id


@pytest.fixture
def dead(redis_client: redis.Redis, redis_url: str, harness: Harness) -> str:
    return dead_letter_a_task(redis_client, redis_url, harness, "ml")


def test_list_shows_each_dead_letter_with_its_reason_and_error(
    dead: str, redis_url: str, capsys: Any
) -> None:
    code, out, err = run(capsys, "dead-letters", "list", "--redis-url", redis_url)
    assert (code, err) == (EXIT_OK, "")
    header, line = out.splitlines()
    assert header.split("\t") == ["ID", "KIND", "AT", "REASON", "EVENT", "WORKFLOW", "ERROR"]
    cells = line.split("\t")
    assert cells[1:2] + cells[3:] == [
        "ml",
        "process-error",
        "start-task ml:A(1)",
        dead,
        "RuntimeError: model file missing",
    ]
    code, out, _ = run(capsys, "dead-letters", "list", "--json", "--redis-url", redis_url)
    [letter] = orjson.loads(out)
    assert (letter["reason"], letter["stream"], letter["event"]["workflow"]) == (
        "process-error",
        KEYS.tasks("ml"),
        dead,
    )


def test_list_by_kind_and_an_unknown_kind_is_one_line_naming_the_known(
    dead: str, redis_url: str, capsys: Any
) -> None:
    assert (
        run(capsys, "dead-letters", "list", "--kind", "lifecycle", "--redis-url", redis_url)[
            1
        ].splitlines()[1:]
        == []
    )
    code, out, _ = run(capsys, "dead-letters", "list", "--kind", "ml", "--redis-url", redis_url)
    assert len(out.splitlines()) == 2
    code, out, err = run(capsys, "dead-letters", "list", "--kind", "gpu", "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err == "error: no stream of kind 'gpu' (known: lifecycle, ml)\n"


def test_show_prints_the_whole_dead_letter_and_an_unknown_id_exits_2(
    dead: str, redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    [letter] = list_dead_letters(redis_client, KEYS)
    code, out, _ = run(capsys, "dead-letters", "show", letter.id, "--redis-url", redis_url)
    assert code == EXIT_OK
    assert "reason: process-error" in out and "RuntimeError: model file missing" in out
    assert f"    workflow: {orjson.dumps(dead).decode()}" in out
    assert "traceback:" in out
    for unknown, message in [
        ("1-0", "error: no dead letter '1-0' in any dead-letter stream\n"),
        ("oops", "error: 'oops' is not a stream entry id (like 1700000000000-0)\n"),
    ]:
        assert run(capsys, "dead-letters", "show", unknown, "--redis-url", redis_url) == (
            EXIT_ERROR,
            "",
            message,
        )


def test_requeue_delivers_the_task_again_and_the_workflow_finishes(
    dead: str, redis_client: redis.Redis, redis_url: str, harness: Harness, capsys: Any
) -> None:
    [letter] = list_dead_letters(redis_client, KEYS)
    code, out, _ = run(capsys, "dead-letters", "requeue", letter.id, "--redis-url", redis_url)
    assert code == EXIT_OK and f"{letter.id}: requeued to {KEYS.tasks('ml')} as " in out
    assert list_dead_letters(redis_client, KEYS) == []
    assert harness.work(lambda call: {"done": call.name}) == 1
    harness.advance()
    code, out, _ = run(capsys, "inspect", dead, "--json", "--redis-url", redis_url)
    assert orjson.loads(out)["state"] == "finished"
    # Asked again, it is no longer there: one line, exit 2, nothing sent.
    length = redis_client.xlen(KEYS.tasks("ml"))
    code, _, err = run(capsys, "dead-letters", "requeue", letter.id, "--redis-url", redis_url)
    assert code == EXIT_ERROR and err.startswith(f"error: no dead letter '{letter.id}'")
    assert redis_client.xlen(KEYS.tasks("ml")) == length


def test_two_requeues_of_one_dead_letter_at_once_deliver_it_once(
    dead: str, redis_client: redis.Redis, redis_url: str
) -> None:
    letter = find_dead_letter(redis_client, KEYS, list_dead_letters(redis_client, KEYS)[0].id)
    before = redis_client.xlen(KEYS.tasks("ml"))
    results: list[Any] = []
    start = threading.Barrier(8)

    def requeue_it() -> None:
        client = redis.Redis.from_url(redis_url)
        start.wait()
        results.append(requeue(client, letter).new_id)
        client.close()

    threads = [threading.Thread(target=requeue_it) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len([r for r in results if r is not None]) == 1
    assert redis_client.xlen(KEYS.tasks("ml")) == before + 1


def test_requeue_all_of_a_kind_leaves_the_other_kinds(
    dead: str, redis_client: redis.Redis, redis_url: str, harness: Harness, capsys: Any
) -> None:
    dead_letter_a_task(redis_client, redis_url, harness, "gpu")
    code, out, _ = run(
        capsys, "dead-letters", "requeue", "--all", "--kind", "gpu", "--redis-url", redis_url
    )
    assert code == EXIT_OK and out.endswith("1 requeued\n")
    assert [letter.source for letter in list_dead_letters(redis_client, KEYS)] == ["ml"]
    code, _, err = run(capsys, "dead-letters", "requeue", "--redis-url", redis_url)
    assert code == EXIT_ERROR and "give dead letter ids or --all" in err


def test_a_dead_letter_that_kept_no_fields_is_not_requeued(
    redis_client: redis.Redis, redis_url: str, capsys: Any
) -> None:
    from rqse.deadletter import OVERSIZE, dead_letter_fields

    redis_client.sadd(KEYS.kinds, "ml")
    fields = dead_letter_fields(
        stream=KEYS.tasks("ml"),
        group=TASK_GROUP,
        consumer="w1",
        entry_id="5-0",
        fields={b"kind": b'"start-task"', b"input": b"x" * 100},
        reason=OVERSIZE,
        error="entry of 112 bytes is larger than 64",
        deliveries=1,
    )
    dead_id = redis_client.xadd(dead_letter_key(KEYS.tasks("ml")), fields).decode()
    code, out, err = run(capsys, "dead-letters", "requeue", dead_id, "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err == (
        f"error: dead letter {dead_id} keeps no fields of its entry (oversize): nothing to "
        "requeue\n"
    )
    assert redis_client.xlen(dead_letter_key(KEYS.tasks("ml"))) == 1


def test_purge_asks_for_yes_then_deletes_the_dead_letters_of_its_kind(
    dead: str, redis_client: redis.Redis, redis_url: str, harness: Harness, capsys: Any
) -> None:
    dead_letter_a_task(redis_client, redis_url, harness, "gpu")
    code, out, err = run(capsys, "dead-letters", "purge", "--redis-url", redis_url)
    assert (code, out) == (EXIT_ERROR, "")
    assert err == "error: purge deletes 2 dead letters for good: add --yes to do it\n"
    assert len(list_dead_letters(redis_client, KEYS)) == 2
    code, out, _ = run(
        capsys, "dead-letters", "purge", "--kind", "ml", "--yes", "--redis-url", redis_url
    )
    assert (code, out) == (EXIT_OK, "ml: 1 deleted\n1 deleted\n")
    assert [letter.source for letter in list_dead_letters(redis_client, KEYS)] == ["gpu"]


def test_dead_letters_alone_lists_them_and_none_says_so(
    redis_url: str, capsys: Any, harness: Any
) -> None:
    harness.submit(compile_text("ml:A"))
    code, out, err = run(capsys, "dead-letters", "--redis-url", redis_url)
    assert (code, out, err) == (EXIT_OK, "no dead letters\n", "")
    code, out, err = run(capsys, "dead-letters", "list", "--redis-url", redis_url)
    assert (code, out, err) == (EXIT_OK, "no dead letters\n", "")


def test_dead_letters_alone_takes_list_options_and_options_before_the_action_hold(
    dead: str, redis_url: str, capsys: Any
) -> None:
    code, out, _ = run(capsys, "dead-letters", "--kind", "ml", "--json", "--redis-url", redis_url)
    [letter] = orjson.loads(out)
    assert (code, letter["event"]["workflow"]) == (EXIT_OK, dead)
    # Given before the action, an option is not overwritten by the action's default.
    code, out, _ = run(capsys, "dead-letters", "--redis-url", redis_url, "list", "--kind", "ml")
    assert (code, len(out.splitlines())) == (EXIT_OK, 2)


def test_requeue_help_says_a_dead_lettered_start_task_is_restarted_not_requeued(
    capsys: Any,
) -> None:
    with pytest.raises(SystemExit):
        main(["dead-letters", "--help"])
    top = capsys.readouterr().out
    assert "each delivered again once" not in top
    assert "python -m lifecycle restart" in top
    with pytest.raises(SystemExit):
        main(["dead-letters", "requeue", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "A dead-lettered start-task has already failed its task" in text
    assert "restart the workflow" in text
    with pytest.raises(SystemExit):
        main(["dead-letters", "list", "--help"])
    assert "(default 0: all)" in capsys.readouterr().out


def test_a_dead_letter_of_a_huge_kind_lists_in_one_short_line(
    redis_client: redis.Redis, redis_url: str, capsys: Any, harness: Any
) -> None:
    from workers.noop import NoopWorker

    harness.submit(compile_text("A"))  # names the default kind's stream
    stream = KEYS.tasks("default")
    redis_client.xadd(stream, {"kind": orjson.dumps("k\n" * 500_000)})  # 1 MB, line breaks
    worker = NoopWorker(["default"], pool=redis_client.connection_pool, handle_signals=False)
    assert worker.listen(max_events=1, idle_timeout=1.0) == 1
    code, out, _ = run(capsys, "dead-letters", "--redis-url", redis_url)
    header, line = out.splitlines()
    assert code == EXIT_OK and "\tunselected\t" in line and len(line) < 400
