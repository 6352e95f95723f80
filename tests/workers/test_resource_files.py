"""Local file resources: one explicit root, nothing outside it, no symlinks followed by sinks,
no code or hidden files written, decoding within the flow limits."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
import yaml

from flowlang.limits import Limits
from workers.errors import ResourceError
from workers.resource_files import default_base_dir
from workers.resources import Resources, ResourceWorker, load_resource, store_resource


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    base.mkdir()
    return base


def test_json_and_yaml_files_load_and_store_under_the_root(root: Path) -> None:
    (root / "in.json").write_text('{"a": [1, 2]}')
    (root / "in.yml").write_text("a: [1, 2]\nwhen: 2024-05-01\n1: one\n")
    assert load_resource("in.json", {}, root) == {"a": [1, 2]}
    assert load_resource("file:in.yml", {}, root) == {"a": [1, 2], "when": "2024-05-01", "1": "one"}
    store_resource("out/deep/result.yaml", {"b": "é"}, {}, root)
    assert yaml.safe_load((root / "out/deep/result.yaml").read_text()) == {"b": "é"}
    store_resource("plain.txt", [1], {"format": "json"}, root)
    assert orjson.loads((root / "plain.txt").read_bytes()) == [1]
    leftovers = [p.name for p in root.rglob(".*")]
    assert leftovers == []  # the temporary files were renamed, none left behind


def test_an_absolute_path_inside_the_root_is_the_same_file(root: Path) -> None:
    (root / "in.json").write_text("[7]")
    assert load_resource(str(root / "in.json"), {}, root) == [7]
    assert load_resource(f"file://{root}/in.json", {}, root) == [7]


@pytest.mark.parametrize(
    ("uri", "why"),
    [
        ("../escape.json", "'..' is not allowed"),
        ("a/../../x.json", "'..' is not allowed"),
        ("a/../in.json", "'..' is not allowed"),  # even when it would land inside
        ("/etc/passwd", "absolute path outside the base directory"),
        ("file:///etc/passwd", "absolute path outside the base directory"),
        ("file://other-host/x.json", "file URI names host 'other-host'"),
        ("ftp://host/x.json", "unsupported URI scheme 'ftp'"),
        ("", "names the base directory itself"),
    ],
)
def test_paths_that_leave_the_root_are_refused_for_sources_and_sinks(
    root: Path, uri: str, why: str
) -> None:
    with pytest.raises(ResourceError, match=why):
        load_resource(uri, {}, root)
    with pytest.raises(ResourceError, match=why):
        store_resource(uri, [1], {}, root)


def test_a_source_follows_symlinks_inside_the_root_but_not_out_of_it(
    root: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.json").write_text('{"secret": 1}')
    (root / "data").mkdir()
    (root / "data" / "real.json").write_text("[1]")
    (root / "inside.json").symlink_to(root / "data" / "real.json")
    (root / "alias").symlink_to(root / "data")
    (root / "out.json").symlink_to(tmp_path / "secret.json")
    (root / "outdir").symlink_to(tmp_path)
    assert load_resource("inside.json", {}, root) == [1]
    assert load_resource("alias/real.json", {}, root) == [1]
    for uri in ("out.json", "outdir/secret.json"):
        with pytest.raises(ResourceError, match="outside the base directory"):
            load_resource(uri, {}, root)


def test_a_sink_never_writes_through_or_over_a_symlink(root: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.json").write_text("untouched")
    (root / "inside").mkdir()
    (root / "escape").symlink_to(outside)
    (root / "hop").symlink_to(root / "inside")
    (root / "victim.json").symlink_to(outside / "victim.json")
    with pytest.raises(ResourceError, match="'escape' is a symlink"):
        store_resource("escape/victim.json", [1], {}, root)
    with pytest.raises(ResourceError, match="'hop' is a symlink"):
        store_resource("hop/x.json", [1], {}, root)
    with pytest.raises(ResourceError, match="is a symlink; not replaced"):
        store_resource("victim.json", [1], {}, root)
    assert (outside / "victim.json").read_text() == "untouched"
    assert (root / "victim.json").is_symlink()
    assert list((root / "inside").iterdir()) == [] and list(outside.iterdir()) == [
        outside / "victim.json"
    ]


@pytest.mark.parametrize(
    "uri",
    [
        "plugin.py",
        "cache/mod.PYC",
        "site.pth",
        "lib/evil.so",
        "lib/evil.so.1.2",
        "win.dll",
        "mac.dylib",
        "run.sh",
        ".bashrc",
        ".config/app.json",
        "data/.hidden/x.json",
    ],
)
def test_sinks_refuse_code_and_hidden_files(root: Path, uri: str) -> None:
    with pytest.raises(ResourceError, match=r"refused: (code file|hidden name)"):
        store_resource(uri, {"x": 1}, {"format": "json"}, root)
    assert list(root.iterdir()) == []


def test_a_source_that_is_not_a_regular_file_is_refused_without_blocking(root: Path) -> None:
    os.mkfifo(root / "pipe.json")
    (root / "dir.json").mkdir()
    with pytest.raises(ResourceError, match="is not a regular file"):
        load_resource("pipe.json", {}, root)
    with pytest.raises(ResourceError, match="is not a regular file"):
        load_resource("dir.json", {}, root)


def test_a_missing_file_names_the_path(root: Path) -> None:
    with pytest.raises(ResourceError, match=r"nothing\.json: cannot read .*No such file"):
        load_resource("nothing.json", {}, root)


def test_a_file_over_the_value_limit_is_refused_before_it_is_read(root: Path) -> None:
    (root / "big.json").write_bytes(b"[" + b"1," * 600 + b"1]")
    small = Resources.configure(root, limits=Limits(value_bytes=1000))
    with pytest.raises(
        ResourceError, match=r"big\.json: 1,203 bytes, more than the limit of 1,000"
    ):
        small.load("big.json")


def test_yaml_alias_bombs_and_python_tags_are_refused(root: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    (root / "bomb.yaml").write_text(bomb)
    (root / "evil.yaml").write_text("!!python/object/apply:os.system ['true']\n")
    with pytest.raises(ResourceError, match=r"bomb\.yaml: not valid YAML: .*alias"):
        load_resource("bomb.yaml", {}, root)
    with pytest.raises(ResourceError, match=r"evil\.yaml: not valid YAML at line 1"):
        load_resource("evil.yaml", {}, root)


def test_json_too_deep_or_invalid_is_one_line(root: Path) -> None:
    (root / "deep.json").write_text("[" * 300 + "]" * 300)
    (root / "bad.json").write_text("{oops")
    with pytest.raises(ResourceError, match=r"^deep\.json nests deeper than 256 levels$"):
        load_resource("deep.json", {}, root)
    with pytest.raises(ResourceError, match=r"^bad\.json is not JSON: "):
        load_resource("bad.json", {}, root)


def test_the_default_root_is_under_xdg_data_home_never_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    (cwd / "here.json").write_text("[1]")
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    expected = tmp_path / "data" / "flowstream" / "resources"
    assert default_base_dir() == expected
    assert Resources.configure().base_dir == expected
    with pytest.raises(ResourceError, match="cannot read"):
        load_resource("here.json")
    store_resource("made.json", [2])
    assert orjson.loads((expected / "made.json").read_bytes()) == [2]
    assert not (cwd / "made.json").exists()


def test_without_xdg_data_home_or_with_a_relative_one_the_root_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    expected = tmp_path / ".local" / "share" / "flowstream" / "resources"
    assert default_base_dir() == expected
    monkeypatch.setenv("XDG_DATA_HOME", "relative/data")
    assert default_base_dir() == expected


def test_the_worker_takes_its_root_from_base_dir_or_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_url: str
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    default = ResourceWorker(url=redis_url, handle_signals=False)
    given = ResourceWorker(url=redis_url, handle_signals=False, base_dir=tmp_path / "x" / "..")
    assert default.base_dir == tmp_path / "data" / "flowstream" / "resources"
    assert given.base_dir == tmp_path
