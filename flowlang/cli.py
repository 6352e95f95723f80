"""The ``flowlang`` command: check flow files, print their graph or its hash.

``python -m flowlang`` and the ``flowlang`` script both call :func:`main`.
Errors are one line each on stderr (``FILE:LINE:COL: message`` for a flow
that does not compile), never a traceback.
"""

from __future__ import annotations

import argparse
import codecs
import os
import sys
from collections.abc import Callable

import orjson

from flowlang.compiler import compile_text
from flowlang.errors import FlowError
from flowlang.graph import Graph
from flowlang.limits import DEFAULT_LIMITS
from flowlang.render import to_dot, to_mermaid

__all__ = ["EXIT_INTERNAL", "EXIT_INVALID", "EXIT_OK", "EXIT_UNREADABLE", "main"]

EXIT_OK = 0
EXIT_INVALID = 1  # a flow does not compile
EXIT_UNREADABLE = 2  # a file is missing, unreadable or not UTF-8; also a usage error (argparse)
EXIT_INTERNAL = 3  # a bug in flowlang: please report the printed line

STDIN = "-"
# A file past the flow size limit is refused without reading it all (BOM and one byte more).
_READ_AT_MOST = DEFAULT_LIMITS.flow_bytes + len(codecs.BOM_UTF8) + 1
STDIN_NAME = "<stdin>"

_FORMATS: dict[str, Callable[[Graph], str]] = {
    "json": lambda graph: orjson.dumps(graph.interchange(), option=orjson.OPT_INDENT_2).decode(),
    "full": lambda graph: graph.to_json().decode(),
    "mermaid": lambda graph: to_mermaid(graph).rstrip("\n"),
    "dot": lambda graph: to_dot(graph).rstrip("\n"),
}

_EPILOG = f"""\
examples:
  flowlang check flows/*.flow
  flowlang graph pipeline.flow --format mermaid > pipeline.mmd
  cat pipeline.flow | flowlang hash -

formats of `graph`:
  json     nodes (id, kind, name, params, merge, guard, iterate) and edges, indented
  full     the canonical graph (positions, subflow links, docs) as compact JSON;
           `hash` is the sha256 of exactly these bytes
  mermaid  a Mermaid flowchart, one subgraph per subflow
  dot      a Graphviz digraph, one cluster per subflow

exit codes:
  {EXIT_OK}  success
  {EXIT_INVALID}  a flow does not compile (FILE:LINE:COL: message on stderr)
  {EXIT_UNREADABLE}  a file is missing, unreadable or not UTF-8, or the command line is wrong
  {EXIT_INTERNAL}  internal error in flowlang (a bug: please report the line printed)

FILE may be `-` for standard input; files are read as UTF-8.
"""


class _Failure(Exception):
    """A file that could not be read or compiled: the line to print and the exit code."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.line = line
        self.code = code


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); return the exit code."""
    args = _parser().parse_args(argv)
    if args.command == "check":
        code = EXIT_OK
        for file in args.files:
            try:
                _compile(file)
            except _Failure as failure:
                print(failure.line, file=sys.stderr)
                code = max(code, failure.code)
        return code
    try:
        graph = _compile(args.file)
    except _Failure as failure:
        print(failure.line, file=sys.stderr)
        return failure.code
    text = graph.content_hash() if args.command == "hash" else _FORMATS[args.format](graph)
    try:
        _write(text + "\n")
    except BrokenPipeError:
        # The reader went away (`| head`): not an error of ours. Point stdout at
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_OK


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowlang",
        description="Check flow files and print their compiled graph.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser("check", help="compile each FILE; report every error")
    check.add_argument("files", nargs="+", metavar="FILE")
    graph = commands.add_parser("graph", help="print the compiled graph of FILE")
    graph.add_argument("file", metavar="FILE")
    graph.add_argument("--format", "-f", choices=list(_FORMATS), default="json")
    hash_ = commands.add_parser("hash", help="print the sha256 of the compiled graph of FILE")
    hash_.add_argument("file", metavar="FILE")
    return parser


def _compile(file: str) -> Graph:
    name = STDIN_NAME if file == STDIN else file
    text = _read(file, name)
    try:
        return compile_text(text, name)
    except FlowError as error:
        raise _Failure(_one_line(str(error)), EXIT_INVALID) from None
    except RecursionError:
        raise _Failure(_too_deep(name), EXIT_INVALID) from None
    except Exception as error:
        # Lark wraps errors raised inside its transformer (a RecursionError included).
        if isinstance(getattr(error, "orig_exc", None), RecursionError):
            raise _Failure(_too_deep(name), EXIT_INVALID) from None
        line = f"{name}: internal error: {type(error).__name__}: {error}"
        raise _Failure(_one_line(line), EXIT_INTERNAL) from None


def _read(file: str, name: str) -> str:
    try:
        data = _read_stdin() if file == STDIN else _read_bytes(file)
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise _Failure(f"{name}: cannot read: {reason}", EXIT_UNREADABLE) from None
    bom = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0  # not part of the flow
    if len(data) - bom > DEFAULT_LIMITS.flow_bytes:
        line = (
            f"{name}: the flow text is more than the limit of {DEFAULT_LIMITS.flow_bytes:,} bytes"
        )
        raise _Failure(line, EXIT_INVALID)
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as error:
        byte, offset = error.object[error.start], bom + error.start
        line = f"{name}: not UTF-8 text (byte 0x{byte:02x} at offset {offset})"
        raise _Failure(line, EXIT_UNREADABLE) from None


def _read_stdin() -> bytes:
    if sys.stdin is None:
        raise OSError(0, "no standard input")
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(_READ_AT_MOST)
        return data
    return sys.stdin.read(_READ_AT_MOST).encode("utf-8")


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read(_READ_AT_MOST)


def _too_deep(name: str) -> str:
    return (
        f"{name}: subflows nested too deeply to compile "
        f"(Python recursion limit {sys.getrecursionlimit()})"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split("\n"))


def _write(text: str) -> None:
    """Write UTF-8 whatever the terminal's encoding (URIs and parameters may be non-ASCII)."""
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
        return
    sys.stdout.flush()
    buffer.write(text.encode("utf-8"))
    buffer.flush()
