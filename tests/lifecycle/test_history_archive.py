"""history and inspect name the archive the receipts worker recorded, and history reads
the part of a timeline Redis no longer holds from it, marking what came from there."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import orjson
import redis

from flowlang.compiler import compile_text
from flowstream.cli import main
from lifecycle.cli import EXIT_ERROR, EXIT_OK
from lifecycle.keys import Keys
from tests.lifecycle.audit_helpers import archive_all
from tests.lifecycle.harness import Harness

KEYS = Keys()


def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def archived_and_trimmed(client: redis.Redis, harness: Harness, directory: Path) -> str:
    """A finished workflow whose every event the receipts worker archived, then trimmed
    from the streams (a later entry keeps each stream non-empty)."""
    workflow_id = harness.submit(compile_text("A → B"), {"n": 1}, "wf-a")
    harness.pump(lambda call: call.input)
    archive_all(client, directory)
    for stream in [KEYS.lifecycle, KEYS.tasks("default")]:
        client.xtrim(stream, maxlen=0, approximate=False)
    return workflow_id


def test_the_receipts_worker_records_where_it_archives(
    redis_client: redis.Redis, harness: Harness, tmp_path: Path
) -> None:
    archived_and_trimmed(redis_client, harness, tmp_path / "receipts")
    record = orjson.loads(redis_client.get(KEYS.archive))  # type: ignore[arg-type]
    assert record == {"path": str((tmp_path / "receipts").resolve()), "host": socket.gethostname()}


def test_history_reads_the_trimmed_part_from_the_recorded_archive_and_marks_it(
    redis_client: redis.Redis, redis_url: str, harness: Harness, tmp_path: Path, capsys: Any
) -> None:
    workflow_id = archived_and_trimmed(redis_client, harness, tmp_path / "receipts")
    code, out, _ = run(capsys, "history", workflow_id, "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (code, data["complete"], data["lost"]) == (EXIT_OK, True, [])
    assert data["archive"] == str((tmp_path / "receipts").resolve())
    events = [(row["event"], row.get("archived")) for row in data["timeline"]]
    assert events[0] == ("start-workflow", True) and events[-1] == ("end-workflow", True)
    assert [e for e, _ in events].count("end-task") == 2
    code, out, _ = run(capsys, "history", workflow_id, "--redis-url", redis_url)
    assert "  6 events read from the archive" in out
    assert all(line.endswith("(archive)") for line in out.splitlines()[-6:])
    # Without the archive: partial, and the rest is named by its path, not a placeholder.
    code, out, _ = run(
        capsys, "history", workflow_id, "--no-archive", "--json", "--redis-url", redis_url
    )
    data = orjson.loads(out)
    assert (data["complete"], data["timeline"], data["archive"]) == (False, [], None)
    path = str((tmp_path / "receipts").resolve())
    assert data["rest"] == (
        f"the receipts archive at {path} on this host has all of it: python -m lifecycle "
        f"history {workflow_id}, or python -m lifecycle replay {path} --workflow "
        f"{workflow_id} --offline"
    )


def test_an_explicit_archive_that_is_not_a_directory_is_one_line(
    redis_client: redis.Redis, redis_url: str, harness: Harness, tmp_path: Path, capsys: Any
) -> None:
    workflow_id = harness.submit(compile_text("A"), None, "wf-x")
    missing = tmp_path / "nowhere"
    code, out, err = run(
        capsys, "history", workflow_id, "--archive", str(missing), "--redis-url", redis_url
    )
    assert (code, out) == (EXIT_ERROR, "")
    assert err == f"error: --archive {missing}: no such directory (a receipts worker's --archive)\n"


def test_an_archive_on_another_host_is_named_with_its_host_and_not_read(
    redis_client: redis.Redis, redis_url: str, harness: Harness, tmp_path: Path, capsys: Any
) -> None:
    workflow_id = archived_and_trimmed(redis_client, harness, tmp_path / "receipts")
    redis_client.set(KEYS.archive, orjson.dumps({"path": "/srv/receipts", "host": "vault-1"}))
    code, out, _ = run(capsys, "history", workflow_id, "--json", "--redis-url", redis_url)
    data = orjson.loads(out)
    assert (data["complete"], data["archive"]) == (False, None)
    assert data["rest"] == (
        "the receipts archive at /srv/receipts on host vault-1 has all of it: python -m "
        f"lifecycle history {workflow_id} --archive DIR, or python -m lifecycle replay "
        f"/srv/receipts --workflow {workflow_id} --offline (on host vault-1)"
    )
    # Named with --archive, a copy of it here is read.
    code, out, _ = run(
        capsys,
        "history",
        workflow_id,
        "--archive",
        str(tmp_path / "receipts"),
        "--json",
        "--redis-url",
        redis_url,
    )
    assert orjson.loads(out)["complete"] is True
    # inspect names it too, and so does the error for an id Redis no longer has.
    code, out, _ = run(capsys, "inspect", workflow_id, "--redis-url", redis_url)
    assert "the receipts archive at /srv/receipts on host vault-1" in out
    redis_client.delete(KEYS.workflow(workflow_id))
    code, out, err = run(capsys, "inspect", workflow_id, "--redis-url", redis_url)
    assert code == EXIT_ERROR
    assert err.endswith(
        f"python -m lifecycle replay /srv/receipts --workflow {workflow_id} --offline "
        "(on host vault-1))\n"
    )
