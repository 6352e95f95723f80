"""Reserved `$` parameters: checked by the compiler with positions, applied by the engine."""

from __future__ import annotations

import pytest

from flowlang.cli import EXIT_INVALID, main
from flowlang.compiler import compile_text
from flowlang.errors import FlowPolicyError
from flowlang.policy import NO_POLICY, Policy, split_params


@pytest.mark.parametrize(
    ("flow", "line", "column", "message"),
    [
        (
            "A → fetch (- {url: x, $retrys: 3} -)",
            1,
            11,
            "unknown reserved parameter '$retrys' (expected one of $retries, $backoff, "
            "$timeout); did you mean '$retries'?",
        ),
        ("@task fetch (- $timeout: -1 -)\nA → fetch", 1, 13, "$timeout must be a non-negative"),
        ("@task unused (- $x: 1 -)\nA", 1, 14, "unknown reserved parameter '$x'"),
        ("A → <http://h/x>(- $foo: 1 -)", 1, 17, "unknown reserved parameter '$foo'"),
        ("<s3://b/k>(- $retries: yes -) → A", 1, 11, "$retries must be a non-negative"),
        ("A → { B (- $backof: 1 -) }", 1, 9, "did you mean '$backoff'?"),
    ],
)
def test_a_bad_reserved_parameter_is_a_compile_error_at_its_literal(
    flow: str, line: int, column: int, message: str
) -> None:
    with pytest.raises(FlowPolicyError) as caught:
        compile_text(flow, "p.flow")
    assert (caught.value.line, caught.value.column) == (line, column)
    assert str(caught.value).startswith(f"p.flow:{line}:{column}: ")
    assert message in str(caught.value)


def test_flowlang_check_reports_an_unknown_reserved_parameter_in_one_line(tmp_path, capsys) -> None:
    path = tmp_path / "typo.flow"
    path.write_text("A\n  → fetch (- $retrys: 3 -)\n", encoding="utf-8")
    assert main(["check", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:2:11: unknown reserved parameter '$retrys'")
    assert err.count("\n") == 1


def test_a_literal_source_may_hold_dollar_keys_it_is_data_not_parameters() -> None:
    graph = compile_text('<{"$retrys": 1}> → A')
    assert graph.nodes[1].params == {"$retrys": 1}


def test_split_params_strips_the_policy_from_what_the_task_sees() -> None:
    params, policy = split_params({"url": "x", "$retries": 2, "$backoff": 0.5, "$timeout": 3})
    assert params == {"url": "x"}
    assert policy == Policy(retries=2, backoff=0.5, timeout=3.0)
    assert split_params([1, 2]) == ([1, 2], NO_POLICY)
