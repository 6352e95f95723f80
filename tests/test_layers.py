"""The packages' arrows point one way, modules import no cycle, and the event kinds are
spelled in one module.

flowlang <- lifecycle <- workers, rqse <- lifecycle; flowstream (composition) may
import lifecycle and workers, and nothing below it may import flowstream. Imports
are read from the source (ast), so a lazy import inside a function counts as
much as one at the top: it is the same dependency, paid later.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flowlang", "rqse", "lifecycle", "workers", "flowstream")
KIND_SCANNED = (*PACKAGES, "bench", "examples")
EVENTS_MODULE = "lifecycle.events"
EVENT_KINDS = (
    "start-task",
    "end-task",
    "start-workflow",
    "terminate-workflow",
    "end-workflow",
    "failed-workflow",
    "retry-task",
    "timeout-task",
)
# The one module below flowstream allowed to import it: `python -m lifecycle` runs the
# program the composition package assembles.
COMPOSED_ENTRY = "lifecycle.__main__"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the module (or package) imported
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files(top: str) -> list[Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if ".venv" not in p.parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for top in PACKAGES for p in source_files(top)}


MODULES = all_modules()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports_of(module: str, path: Path) -> Iterator[Import]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module, alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node)
            for alias in node.names:
                # `from pkg import sub` imports the submodule when there is one.
                candidate = f"{source}.{alias.name}"
                yield Import(module, candidate if candidate in MODULES else source, node.lineno)


def top(name: str) -> str:
    return name.split(".", 1)[0]


ALL_IMPORTS = [i for module, path in MODULES.items() for i in imports_of(module, path)]


def offenders(packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        f"{MODULES[i.module].relative_to(ROOT)}:{i.line}: imports {i.target}"
        for i in ALL_IMPORTS
        if top(i.module) in packages
        and top(i.target) in forbidden
        and not (i.module == COMPOSED_ENTRY and top(i.target) == "flowstream")
    ]


def test_the_engine_and_below_import_no_task_worker_nor_the_composition() -> None:
    assert offenders(("flowlang", "rqse", "lifecycle"), ("workers", "flowstream")) == []


def test_only_the_composition_imports_flowstream() -> None:
    assert offenders(("flowlang", "rqse", "lifecycle", "workers"), ("flowstream",)) == []


def test_flowlang_imports_neither_rqse_nor_lifecycle() -> None:
    assert offenders(("flowlang",), ("rqse", "lifecycle", "workers")) == []


def test_rqse_imports_neither_flowlang_nor_lifecycle() -> None:
    assert offenders(("rqse",), ("flowlang", "lifecycle", "workers")) == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or with a self-edge
    (Tarjan's algorithm, iterative: no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def test_modules_import_no_cycle() -> None:
    graph: dict[str, set[str]] = {module: set() for module in MODULES}
    for item in ALL_IMPORTS:
        if item.target in MODULES and item.target != item.module:
            graph[item.module].add(item.target)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def kind_literals() -> list[str]:
    """file:line of every str or bytes literal that is an event kind (or its JSON
    encoding, as it appears in a raw stream field), outside lifecycle/events.py."""
    spelled = set(EVENT_KINDS) | {f'"{k}"' for k in EVENT_KINDS}
    found = []
    for package in KIND_SCANNED:
        for path in source_files(package):
            if module_name(path) == EVENTS_MODULE:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                    text = node.value.decode() if isinstance(node.value, bytes) else node.value
                    if text in spelled:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {text}")
    return found


def test_the_engine_and_the_composition_spell_event_kinds_only_in_lifecycle_events() -> None:
    mine = ("flowlang/", "rqse/", "lifecycle/", "flowstream/")
    assert [f for f in kind_literals() if f.startswith(mine)] == []


def test_event_kinds_are_spelled_only_in_lifecycle_events() -> None:
    assert kind_literals() == []
