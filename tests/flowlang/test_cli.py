"""The ``flowlang`` command line and the Mermaid/DOT drawings it prints.

The CLI runs in-process through ``main([...])``; one test runs ``python -m
flowlang`` for real. The drawing checks are structural (every line has one of
the shapes the renderer may emit, quotes and clusters balance, every node and
edge is there) and live in ``render_checks``, which ``test_fuzz`` shares.
"""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from flowlang.cli import EXIT_INVALID, EXIT_OK, EXIT_UNREADABLE, main
from flowlang.compiler import compile_text
from flowlang.graph import Graph
from flowlang.render import to_dot, to_mermaid
from tests.flowlang.render_checks import assert_valid_dot, assert_valid_mermaid

# Everything the drawings must cope with: subflows (nested, iterated, guarded,
# an inlined @task), a fan, sources and sinks, odd names, quotes in URIs,
# backslashes, `#`, `%%{`, HTML in parameters and a guard spanning two lines.
ODD_FLOW = r"""
@task peel { my:peel-banana → wait:delay (- seconds: 3 -) }
@flow demo (- start: 1 -)
<data.json> → A_1 :x → * {
  B-2 → ? `$[?(@.s="0")]` my:peel-banana ({"q": "a\"b\\", "t": "<b>#1</b>"}) ; C|D
} → > E → <http://h/x?a="b"&c=%%{init:{}}%%>(- method: PUT -)
:x → peel → > :end
<{"k": [1, "end"]}> → ? `$.k
  [0]` { { F:end } } → G
<> → H
"""

GOOD_FLOW = "A → B → C\n"
BAD_FLOW = "A → B\n  → → C\n"


@pytest.fixture
def flows(tmp_path: Path) -> Path:
    (tmp_path / "good.flow").write_text(GOOD_FLOW, encoding="utf-8")
    (tmp_path / "bad.flow").write_text(BAD_FLOW, encoding="utf-8")
    (tmp_path / "odd.flow").write_text(ODD_FLOW, encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- check -------------------------------------------------------------------------


def test_check_of_flows_that_compile_exits_zero_silently(flows: Path, capsys) -> None:
    files = [str(flows / "good.flow"), str(flows / "odd.flow")]
    assert run(capsys, "check", *files) == (EXIT_OK, "", "")


def test_check_prints_one_file_line_column_message_per_failing_file(flows: Path, capsys) -> None:
    (flows / "bad2.flow").write_text("A :x → B → C :x → D\n", encoding="utf-8")
    bad, bad2 = flows / "bad.flow", flows / "bad2.flow"
    code, out, err = run(capsys, "check", str(bad), str(flows / "good.flow"), str(bad2))
    assert (code, out) == (EXIT_INVALID, "")
    assert err.splitlines() == [
        f"{bad}:2:5: stray arrow: expected a step before it",
        f"{bad2}:1:14: output label ':x' defined twice (first at 1:3)",
    ]


def test_check_of_a_missing_file_is_one_line_and_exit_two(flows: Path, capsys) -> None:
    missing = flows / "missing.flow"
    code, out, err = run(capsys, "check", str(flows / "bad.flow"), str(missing))
    assert code == EXIT_UNREADABLE
    assert err.splitlines()[1] == f"{missing}: cannot read: No such file or directory"


def test_a_directory_is_unreadable_not_a_traceback(flows: Path, capsys) -> None:
    assert run(capsys, "check", str(flows)) == (
        EXIT_UNREADABLE,
        "",
        f"{flows}: cannot read: Is a directory\n",
    )


def test_a_file_that_is_not_utf8_is_reported_with_the_offset(flows: Path, capsys) -> None:
    latin = flows / "latin.flow"
    latin.write_bytes(b"A \xe9 B\n")
    code, _, err = run(capsys, "check", str(latin))
    assert (code, err) == (EXIT_UNREADABLE, f"{latin}: not UTF-8 text (byte 0xe9 at offset 2)\n")


def test_a_utf8_byte_order_mark_is_skipped(flows: Path, capsys) -> None:
    bom = flows / "bom.flow"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD_FLOW.encode())
    assert run(capsys, "check", str(bom)) == (EXIT_OK, "", "")
    bom.write_bytes(b"\xef\xbb\xbfA \xff B\n")
    assert run(capsys, "check", str(bom))[2] == f"{bom}: not UTF-8 text (byte 0xff at offset 5)\n"


def test_dash_reads_standard_input_and_names_it_in_errors(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(BAD_FLOW.encode())))
    assert run(capsys, "check", "-") == (
        EXIT_INVALID,
        "",
        "<stdin>:2:5: stray arrow: expected a step before it\n",
    )


def test_nesting_deeper_than_the_recursion_limit_is_an_error_line_not_a_traceback(
    flows: Path, capsys
) -> None:
    # Today the parser's recursive Lark transformer gives up at about 160 levels;
    # whatever it does, the CLI answers with one line and never a traceback.
    deep = flows / "deep.flow"
    depth = sys.getrecursionlimit()
    deep.write_text("A → " + "{ B → " * depth + "C" + " }" * depth, encoding="utf-8")
    code, _, err = run(capsys, "check", str(deep))
    if code == EXIT_OK:
        assert err == ""
    else:
        assert code == EXIT_INVALID
        assert err.startswith(f"{deep}:") and err.count("\n") == 1


def test_usage_errors_exit_two(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["graph", "x.flow", "--format", "svg"])
    assert exited.value.code == EXIT_UNREADABLE
    assert "invalid choice: 'svg'" in capsys.readouterr().err


def test_help_documents_the_exit_codes_and_gives_examples(capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "flowlang check" in out and "--format mermaid" in out
    for code in (EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE):
        assert re.search(rf"^  {code}  \S", out, re.MULTILINE)


# -- graph and hash ----------------------------------------------------------------


def test_graph_json_is_the_interchange_shape(flows: Path, capsys) -> None:
    code, out, err = run(capsys, "graph", str(flows / "odd.flow"), "--format", "json")
    assert (code, err) == (EXIT_OK, "")
    data = orjson.loads(out)
    graph = compile_text(ODD_FLOW)
    assert data == orjson.loads(orjson.dumps(graph.interchange()))
    assert set(data) == {"nodes", "edges"}
    assert all(
        set(node) == {"id", "kind", "name", "params", "merge", "guard", "iterate"}
        for node in data["nodes"]
    )
    assert all(len(edge) == 2 for edge in data["edges"])


def test_graph_defaults_to_json(flows: Path, capsys) -> None:
    _, default, _ = run(capsys, "graph", str(flows / "good.flow"))
    _, json, _ = run(capsys, "graph", str(flows / "good.flow"), "--format", "json")
    assert default == json


def test_hash_is_the_sha256_of_the_full_format(flows: Path, capsys) -> None:
    _, full, _ = run(capsys, "graph", str(flows / "odd.flow"), "--format", "full")
    code, digest, _ = run(capsys, "hash", str(flows / "odd.flow"))
    assert code == EXIT_OK
    assert digest == hashlib.sha256(full.rstrip("\n").encode()).hexdigest() + "\n"
    assert digest.strip() == compile_text(ODD_FLOW).content_hash()


def test_graph_of_a_failing_file_prints_only_the_error(flows: Path, capsys) -> None:
    code, out, err = run(capsys, "graph", str(flows / "bad.flow"), "--format", "dot")
    assert (code, out) == (EXIT_INVALID, "")
    assert err.startswith(f"{flows / 'bad.flow'}:2:5: ")


def test_graph_mermaid_draws_every_node_edge_and_subflow(flows: Path, capsys) -> None:
    code, out, _ = run(capsys, "graph", str(flows / "odd.flow"), "--format", "mermaid")
    assert code == EXIT_OK
    assert_valid_mermaid(out, compile_text(ODD_FLOW))


def test_graph_dot_draws_every_node_edge_and_subflow(flows: Path, capsys) -> None:
    code, out, _ = run(capsys, "graph", str(flows / "odd.flow"), "--format", "dot")
    assert code == EXIT_OK
    assert_valid_dot(out, compile_text(ODD_FLOW))


# -- what the drawings show ---------------------------------------------------------


def test_drawings_show_names_guards_iteration_merge_and_shapes() -> None:
    graph = compile_text(ODD_FLOW)
    mermaid, dot = to_mermaid(graph), to_dot(graph)
    for text in (
        "my:peel-banana",
        "wait:delay",
        "F:end",
        "? $[?(@.s=#quot;0#quot;)]",
        "* {",
        "#gt; E",
        "#gt; end",
        "#lt;data.json#gt;",
        "#37;#37;{init:{}}#37;#37;",
        "#lt;b#gt;#35;1#lt;/b#gt;",
    ):
        assert text in mermaid
    assert 'subgraph c13 ["peel"]' in mermaid
    assert '(("start"))' in mermaid and '((("#gt; end")))' in mermaid
    assert '[/"#lt;data.json#gt;"/]' in mermaid and '[("#lt;http://h/x?a=#quot;b#quot;' in mermaid
    for text in (
        r'label="my:peel-banana\n? $[?(@.s=\"0\")]\n{\"q\":\"a\\\"b\\\\\",',
        'label="* {"',
        'label="> E"',
        'shape=parallelogram, label="<data.json>"',
        r'shape=cylinder, label="<http://h/x?a=\"b\"&c=%%{init:{}}%%>\n{\"method\":\"PUT\"}"',
        'shape=circle, label="start"',
        'shape=doublecircle, label="> end"',
        r'label="{\n? $.k   [0]"',
        'label="<{}>"',
    ):
        assert text in dot


def test_subflow_clusters_hold_their_start_end_and_inner_nodes() -> None:
    graph = compile_text("A → { B → { C } D } → E")
    assert to_dot(graph).splitlines()[4:17] == [
        "  subgraph cluster_c2 {",
        '    label="";',
        '    n2 [shape=circle, label="{"];',
        '    n3 [shape=box, style="rounded", label="B"];',
        "    subgraph cluster_c4 {",
        '      label="";',
        '      n4 [shape=circle, label="{"];',
        '      n5 [shape=box, style="rounded", label="C"];',
        '      n6 [shape=circle, label="}"];',
        "    }",
        '    n7 [shape=box, style="rounded", label="D"];',
        '    n8 [shape=circle, label="}"];',
        "  }",
    ]


def test_a_node_with_a_broken_parent_is_still_drawn() -> None:
    graph = Graph.from_dict(
        {
            "nodes": [
                {"id": 0, "kind": "start"},
                {"id": 1, "kind": "task", "name": "A", "parent": 7},
                {"id": 2, "kind": "end"},
            ],
            "edges": [[0, 1], [1, 2]],
        }
    )
    assert_valid_mermaid(to_mermaid(graph), graph)
    assert_valid_dot(to_dot(graph), graph)


# -- the module entry point -----------------------------------------------------------


def test_python_dash_m_flowlang_runs_the_same_main(flows: Path) -> None:
    files = [str(flows / "good.flow"), str(flows / "bad.flow")]
    result = subprocess.run(
        [sys.executable, "-m", "flowlang", "check", *files],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == EXIT_INVALID
    assert result.stdout == ""
    assert result.stderr == f"{flows / 'bad.flow'}:2:5: stray arrow: expected a step before it\n"
