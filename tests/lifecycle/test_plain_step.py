"""The transition's plain step gives exactly what its general path gives.

``Transition.compute`` takes the common batch item — one successful end-task of a
workflow whose node only starts plain tasks — without the general walk over its
events. Here both paths compute the same items, drawn over what could tell them
apart (outputs, workers, tokens right, wrong or missing, no salt, priorities,
timeouts, several successors, other tasks running, depth limits, a start limit, a
concurrency key admitted or waiting):
the commits, the new states and what each says of the event must be equal, and
the plain step must have been the one taken wherever it applies. No Redis: the
transition is pure.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import hiredis
from hypothesis import given, settings
from hypothesis import strategies as st

from flowlang.compiler import compile_text
from flowlang.limits import DEFAULT_LIMITS, Limits, depth_within
from flowlang.machine import Machine, State
from lifecycle import events as ev
from lifecycle.engine.commit import Commit, Pending, Said
from lifecycle.engine.transition import Transition
from lifecycle.keys import Keys

EXAMPLES = int(os.environ.get("LIFECYCLE_PLAIN_STEP_EXAMPLES", "300"))
NOW = 1_700_000_000_000
SALT = "0f" * 16

FLOWS = [
    "A → B → C",
    "A → :x; :x → B; :x → C;",  # one end starts two plain tasks
    "A (- {$timeout: 5} -) → B (- {$timeout: 2.5, $retries: 1} -) → C",
    "A (- {k: 1} -) → x:B (- {j: [1, 2]} -) → C",
    "A → { B C } → D",  # a node whose successor is a subflow: general path
]
GRAPHS = {str(n): compile_text(text) for n, text in enumerate(FLOWS)}
MACHINES = {digest: Machine(graph) for digest, graph in GRAPHS.items()}
LIMITS = {
    "default": DEFAULT_LIMITS,
    "shallow": Limits(depth=3),  # the output's depth walked, not left to the encoder
    "starts": Limits(task_starts=1000),  # counted starts: general path
}


class _Graphs:
    def __init__(self, limits: Limits) -> None:
        self.machines = {digest: Machine(graph, limits) for digest, graph in GRAPHS.items()}

    def machine(self, digest: str) -> Machine:
        return self.machines[digest]


class _General(Transition):
    """The transition without its plain step: every item takes the general path."""

    def plain_step(self, item: Pending, now: int) -> Commit | None:
        return None


def _transitions(kind: type[Transition]) -> dict[tuple[str, bool], Transition]:
    return {
        (name, untokened): kind(
            _Graphs(limits), Keys(), limits, untokened_answers=untokened, retain_ms=60_000
        )
        for name, limits in LIMITS.items()
        for untokened in (False, True)
    }


TRANSITIONS, GENERAL = _transitions(Transition), _transitions(_General)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@st.composite
def items(draw: Any) -> tuple[Transition, Pending]:
    digest = draw(st.sampled_from(sorted(MACHINES)))
    machine = MACHINES[digest]
    tasks = [node.id for node in machine.nodes if str(node.kind) == "task"]
    node = draw(st.sampled_from(tasks))
    key, attempt = str(node), draw(st.integers(1, 3))
    workflow = draw(st.sampled_from(["w1", "wf-ü", 'q"uote']))
    salt = draw(st.sampled_from([SALT, None, ""]))
    token: str | None = ev.task_token(salt or "", workflow, key, attempt)
    how = draw(st.sampled_from(["right", "wrong", "none"]))
    if how == "wrong":
        token = ev.task_token("other", workflow, key, attempt)
    elif how == "none":
        token = None
    event = ev.EndTask(
        workflow,
        key,
        attempt,
        True,
        draw(json_values),
        None,
        draw(st.none() | st.text(max_size=5)),
        token,
    )
    running = {key: attempt}
    for other in draw(st.lists(st.sampled_from(tasks), max_size=2)):
        running.setdefault(str(other), 1)
    state = State(running=dict(draw(st.permutations(list(running.items())))))
    # what a state may hold beside its running tasks (stored as to_dict() writes it)
    extra = draw(st.sampled_from(["", "started", "error", "output", "stopped"]))
    if extra == "started":
        state.started = 3
    elif extra == "error":
        state.error = ""
    elif extra == "output":
        state.output = 0
    elif extra == "stopped":
        state.stopped = {"9": 2}
    item = Pending(workflow, [("1-1", ev.END_TASK, event)], draw(st.sampled_from(["", "7"])))
    item.state, item.digest, item.salt = state, digest, salt
    item.priority = draw(st.sampled_from([0, 3]))
    # Task record times count from its creation: none recorded, a while ago, a moment
    # ahead (another worker's clock), long ago.
    item.created = draw(st.sampled_from([None, NOW - 12_345, NOW + 5, NOW - 10**9]))
    # Under a concurrency key: admitted, or still waiting (its start-tasks held).
    concurrency = draw(st.sampled_from(["none", "admitted", "queued"]))
    if concurrency != "none":
        item.concurrency = {"key": "k", "max": 2}
    if concurrency == "queued":
        item.concurrency["queued"] = True
        item.held = []
    return (draw(st.sampled_from(sorted(LIMITS))), draw(st.booleans())), item


def _commit_view(commit: Commit | None) -> Any:
    if commit is None:
        return None
    view = {
        name: getattr(commit, name)
        for name in Commit.__slots__
        if name not in ("keys", "shared", "plain")
    }
    view["events"] = list(commit.encoded_events())  # templates compare by what they send
    return view


@settings(max_examples=EXAMPLES, deadline=None)
@given(items())
def test_the_plain_step_commits_what_the_general_path_commits(drawn: Any) -> None:
    which, item = drawn
    transition = TRANSITIONS[which]
    general_item, general_said = copy.deepcopy(item), Said()
    general = GENERAL[which].compute(general_item, general_said, NOW)
    taken = transition.plain_step(copy.deepcopy(item), NOW) is not None
    said = Said()
    commit = transition.compute(item, said, NOW)
    assert _commit_view(commit) == _commit_view(general)
    assert item.state is not None and general_item.state is not None
    assert item.state.to_dict() == general_item.state.to_dict()
    assert (said.duplicates, said.rejected) == (general_said.duplicates, general_said.rejected)
    # Taken wherever it applies, and only there.
    event = item.events[0][2]
    machine = MACHINES[item.digest or ""]
    answers = (
        item.salt is None
        or (event.token is None and transition.untokened_answers)
        or event.token == ev.task_token(item.salt, item.workflow, event.key, event.attempt)
    )
    node = int(event.key)
    plain = machine.plain_next[node]
    timeouts = [transition._task(item, machine, n).policy.timeout for n in (node, *(plain or ()))]
    limits = transition.limits
    assert taken == (
        item.held is None
        and plain is not None
        and not any(timeouts)
        and answers
        and limits.task_starts is None
        and depth_within(event.output, limits.depth)
    )
    assert (commit is not None and commit.plain is not None) == taken


def test_a_plain_commit_packs_as_the_general_commands_do() -> None:
    transition = TRANSITIONS[("default", False)]
    for digest in ("0", "1", "3"):
        machine = MACHINES[digest]
        for node in (n.id for n in machine.nodes if machine.plain_next[n.id] is not None):
            key = str(node)
            item = Pending("w1", [], "3")
            token = ev.task_token(SALT, "w1", key, 1)
            event = ev.EndTask("w1", key, 1, True, {"n": [1, "ü"]}, None, "wk", token)
            item.events = [("1-1", ev.END_TASK, event)]
            item.state, item.digest, item.salt = State(running={key: 1}), digest, SALT
            if digest == "1":  # the key as the advancer read the record: written there
                item.key = Keys().workflow("w1").encode()
            commit = transition.compute(item, Said(), NOW)
            assert commit is not None and commit.plain is not None
            assert commit.plain_commands() == list(map(_packed, commit.commands()))


def _packed(command: Any) -> bytes:
    return command if type(command) is bytes else hiredis.pack_command(tuple(command))


def test_task_tokens_are_the_task_tokens_of_each_attempt() -> None:
    attempts = [("1", 1), ("2.0.1", 3), ("17", 2)]
    for salt in (SALT, "", "ß"):
        assert ev.task_tokens(salt, "wf", attempts) == [
            ev.task_token(salt, "wf", key, attempt) for key, attempt in attempts
        ]
