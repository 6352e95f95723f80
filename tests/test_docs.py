"""The documentation stands alone: no path outside the repository, no broken
link, no history of how the code was written."""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE_PACKAGES = ("flowlang", "rqse", "lifecycle", "workers")

# [text](target) — the target up to a space or ')'; images and titles alike.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# A path leaving the repository: ../shared, or any ../ chain (checked below
# against the file's depth), written in text or code spans.
PARENT_PATH = re.compile(r"(?<![\w.])((?:\.\./)+)([\w.-]*)")
# History of how the code was written: "session 4", "sessions 1-3",
# "issue 5", "issue #5". "session" in its other senses (fastpipe's
# session(), a Redis session) is not followed by a number.
HISTORY = re.compile(r"\bsessions?\s+\d|\bissue\s+#?\d", re.IGNORECASE)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def outside_repository(md: Path, ups: str) -> bool:
    """A ``../`` chain in *md* climbs above the repository root."""
    depth = len(md.relative_to(ROOT).parts) - 1
    return ups.count("../") > depth


def links(md: Path) -> Iterator[tuple[int, str]]:
    in_code = False
    for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        for match in LINK.finditer(line):
            yield number, match.group(1)


def python_comments_and_docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """Comments and string literals (docstrings among them) of one file."""
    source = path.read_text(encoding="utf-8")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            for offset, line in enumerate(token.string.splitlines()):
                yield token.start[0] + offset, line


def test_no_markdown_file_points_outside_the_repository() -> None:
    offenders = [
        f"{relative(md)}:{number}: {match.group(0)}"
        for md in DOCS
        for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1)
        for match in PARENT_PATH.finditer(line)
        if "shared" in match.group(2) or outside_repository(md, match.group(1))
    ]
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


def test_every_relative_markdown_link_resolves_to_a_file() -> None:
    broken = []
    for md in DOCS:
        for number, target in links(md):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL or an anchor in the same page
            path = (md.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(ROOT) or not path.exists():
                broken.append(f"{relative(md)}:{number}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_and_ignores_code_blocks(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text("[a](one.md) and [b](two.md#part)\n```\n[c](three.md)\n```\n", encoding="utf-8")
    assert [target for _, target in links(md)] == ["one.md", "two.md#part"]


def test_no_doc_mentions_sessions_or_issue_numbers() -> None:
    offenders = [
        f"{relative(md)}:{number}: {line.strip()}"
        for md in DOCS
        for number, line in enumerate(md.read_text(encoding="utf-8").splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not offenders, "history in the docs:\n" + "\n".join(offenders)


def test_no_code_comment_mentions_sessions_or_issue_numbers() -> None:
    offenders = [
        f"{relative(path)}:{number}: {line.strip()}"
        for package in CODE_PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        for number, line in python_comments_and_docstrings(path)
        if HISTORY.search(line)
    ]
    assert not offenders, "history in code comments:\n" + "\n".join(offenders)


@pytest.mark.parametrize(
    ("text", "history"),
    [
        ("measured in session 4", True),
        ("Sessions 1-3 found", True),
        ("fixed for issue #5", True),
        ("Issue 3 targets", True),
        ("fastpipe.session() reuses the connection", False),
        ("a session with Redis", False),
        ("an issue with 3 workers", False),
    ],
)
def test_history_pattern_matches_numbered_sessions_and_issues_only(
    text: str, history: bool
) -> None:
    assert bool(HISTORY.search(text)) is history
