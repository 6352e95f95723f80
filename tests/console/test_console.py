"""The console end to end: the real API (``python -m lifecycle serve``), a lifecycle worker
and task workers on the test Redis, driven in the system Chromium.

Set ``FLOWSTREAM_SCREENSHOTS=1`` to also write docs/images/console-list.png and
console-graph.png; ``FLOWSTREAM_CONSOLE_FULL=1`` lists 1,000 workflows (default 120).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from lifecycle.keys import TASK_GROUP, Keys
from rqse.deadletter import MAX_DELIVERIES, dead_letter_fields
from rqse.keys import dead_letter_key
from tests.conftest import wait_until
from tests.processes import Processes

KEYS = Keys()
OPERATE = "operate-token-for-console-tests"
READ = "read-token-for-console-tests-00"
IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"

# The first task's kind has no worker until the test starts one: the workflow waits
# there, running, so the page is seen before and after it finishes.
GATED = """@flow console-e2e
'''Fetch and score in parallel once the gate opens, then report.'''
gate:open → fetch | score → report
"""
STUCK = """@flow console-stuck
hold:forever → never
"""


@dataclass
class Console:
    url: str
    processes: Processes
    redis: redis.Redis

    def call(self, method: str, path: str, body: Any = None, token: str = OPERATE) -> Any:
        """The API with a bearer token (how the test sets the scene behind the page)."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {token}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
        return json.loads(text) if text else None

    def start(self, flow: str, **extra: Any) -> str:
        """Start ``flow``; return its id once the lifecycle has made its record."""
        workflow_id = self.call("POST", "/api/workflows", {"flow": flow, "input": {}, **extra})
        wait_until(lambda: self.known(workflow_id["id"]), what=f"workflow {workflow_id}")
        return workflow_id["id"]

    def known(self, workflow_id: str) -> bool:
        try:
            self.call("GET", f"/api/workflows/{workflow_id}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        return True

    def state(self, workflow_id: str) -> str:
        return self.call("GET", f"/api/workflows/{workflow_id}")["state"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/index.html", timeout=1):
            return True
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="module")
def console(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    """One API server and its workers for the module (starting them is most of the cost)."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    tokens = tmp_path_factory.mktemp("console") / "tokens"
    tokens.write_text(f"operate:{OPERATE}\nread:{READ}\n")
    port = _free_port()
    group = Processes(redis_url)
    try:
        server = group.start(
            "lifecycle", "serve", "--port", str(port), "--token-file", str(tokens), stderr=True
        )
        group.lifecycle("console-lifecycle")
        group.noop("console-default")
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url) or server.poll() is not None, timeout=30, what="the API")
        if server.poll() is not None:
            pytest.fail(f"serve exited: {server.stderr.read().decode()[-2000:]}")
        yield Console(url, group, client)
    finally:
        group.stop_all()
        client.flushdb()
        client.close()


def log_in(page: Any, console: Console, token: str = OPERATE) -> None:
    page.goto(console.url + "/")
    page.wait_for_selector("#page-login:not([hidden])")
    page.fill("#login-token", token)
    page.press("#login-token", "Enter")
    page.wait_for_selector("#page-list:not([hidden])")


def test_an_operator_uploads_a_flow_and_watches_it_finish_live_on_the_graph(
    page: Any, console: Console, tmp_path: Path
) -> None:
    log_in(page, console)
    # The token went into an HttpOnly cookie: nothing the page's scripts can read.
    assert OPERATE not in page.evaluate("document.cookie + JSON.stringify(localStorage)")
    cookie = next(c for c in page.context.cookies() if c["name"] == "flowstream_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    page.click("nav >> text=Start")
    page.fill("#start-flow", "@flow broken\na → → b\n")
    bad = page.wait_for_selector("#start-check.bad")
    assert re.match(r"\d+:\d+: ", bad.text_content()), bad.text_content()
    assert not page.is_hidden("#start-caret")

    flow = tmp_path / "gated.flow"
    flow.write_text(GATED)
    page.set_input_files("#start-file", str(flow))
    page.wait_for_function(
        "document.querySelector('#start-check').textContent.startsWith('Compiles')"
    )
    assert "gate" in page.text_content("#start-check")
    page.fill("#start-input", '{"order": 7}')
    page.fill("#start-priority", "5")
    page.click("#start-form button[type=submit]")
    page.wait_for_url(re.compile(r"#/workflows/.+"))
    workflow_id = page.url.split("#/workflows/")[1]

    gate = '#graph .node[data-label="gate:open"]'
    page.wait_for_selector(f"{gate}.st-running")
    assert page.text_content("#wf-facts [data-state]") == "running"
    assert "Priority5" in page.text_content("#wf-facts")
    page.evaluate("window.stillTheSamePage = true")

    console.processes.start("workers", "noop", "--kinds", "gate", "--consumer", "console-gate")
    page.wait_for_selector("#wf-facts [data-state=finished]", timeout=20_000)
    page.wait_for_selector('#graph .node[data-label="report"].st-ended')
    for label in ("gate:open", "fetch", "score", "report"):
        assert "st-ended" in page.get_attribute(f'#graph .node[data-label="{label}"]', "class")
    assert page.evaluate("window.stillTheSamePage") is True  # updated live, not reloaded
    assert page.locator("#task-table tbody tr").count() == 4
    # Input and output on demand: a task row's details are filled when opened.
    details = page.locator('#task-table tbody tr[data-key="1"] details')
    assert details.locator("pre").count() == 0
    details.locator("summary").click()
    assert '"order": 7' in details.locator("pre").first.text_content()
    page.click("#history-load")
    page.wait_for_selector("#history-table tbody tr")
    events = page.eval_on_selector_all(
        "#history-table tbody td:nth-child(2)", "c => c.map(x => x.textContent)"
    )
    assert events.count("start-task") == 4 and events.count("end-task") == 4, events
    assert console.state(workflow_id) == "finished"
    assert page.errors == []
    # Every script, style and call went to the console's own server (no CDN).
    assert [url for url in page.requests if not url.startswith(console.url + "/")] == []


def test_an_operator_terminates_a_running_workflow_after_confirming(
    page: Any, console: Console
) -> None:
    workflow_id = console.start(STUCK)
    log_in(page, console)
    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_selector('#graph .node[data-label="hold:forever"].st-running')

    page.click("button[data-action=terminate]")
    assert page.is_visible("#confirm")
    page.click("#confirm-cancel")  # cancelling sends nothing
    assert console.state(workflow_id) == "running"

    page.click("button[data-action=terminate]")
    page.fill("#confirm-reason", "stuck on a gate nobody serves")
    page.click("#confirm-ok")
    page.wait_for_selector("#wf-facts [data-state=terminated]", timeout=20_000)
    assert console.state(workflow_id) == "terminated"
    assert page.is_disabled("button[data-action=terminate]")
    assert page.is_enabled("button[data-action=restart]")
    assert page.errors == []


def test_pause_resume_restart_and_delete_from_the_workflow_page(
    page: Any, console: Console
) -> None:
    workflow_id = console.start(STUCK)
    log_in(page, console)
    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_selector("#wf-facts [data-state=running]")

    def act(action: str, state: str) -> None:
        page.click(f"button[data-action={action}]")
        page.click("#confirm-ok")
        page.wait_for_selector(f"#wf-facts [data-state={state}]", timeout=20_000)

    act("pause", "paused")
    assert page.is_enabled("button[data-action=resume]")
    assert page.is_disabled("button[data-action=pause]")
    act("resume", "running")
    act("terminate", "terminated")
    act("restart", "running")
    page.wait_for_selector('#graph .node[data-label="hold:forever"].st-running')
    act("terminate", "terminated")
    page.click("button[data-action=delete]")
    assert "cannot be undone" in page.text_content("#confirm-text")
    page.click("#confirm-ok")
    page.wait_for_selector("#page-list:not([hidden])")
    wait_until(lambda: not console.known(workflow_id), what="deleted")
    assert page.errors == []


def test_an_action_on_every_workflow_the_filters_select(page: Any, console: Console) -> None:
    flow = "@flow console-bulk\nhold:forever → never\n"
    ids = [console.start(flow) for _ in range(3)]
    other = console.start(STUCK)
    log_in(page, console)
    page.click("#bulk-apply")  # no filter: refused in the page, nothing sent
    assert "Choose a state, a flow or a schedule" in page.text_content("#bulk-result")
    page.fill("#filter-schedule", "no-such-schedule")
    page.press("#filter-schedule", "Enter")
    page.wait_for_function(
        "document.querySelector('#list-summary').textContent.startsWith('Could not read')"
    )
    assert "no-such-schedule" in page.text_content("#list-summary")
    page.fill("#filter-schedule", "")
    page.fill("#filter-flow", "console-bulk")
    page.press("#filter-flow", "Enter")
    page.wait_for_function("document.querySelectorAll('#list-table tbody tr').length === 3")
    page.select_option("#bulk-action", "terminate")
    page.click("#bulk-apply")
    assert "all of them" in page.text_content("#confirm-text")
    page.fill("#confirm-reason", "cleaning up")
    page.click("#confirm-ok")
    page.wait_for_function(
        "document.querySelector('#bulk-result').textContent.includes('3 matched, 3 sent')"
    )
    wait_until(lambda: all(console.state(i) == "terminated" for i in ids), what="terminated")
    assert console.state(other) == "running"


def test_a_workflow_of_a_thousand_steps_is_drawn_and_coloured(page: Any, console: Console) -> None:
    # 24 parallel chains of 40 steps, of a kind no worker serves: the first step of each
    # runs, the other 936 have not started.
    chains = " ".join(
        "{ " + " → ".join(f"wide:c{c}s{s}" for s in range(40)) + " }" for c in range(24)
    )
    workflow_id = console.start(f"@flow console-wide\nbegin → {{ {chains} }} → finish\n")
    log_in(page, console)
    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_function(
        "document.querySelectorAll('#graph .node.st-running').length === 24", timeout=20_000
    )
    assert page.locator("#graph .node").count() > 1000
    assert page.locator("#graph .node.st-not").count() == 24 * 39 + 1
    assert float(page.get_attribute("#graph", "data-layout-ms")) < 3000
    page.click("#zoom-fit")
    box = page.eval_on_selector(
        "#graph", "b => [b.clientHeight, +b.querySelector('svg').getAttribute('height')]"
    )
    assert box[1] <= box[0] or page.text_content("#zoom-level") == "25 %"
    assert page.errors == []


def test_a_dead_letter_is_listed_on_the_status_page_and_requeued(
    page: Any, console: Console
) -> None:
    # A start-task a worker gave up on, as rqse writes it; its kind has no worker, so
    # the requeued entry stays on the kind's stream.
    console.redis.sadd(KEYS.kinds, "dlq")
    start_task = {b"kind": b'"start-task"', b"workflow": b'"wf-gone"', b"key": b'"1"'}
    fields = dead_letter_fields(
        stream=KEYS.tasks("dlq"),
        group=TASK_GROUP,
        consumer="w1",
        entry_id="5-0",
        fields={**start_task, b"name": b'"dlq:job"', b"attempt": b"1"},
        reason=MAX_DELIVERIES,
        error="delivered 5 times without an acknowledgement",
        deliveries=5,
    )
    dead_id = console.redis.xadd(dead_letter_key(KEYS.tasks("dlq")), fields).decode()
    dead = "/api/dead-letters?kind=dlq"
    letter = console.call("GET", dead)["items"][0]
    assert letter["id"] == dead_id
    log_in(page, console)
    page.click("nav a[data-page=status]")
    row = page.wait_for_selector(f'#dead-table tr[data-id="{letter["id"]}"]')
    assert "wf-gone" in row.text_content() and MAX_DELIVERIES in row.text_content()
    row.query_selector("button").click()
    page.click("#confirm-ok")
    # The note names the letter requeued, and still does after the page's own refresh
    # has read the list again and put its count behind it (other tests' letters may
    # remain).
    page.wait_for_function(
        "id => { const note = document.querySelector('#dead-note').textContent;"
        " return note.startsWith('Requeued') && note.includes(id)"
        " && / (None|\\d+( \\(the first\\))? dead letters?)\\.$/.test(note); }",
        arg=letter["id"],
        polling=100,  # (animation frames need not come to a page nobody looks at)
    )
    assert all(item["id"] != letter["id"] for item in console.call("GET", dead)["items"])
    assert console.redis.xlen(KEYS.tasks("dlq")) == 1


def test_untrusted_text_is_shown_as_text_never_as_markup(page: Any, console: Console) -> None:
    name = "x<img src=x onerror=window.pwned=1>"
    flow = f"@flow markup-as-text\n'''{name}'''\nhold:forever → never\n"
    workflow_id = console.start(flow)
    console.call("POST", f"/api/workflows/{workflow_id}/terminate", {"reason": name})
    wait_until(lambda: console.state(workflow_id) == "terminated", what="terminated")
    log_in(page, console)
    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_selector("#wf-facts [data-state=terminated]")
    assert name in page.text_content("#wf-facts")
    assert page.evaluate("document.querySelectorAll('main img').length") == 0
    assert page.evaluate("window.pwned") is None


def test_a_read_token_sees_workflows_but_no_action_is_offered(page: Any, console: Console) -> None:
    workflow_id = console.start(STUCK)
    log_in(page, console, READ)
    assert page.text_content("#who") == "signed in: read"
    assert page.is_hidden("#bulk")
    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_selector("#wf-facts [data-state=running]")
    for action in ("pause", "resume", "restart", "terminate", "delete"):
        assert page.is_disabled(f"button[data-action={action}]")


def test_the_console_is_usable_with_the_keyboard_alone(page: Any, console: Console) -> None:
    workflow_id = console.start(STUCK)
    page.goto(console.url + "/")
    page.wait_for_selector("#page-login:not([hidden])")
    assert page.evaluate("document.activeElement.id") == "login-title"

    def tab_to(selector: str, limit: int = 40, key: str = "Tab") -> None:
        for _ in range(limit):
            page.keyboard.press(key)
            if page.evaluate("(s) => document.activeElement.matches(s)", selector):
                return
        pytest.fail(f"Tab never reached {selector}")

    tab_to("#login-token")
    page.keyboard.type(OPERATE)
    page.keyboard.press("Enter")
    page.wait_for_selector("#page-list:not([hidden])")
    assert page.evaluate("document.activeElement.id") == "list-title"
    tab_to(f'a[href="#/workflows/{workflow_id}"]')
    page.keyboard.press("Enter")
    page.wait_for_selector('#graph .node[data-label="hold:forever"]')
    assert page.evaluate("document.activeElement.id") == "wf-title"

    # The graph scrolls and zooms from the keyboard.
    tab_to("#graph")
    before = page.text_content("#zoom-level")
    page.keyboard.press("+")
    assert page.text_content("#zoom-level") != before

    # An action opens its confirmation with the safe choice focused; Escape cancels and
    # gives the focus back to the button.
    page.focus("#wf-title")
    tab_to("button[data-action=pause]")
    page.keyboard.press("Enter")
    assert page.is_visible("#confirm")
    assert page.evaluate("document.activeElement.id") == "confirm-cancel"
    page.keyboard.press("Escape")
    assert not page.is_visible("#confirm")
    assert page.evaluate("document.activeElement.dataset.action") == "pause"
    assert console.state(workflow_id) == "running"
    # Every page is reachable from the navigation.
    tab_to("nav a[data-page=status]", key="Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement.id === 'status-title'")
    page.wait_for_selector("#status-streams tbody tr[data-source=lifecycle]")
    consumers = page.text_content("#status-streams tbody tr[data-source=default] td:nth-child(7)")
    assert "console-default" in consumers
    tab_to("nav a[data-page=start]", key="Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement.id === 'start-title'")
    tab_to("#start-file")


def test_screenshots_of_the_list_and_the_graph(page: Any, console: Console, tmp_path: Path) -> None:
    """Writes docs/images/console-*.png with FLOWSTREAM_SCREENSHOTS=1 (else to a temp dir)."""
    where = IMAGES if os.environ.get("FLOWSTREAM_SCREENSHOTS") else tmp_path
    where.mkdir(parents=True, exist_ok=True)
    demo = (Path(__file__).resolve().parents[2] / "flowstream" / "demo.flow").read_text()
    # No worker serves notify:, so the run stops there, its other steps done.
    workflow_id = console.start(demo)
    log_in(page, console)
    page.set_viewport_size({"width": 1280, "height": 560})
    page.wait_for_selector("#list-table tbody tr")
    page.screenshot(path=str(where / "console-list.png"))
    page.set_viewport_size({"width": 1280, "height": 960})

    page.goto(f"{console.url}/#/workflows/{workflow_id}")
    page.wait_for_selector('#graph .node[data-label="notify:email"].st-running', timeout=20_000)
    page.wait_for_selector('#graph .node[data-label="summarize"].st-ended')
    page.click("#zoom-fit")
    page.evaluate("document.querySelector('#graph-title').scrollIntoView()")
    page.screenshot(path=str(where / "console-graph.png"))
    for name in ("console-list.png", "console-graph.png"):
        assert (where / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# WCAG 2 contrast of every visible piece of text against the background it is drawn on
# (the nearest opaque one), and of each graph node's label against its fill. Disabled
# controls are exempt, as in WCAG.
CONTRAST = """() => {
  const parse = (c) => {
    const m = /rgba?\\(([^)]+)\\)/.exec(c || '');
    if (!m) return null;
    const p = m[1].split(/[ ,/]+/).filter(Boolean).map(Number);
    return {r: p[0], g: p[1], b: p[2], a: p.length > 3 ? p[3] : 1};
  };
  const lum = ({r, g, b}) => {
    const f = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const ratio = (a, b) => {
    const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05);
  };
  const backgroundOf = (el) => {
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c && c.a > 0.5) return c;
    }
    return {r: 255, g: 255, b: 255, a: 1};
  };
  const bad = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const text = walker.currentNode;
    const el = text.parentElement;
    if (!text.textContent.trim() || el.closest('svg, :disabled, option')) continue;
    if (!el.checkVisibility()) continue;
    const style = getComputedStyle(el);
    const size = parseFloat(style.fontSize);
    const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
    const r = ratio(parse(style.color), backgroundOf(el));
    const shown = text.textContent.trim().slice(0, 30);
    if (r < (large ? 3 : 4.5)) bad.push(`${el.tagName} "${shown}": ${r.toFixed(2)}`);
  }
  for (const node of document.querySelectorAll('#graph .node')) {
    const r = ratio(parse(getComputedStyle(node.querySelector('text')).fill),
                    parse(getComputedStyle(node.querySelector('rect')).fill));
    if (r < 4.5) bad.push(`node ${node.dataset.label} (${node.dataset.state}): ${r.toFixed(2)}`);
  }
  return bad;
}"""


def test_every_page_runs_under_the_content_security_policy(
    strict_page: Any, console: Console
) -> None:
    running = console.start(STUCK)
    log_in(strict_page, console)
    strict_page.goto(f"{console.url}/#/workflows/{running}")
    strict_page.wait_for_selector('#graph .node[data-label="hold:forever"].st-running')
    for name in ("status", "start"):
        strict_page.goto(f"{console.url}/#/{name}")
        strict_page.wait_for_selector(f"#page-{name}:not([hidden])")
    assert strict_page.violations == [] and strict_page.errors == []


def test_text_contrast_meets_wcag_aa_on_every_page(page: Any, console: Console) -> None:
    running = console.start(STUCK)
    log_in(page, console)
    problems = {"list": page.evaluate(CONTRAST)}
    page.goto(f"{console.url}/#/workflows/{running}")
    page.wait_for_selector('#graph .node[data-label="hold:forever"].st-running')
    page.click("#wf-io summary")
    problems["workflow"] = page.evaluate(CONTRAST)
    for name in ("status", "start"):
        page.goto(f"{console.url}/#/{name}")
        page.wait_for_function(f"document.activeElement.id === '{name}-title'")
        problems[name] = page.evaluate(CONTRAST)
    assert {page: found for page, found in problems.items() if found} == {}


def test_the_list_pages_through_every_workflow_and_shows_new_ones_live(
    page: Any, console: Console
) -> None:
    total = 1000 if os.environ.get("FLOWSTREAM_CONSOLE_FULL") else 120
    flow = f"@flow many-{total}\nwork\n"
    started = [
        console.call("POST", "/api/workflows", {"flow": flow, "input": {"n": i}})["id"]
        for i in range(total)
    ]
    query = f"/api/workflows?flow=many-{total}&limit=1000"
    wait_until(
        lambda: len(console.call("GET", query)["items"]) == total, timeout=60, what="all listed"
    )
    log_in(page, console)
    page.fill("#filter-flow", f"many-{total}")
    page.select_option("#filter-limit", "1000")
    began = time.monotonic()
    page.wait_for_function(f"document.querySelectorAll('#list-table tbody tr').length === {total}")
    shown = time.monotonic() - began
    assert shown < 10, f"{total} rows took {shown:.1f}s"

    page.select_option("#filter-limit", "50")
    page.wait_for_function("document.querySelectorAll('#list-table tbody tr').length === 50")
    seen: list[str] = []
    while True:
        ids = page.eval_on_selector_all(
            "#list-table tbody tr", "rows => rows.map(r => r.dataset.id)"
        )
        seen += ids
        if page.is_disabled("#list-next"):
            break
        page.click("#list-next")
        page.wait_for_function(
            "(first) => document.querySelector('#list-table tbody tr')?.dataset.id !== first",
            arg=ids[0],
        )
    assert sorted(seen) == sorted(started)  # every one once, none twice

    page.click("#list-first")
    page.wait_for_selector(f'#list-table tr[data-id="{seen[0]}"]')
    page.evaluate("window.stillTheSamePage = true")
    newest = console.call("POST", "/api/workflows", {"flow": flow, "input": {}})["id"]
    page.wait_for_selector(f'#list-table tr[data-id="{newest}"]', timeout=15_000)
    assert page.evaluate("window.stillTheSamePage") is True
