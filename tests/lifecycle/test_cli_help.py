"""What `run --help`, the top-level help and a bad Redis URL tell a newcomer."""

from __future__ import annotations

import pytest

from lifecycle.cli import main


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_run_help_gives_the_timeout_default_what_a_timeout_does_and_the_exit_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = help_text(["run"], capsys)
    assert "stop waiting after this many seconds and exit 2; the workflow goes on" in text
    assert "(default: wait until it ends)" in text
    assert "workflow-<uuid> for a flow without @flow name, e.g. from stdin" in text
    assert "exit codes: 0 started (with --wait: the workflow finished" in text
    assert "1 with --wait: the workflow failed or was terminated" in text


def test_top_level_help_spells_out_each_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text([], capsys)
    assert "0 done (run --wait: the workflow finished)" in text
    assert "the workflow's state does not allow it, or no lifecycle worker applied it" in text
    assert "2 error: bad arguments" in text
    assert "never started" not in text  # was: "1 workflow failed, terminated or never started"


def test_a_redis_url_without_scheme_names_the_settings_the_cli_has(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("REDIS_URL", "bogus")
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'bogus' from REDIS_URL has no scheme" in err
    assert "redis://HOST:6379/0" in err and "set REDIS_HOST instead" in err
