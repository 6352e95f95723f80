"""AST → :class:`flowlang.graph.Graph`.

Each scope (the flow, and every subflow) has its own start and end node and
its own labels. A label is a junction: what flows into it (an output label
``A :x`` or a statement ending ``→ :x``) reaches everything that reads from it
(an input label ``:x B`` or a statement starting ``:x →``); the junction
itself becomes plain edges. Declarations are applied here: default parameters
merged into each invocation, aliases resolved, bodies inlined in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flowlang import ast
from flowlang.errors import (
    FlowDeclarationError,
    FlowError,
    FlowLabelError,
    FlowPolicyError,
    FlowStructureError,
)
from flowlang.graph import Graph, Node, NodeKind
from flowlang.limits import DEFAULT_LIMITS, LimitExceeded, Limits
from flowlang.loops import check_loops
from flowlang.parser import parse
from flowlang.policy import split_params

__all__ = ["compile_flow", "compile_text", "merge_params"]


def compile_text(text: str, file: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """Parse and compile flow text; every error is a :class:`FlowError` naming ``file``
    (:class:`~flowlang.limits.LimitExceeded` for a text past ``limits.flow_bytes``)."""
    return compile_flow(parse(text, file, limits), file, limits)


def compile_flow(flow: ast.Flow, file: str | None = None, limits: Limits = DEFAULT_LIMITS) -> Graph:
    """The graph of a parsed flow; :class:`~flowlang.limits.LimitExceeded` when it
    would have more than ``limits.nodes`` nodes (found as they are made)."""
    try:
        graph = _Compiler(flow, limits.nodes).build()
        check_loops(graph)
        return graph
    except FlowError as error:
        raise error.located(file) from None
    except RecursionError:
        raise FlowStructureError(
            "subflows are nested too deeply for this Python's recursion limit", 1, 1
        ).located(file) from None


def merge_params(default: Any, invocation: Any, where: ast.Pos, declared_at: ast.Pos) -> Any:
    """Declaration defaults merged with an invocation's parameters (invocation keys win).

    Objects merge key by key; an array replaces an array; an empty literal keeps
    the defaults; an object against an array is an error.
    """
    if default is None:
        return invocation
    if invocation is None or invocation == {}:
        return default
    if isinstance(default, dict) and isinstance(invocation, dict):
        return {**default, **invocation}
    if isinstance(default, list) and isinstance(invocation, list):
        return invocation
    raise FlowDeclarationError(
        f"parameters are {_json_type(invocation)} but the declaration at {declared_at} "
        f"gives {_json_type(default)}",
        where.line,
        where.column,
    )


def _check_policy(literal: ast.Literal | None) -> None:
    """The `$` parameters of a task's, source's or sink's literal (flowlang.policy),
    an error placed at the literal."""
    if literal is None:
        return
    try:
        split_params(literal.value)
    except FlowPolicyError as error:
        raise FlowPolicyError(error.message, literal.pos.line, literal.pos.column) from None


def _json_type(value: Any) -> str:
    return "an object" if isinstance(value, dict) else "an array"


@dataclass
class _Junction:
    producers: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    merge_consumers: bool = False
    output_at: ast.Pos | None = None  # where `STEP :x` defines it
    input_at: ast.Pos | None = None  # where `:x STEP` defines it
    first_use: ast.Pos | None = None


class _Scope:
    def __init__(self, start: int) -> None:
        self.start = start
        self.to_end: list[int] = []
        self.to_start: list[int] = []
        self.end_merge = False
        self.labels: dict[str, _Junction] = {}

    def junction(self, label: ast.Label) -> _Junction:
        found = self.labels.get(label.name)
        if found is None:
            found = self.labels[label.name] = _Junction(first_use=label.pos)
        return found


class _Compiler:
    def __init__(self, flow: ast.Flow, max_nodes: int) -> None:
        self.flow = flow
        self.max_nodes = max_nodes
        self.nodes: list[Node] = []
        self.edges: dict[tuple[int, int], None] = {}  # insertion-ordered set
        self.expanding: list[str] = []  # @task bodies being inlined, to catch recursion

    def build(self) -> Graph:
        for task in self.flow.tasks.values():
            _check_policy(task.params)
        start = self._node(NodeKind.START, ast.Pos(1, 1), parent=None)
        self._scope(self.flow.statements, start, NodeKind.END, parent=None, end_parent=None)
        declaration = self.flow.flow
        return Graph(
            nodes=self.nodes,
            edges=list(self.edges),
            name=declaration.name if declaration else None,
            params=declaration.params.value if declaration and declaration.params else None,
            doc=declaration.doc if declaration else None,
        )

    # -- nodes and edges ---------------------------------------------------------

    def _node(self, kind: NodeKind, pos: ast.Pos, parent: int | None, **fields: Any) -> int:
        if len(self.nodes) >= self.max_nodes:
            raise self._too_many_nodes(pos)
        node = Node(
            len(self.nodes), kind, line=pos.line, column=pos.column, parent=parent, **fields
        )
        self.nodes.append(node)
        return node.id

    def _too_many_nodes(self, pos: ast.Pos) -> LimitExceeded:
        copies = f" (each use of an @task body is a copy: {' → '.join(self.expanding)})"
        return LimitExceeded(
            f"the flow compiles to more than {self.max_nodes:,} nodes"
            + (copies if self.expanding else ""),
            pos.line,
            pos.column,
        )

    def _edge(self, source: int, target: int) -> None:
        self.edges[(source, target)] = None

    # -- scopes and statements ---------------------------------------------------

    def _scope(
        self,
        statements: tuple[ast.Statement, ...],
        start: int,
        end_kind: NodeKind,
        parent: int | None,
        end_parent: int | None,
    ) -> int:
        """Build the statements of one scope; allocate and return its end node.

        ``parent`` is the scope's own subflow-start (None at the top level);
        ``end_parent`` the scope that holds the end node: a subflow's start and
        end both sit in the enclosing scope.
        """
        scope = _Scope(start)
        for statement in statements:
            self._statement(statement, scope, parent)
        end_pos = self._end_pos(statements)
        end = self._node(end_kind, end_pos, parent=end_parent)
        if scope.end_merge:
            self.nodes[end].merge = True
        for node in scope.to_end:
            self._edge(node, end)
        for node in scope.to_start:
            self._edge(node, start)
        self._resolve_labels(scope)
        return end

    @staticmethod
    def _end_pos(statements: tuple[ast.Statement, ...]) -> ast.Pos:
        return statements[-1].pos if statements else ast.Pos(1, 1)

    def _statement(self, statement: ast.Statement, scope: _Scope, parent: int | None) -> None:
        head = statement.head
        last: int | None  # the node whose output flows on; None right after a label head
        head_label: ast.Label | None = None
        if isinstance(head, ast.Label):
            if head.name == "end":
                raise FlowLabelError(
                    "':end' can only end a statement (→ :end)", head.pos.line, head.pos.column
                )
            if head.name == "start":
                last = scope.start
            else:
                head_label, last = head, None
                scope.junction(head)
        elif isinstance(head, ast.Step):
            entry, last = self._step(head, scope, parent, first=True)
            self._edge(scope.start, entry)
        else:
            last = self._source(head, parent)
            self._edge(scope.start, last)

        for step in statement.steps:
            entry, exit_ = self._step(step, scope, parent, first=False)
            if last is None:
                assert head_label is not None
                scope.junction(head_label).consumers.append(entry)
            else:
                self._edge(last, entry)
            last = exit_

        if last is None:
            assert head_label is not None
            if statement.target is None:
                raise FlowLabelError(
                    f"a statement cannot be just the label ':{head_label.name}'",
                    head_label.pos.line,
                    head_label.pos.column,
                )
            raise FlowLabelError(
                f"label ':{head_label.name}' leads straight to another label; put a step between",
                head_label.pos.line,
                head_label.pos.column,
            )
        self._target(statement.target, last, scope, parent)

    def _target(
        self, target: ast.Target | None, last: int, scope: _Scope, parent: int | None
    ) -> None:
        if target is None:
            scope.to_end.append(last)
        elif isinstance(target, ast.LabelTarget):
            label = target.label
            if label.name == "end":
                scope.to_end.append(last)
                scope.end_merge = scope.end_merge or target.merge
            elif label.name == "start":
                scope.to_start.append(last)
            else:
                junction = scope.junction(label)
                junction.producers.append(last)
                junction.merge_consumers = junction.merge_consumers or target.merge
        else:
            resource = target.resource
            _check_policy(resource.params)
            sink = self._node(
                NodeKind.SINK,
                resource.pos,
                parent,
                name=resource.uri,
                params=resource.params.value if resource.params else None,
                merge=target.merge,
            )
            self._edge(last, sink)
            scope.to_end.append(sink)

    def _source(self, source: ast.LiteralSource | ast.UriResource, parent: int | None) -> int:
        if isinstance(source, ast.LiteralSource):
            return self._node(NodeKind.SOURCE, source.pos, parent, params=source.value)
        _check_policy(source.params)
        return self._node(
            NodeKind.SOURCE,
            source.pos,
            parent,
            name=source.uri,
            params=source.params.value if source.params else None,
        )

    # -- steps -------------------------------------------------------------------

    def _step(
        self, step: ast.Step, scope: _Scope, parent: int | None, first: bool
    ) -> tuple[int, int]:
        """Build one step; return its (entry, exit) node ids."""
        if step.input_label is not None:
            self._check_not_reserved(step.input_label, "an input label", at_head=first)
        if step.output_label is not None:
            self._check_not_reserved(step.output_label, "an output label", at_head=False)
        body = step.body
        if isinstance(body, ast.Subflow):
            entry, exit_ = self._subflow(body, step, parent)
        else:
            entry, exit_ = self._task(body, step, parent)
        if step.input_label is not None:
            if step.input_label.name == "start":
                self._edge(scope.start, entry)
            else:
                self._define(scope, step.input_label, "input").consumers.append(entry)
        if step.output_label is not None:
            self._define(scope, step.output_label, "output").producers.append(exit_)
        return entry, exit_

    @staticmethod
    def _check_not_reserved(label: ast.Label, role: str, at_head: bool) -> None:
        if label.name == "end" or (label.name == "start" and not at_head):
            where = "begin" if label.name == "start" else "end"
            raise FlowLabelError(
                f"':{label.name}' cannot be {role}: it may only {where} a statement",
                label.pos.line,
                label.pos.column,
            )

    @staticmethod
    def _define(scope: _Scope, label: ast.Label, side: str) -> _Junction:
        junction = scope.junction(label)
        attribute = f"{side}_at"
        previous = getattr(junction, attribute)
        if previous is not None:
            raise FlowLabelError(
                f"{side} label ':{label.name}' defined twice (first at {previous})",
                label.pos.line,
                label.pos.column,
            )
        setattr(junction, attribute, label.pos)
        return junction

    def _subflow(self, body: ast.Subflow, step: ast.Step, parent: int | None) -> tuple[int, int]:
        start = self._node(
            NodeKind.SUBFLOW_START,
            body.pos,
            parent,
            merge=step.merge,
            guard=step.guard,
            iterate=step.iterate,
        )
        end = self._scope(
            body.statements, start, NodeKind.SUBFLOW_END, parent=start, end_parent=parent
        )
        self.nodes[end].line, self.nodes[end].column = body.end_pos.line, body.end_pos.column
        self.nodes[start].pair = end
        self.nodes[end].pair = start
        return start, end

    def _task(self, task: ast.Task, step: ast.Step, parent: int | None) -> tuple[int, int]:
        declaration = self.flow.tasks.get(task.name)
        if declaration is not None and declaration.body is not None:
            return self._inline(declaration, task, step, parent)
        _check_policy(task.params)
        name, params, doc = self._resolve(task, declaration)
        node = self._node(
            NodeKind.TASK,
            task.pos,
            parent,
            name=name,
            params=params,
            merge=step.merge,
            guard=step.guard,
            iterate=step.iterate,
            doc=doc,
        )
        return node, node

    def _resolve(
        self, task: ast.Task, declaration: ast.TaskDeclaration | None
    ) -> tuple[str, Any, str | None]:
        """Follow aliases; return the task name to run, its merged parameters and its doc."""
        params = task.params.value if task.params else None
        where = task.params.pos if task.params else task.pos
        name, doc, seen = task.name, None, [task.name]
        while declaration is not None:
            doc = doc or declaration.doc
            if declaration.params is not None:
                params = merge_params(
                    declaration.params.value, params, where, declaration.params.pos
                )
            if declaration.alias is None:
                break
            name = declaration.alias
            if name in seen:
                chain = " = ".join([*seen, name])
                raise FlowDeclarationError(
                    f"alias cycle: {chain}", declaration.pos.line, declaration.pos.column
                )
            seen.append(name)
            declaration = self.flow.tasks.get(name)
            if declaration is not None and declaration.body is not None:
                raise FlowDeclarationError(
                    f"alias {seen[-2]!r} names {name!r}, which has a body; use {name!r} directly",
                    declaration.pos.line,
                    declaration.pos.column,
                )
        return name, params, doc

    def _inline(
        self, declaration: ast.TaskDeclaration, task: ast.Task, step: ast.Step, parent: int | None
    ) -> tuple[int, int]:
        assert declaration.body is not None
        if task.params is not None:
            raise FlowDeclarationError(
                f"{task.name!r} is a subflow (declared at {declaration.pos}): "
                "it takes no parameters",
                task.params.pos.line,
                task.params.pos.column,
            )
        if declaration.params is not None:
            raise FlowDeclarationError(
                f"@task {task.name} has a body, so it cannot have parameters",
                declaration.params.pos.line,
                declaration.params.pos.column,
            )
        if task.name in self.expanding:
            raise FlowDeclarationError(
                f"@task {task.name} invokes itself ({' → '.join([*self.expanding, task.name])})",
                task.pos.line,
                task.pos.column,
            )
        self.expanding.append(task.name)
        try:
            start, end = self._subflow(declaration.body, step, parent)
        finally:
            self.expanding.pop()
        self.nodes[start].name = task.name
        self.nodes[start].doc = declaration.doc
        return start, end

    # -- labels ------------------------------------------------------------------

    def _resolve_labels(self, scope: _Scope) -> None:
        for name, junction in scope.labels.items():
            where = junction.first_use or ast.Pos(0, 0)
            if not junction.producers:
                raise FlowLabelError(
                    f"label ':{name}' is read but never defined: nothing flows into it",
                    where.line,
                    where.column,
                )
            if not junction.consumers:
                raise FlowLabelError(
                    f"label ':{name}' is defined but never used: nothing reads from it",
                    where.line,
                    where.column,
                )
            for consumer in junction.consumers:
                if junction.merge_consumers:
                    self.nodes[consumer].merge = True
                for producer in junction.producers:
                    self._edge(producer, consumer)
