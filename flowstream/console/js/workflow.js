// One workflow: facts, actions with confirmation, the graph coloured by node state, the task
// table (input/output on demand), the history. Live through GET /api/workflows/{id}/stream.
import { api, subscribe } from "./api.js";
import { confirmAction } from "./confirm.js";
import { duration, el, pretty, stateClass, throttle, time } from "./dom.js";
import { GraphView } from "./graph.js";

const UNKNOWN_WAIT_MS = 10000;
const ENDED = new Set(["finished", "failed", "terminated"]);
// The states each action makes sense in; the server has the last word (409 otherwise).
const ALLOWED = {
  pause: (s) => s === "running",
  resume: (s) => s === "paused",
  terminate: (s) => s === "running" || s === "paused",
  restart: (s) => s === "failed" || s === "terminated",
  delete: () => true,
};
const VERBS = {
  pause: "Pause", resume: "Resume", restart: "Restart", terminate: "Terminate", delete: "Delete",
};

export class WorkflowPage {
  constructor(session) {
    this.session = session;
    this.title = document.getElementById("wf-title");
    this.facts = document.getElementById("wf-facts");
    this.message = document.getElementById("wf-message");
    this.taskBody = document.querySelector("#task-table tbody");
    this.historyBody = document.querySelector("#history-table tbody");
    this.historyNote = document.getElementById("history-note");
    this.graph = new GraphView(document.getElementById("graph"), document.getElementById("zoom-level"),
      (id) => this.selectNode(id));
    this.rows = new Map(); // task key -> <tr>
    this.source = null;
    this.id = null;
    this.workflow = null;
    this.reloadGraph = throttle(() => this.loadGraph(), 1000);
    document.getElementById("zoom-in").addEventListener("click", () => this.graph.step(1));
    document.getElementById("zoom-out").addEventListener("click", () => this.graph.step(-1));
    document.getElementById("zoom-fit").addEventListener("click", () => this.graph.fit());
    document.getElementById("history-load").addEventListener("click", () => this.loadHistory());
    for (const button of document.querySelectorAll("#page-workflow [data-action]")) {
      button.addEventListener("click", () => this.confirm(button.dataset.action, button));
    }
  }

  enter({ id }) {
    this.id = id;
    this.workflow = null;
    this.title.textContent = `Workflow ${id}`;
    this.message.textContent = "";
    this.facts.replaceChildren();
    this.taskBody.replaceChildren();
    this.historyBody.replaceChildren();
    this.historyNote.textContent = "";
    this.rows.clear();
    this.graph.clear();
    this.load();
  }

  leave() {
    this.stopLive();
    this.id = null;
  }

  stopLive() {
    if (this.source) this.source.close();
    this.source = null;
  }

  async load() {
    const id = this.id;
    let workflow;
    // A workflow just started has no record until a lifecycle worker takes its start
    // event: an unknown id is asked for again for a while before it is called unknown.
    const until = Date.now() + UNKNOWN_WAIT_MS;
    for (;;) {
      try {
        workflow = await api("GET", `/api/workflows/${encodeURIComponent(id)}`);
        break;
      } catch (problem) {
        if (id !== this.id) return;
        if (problem.status === 404 && Date.now() < until) {
          this.message.textContent = `Waiting for workflow ${id} to be recorded…`;
          await new Promise((resolve) => setTimeout(resolve, 300));
          continue;
        }
        this.message.textContent = problem.status === 404
          ? `No workflow ${id} (never started, deleted, or removed by retention).`
          : `Could not read workflow ${id}: ${problem.message}`;
        return;
      }
    }
    if (id !== this.id) return;
    if (this.message.textContent.startsWith("Waiting")) this.message.textContent = "";
    this.update(workflow);
    await this.loadGraph();
    if (!ENDED.has(workflow.state)) this.startLive();
  }

  startLive() {
    this.stopLive();
    const id = this.id;
    this.source = subscribe(`/api/workflows/${encodeURIComponent(id)}/stream`, (data, type) => {
      if (id !== this.id) return;
      if (type === "gone") {
        this.stopLive();
        this.message.textContent = `Workflow ${id} was deleted.`;
        return;
      }
      if (!data || typeof data !== "object" || !("state" in data)) return;
      this.update(data);
      this.reloadGraph();
      if (ENDED.has(data.state)) {
        // The server ends the stream after the end; EventSource would reconnect, so close.
        this.stopLive();
        this.loadGraph();
      }
    });
  }

  async loadGraph() {
    const id = this.id;
    let graph;
    try {
      graph = await api("GET", `/api/workflows/${encodeURIComponent(id)}/graph`);
    } catch (problem) {
      if (id === this.id && problem.status !== 404) {
        this.message.textContent = `Could not read the graph: ${problem.message}`;
      }
      return;
    }
    if (id !== this.id) return;
    this.graph.show(graph, this.derivedStates());
    document.getElementById("graph").dataset.workflowState = this.workflow?.state || "";
  }

  /** Node id -> state from the task rows, for graph nodes the server gave no state. */
  derivedStates() {
    const byNode = new Map();
    for (const task of this.tasks()) {
      const node = String(task.key).split(".")[0];
      (byNode.get(node) || byNode.set(node, []).get(node)).push(String(task.state));
    }
    const states = new Map();
    for (const [node, list] of byNode) {
      const has = (word) => list.some((s) => s.startsWith(word));
      states.set(node, has("running") ? "running" : has("failed") ? "failed" : has("held") ? "held"
        : has("abandoned") ? "abandoned" : list.every((s) => s === "ended") ? "ended" : list[0]);
    }
    return states;
  }

  tasks() {
    const w = this.workflow || {};
    return w.tasks || w.nodes || []; // tasks: every field (input, output, duration_ms)
  }

  update(workflow) {
    this.workflow = workflow;
    this.facts.replaceChildren(
      ...fact("State", el("span", { class: "state", "data-state": workflow.state, text: workflow.state ?? "" })),
      ...fact("Flow", workflow.flow ?? ""),
      ...fact("Created", time(workflow.created)),
      ...fact("Ended", time(workflow.ended)),
      ...(workflow.priority ? fact("Priority", String(workflow.priority)) : []),
      ...(workflow.error ? fact("Error", String(workflow.error)) : []),
    );
    document.getElementById("wf-input").textContent = pretty(workflow.input);
    document.getElementById("wf-output").textContent = pretty(workflow.output);
    document.getElementById("wf-error").textContent = pretty(workflow.error ?? "");
    const operator = this.session.role !== "read";
    for (const button of document.querySelectorAll("#page-workflow [data-action]")) {
      const allowed = operator && ALLOWED[button.dataset.action](workflow.state);
      button.disabled = !allowed;
      button.title = operator ? "" : "read-only token: no actions";
    }
    this.updateTasks();
  }

  updateTasks() {
    const seen = new Set();
    let fresh = null;
    for (const task of this.tasks()) {
      const key = String(task.key);
      seen.add(key);
      const row = this.rows.get(key);
      if (row) {
        fillTaskRow(row, task);
      } else {
        const made = taskRow(task);
        this.rows.set(key, made);
        (fresh ||= document.createDocumentFragment()).append(made);
      }
    }
    if (fresh) this.taskBody.append(fresh);
    for (const [key, row] of this.rows) {
      if (!seen.has(key)) {
        row.remove();
        this.rows.delete(key);
      }
    }
  }

  selectNode(id) {
    this.graph.select(id);
    const row = [...this.rows.entries()].find(([key]) => key.split(".")[0] === String(id));
    if (row) {
      row[1].scrollIntoView({ block: "center" });
      row[1].querySelector("summary, td").focus?.();
    }
  }

  async loadHistory() {
    const id = this.id;
    this.historyNote.textContent = "Reading…";
    let history;
    try {
      history = await api("GET", `/api/workflows/${encodeURIComponent(id)}/history`);
    } catch (problem) {
      this.historyNote.textContent = `Could not read the history: ${problem.message}`;
      return;
    }
    if (id !== this.id) return;
    const events = history.events || history.timeline || [];
    const fragment = document.createDocumentFragment();
    for (const event of events) {
      const detail = ["status", "worker", "error", "reason", "stream"]
        .filter((name) => event[name] !== undefined && event[name] !== null)
        .map((name) => `${name}: ${typeof event[name] === "string" ? event[name] : JSON.stringify(event[name])}`)
        .join("; ");
      fragment.append(el("tr", {},
        el("td", {}, time(event.at)), el("td", { text: event.event ?? event.kind ?? "" }),
        el("td", { text: event.key ?? "" }), el("td", { text: event.name ?? "" }),
        el("td", { class: "num", text: event.attempt ?? "" }), el("td", { text: detail })));
    }
    this.historyBody.replaceChildren(fragment);
    const lost = history.complete === false ? " Some events are no longer in Redis (see the archive)." : "";
    this.historyNote.textContent = `${events.length} events.${lost}`;
  }

  async confirm(action, button) {
    const answer = await confirmAction({
      title: `${VERBS[action]} workflow?`,
      text: action === "delete"
        ? `Delete workflow ${this.id} and all its records? This cannot be undone.`
        : `${VERBS[action]} workflow ${this.id} (now ${this.workflow?.state ?? "unknown"}).`,
      ok: VERBS[action],
      reason: action === "terminate",
      returnTo: button,
    });
    if (answer.ok) await this.act(action, answer.reason);
  }

  async act(action, reason) {
    const id = this.id;
    const path = `/api/workflows/${encodeURIComponent(id)}`;
    this.message.textContent = `${VERBS[action]}: sent…`;
    try {
      if (action === "delete") await api("DELETE", path);
      else await api("POST", `${path}/${action}`, reason ? { reason } : {});
    } catch (problem) {
      this.message.textContent = problem.status === 409
        ? `Not allowed now: ${problem.message}`
        : `${VERBS[action]} failed: ${problem.message}`;
      return;
    }
    if (action === "delete") {
      location.hash = "#/";
      return;
    }
    this.message.textContent = `${VERBS[action]}: accepted.`;
    // The lifecycle applies the action a moment later: read until the state moves (a
    // restarted workflow must not look ended, which would leave it unfollowed), then
    // load the page again, which follows it live while it runs.
    const before = this.workflow?.state;
    const until = Date.now() + UNKNOWN_WAIT_MS;
    while (Date.now() < until && id === this.id) {
      try {
        const now = await api("GET", path);
        if (now.state !== before) break;
      } catch {
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
    if (id === this.id) await this.load();
  }
}

function fact(name, value) {
  return [el("dt", { text: name }), el("dd", {}, value)];
}

function taskRow(task) {
  const details = el("details", {}, el("summary", { text: "input / output" }));
  details.addEventListener("toggle", () => {
    // Filled on demand: a wide workflow's outputs can be large.
    if (!details.open) return;
    const current = details.task;
    details.replaceChildren(details.firstChild,
      el("strong", { text: "Input" }), el("pre", { text: pretty(current.input) }),
      el("strong", { text: "Output" }), el("pre", { text: pretty(current.output) }),
      ...(current.error ? [el("strong", { text: "Error" }), el("pre", { text: pretty(current.error) })] : []));
  });
  const row = el("tr", { "data-key": task.key });
  for (let i = 0; i < 9; i++) row.append(el("td"));
  row.append(el("td", {}, details));
  fillTaskRow(row, task);
  return row;
}

function fillTaskRow(row, task) {
  const cells = row.children;
  const attempts = task.attempts ?? task.attempt ?? "";
  cells[0].textContent = String(task.key);
  cells[1].textContent = task.name ?? "";
  cells[2].textContent = task.kind ?? "";
  cells[3].replaceChildren(el("span", { class: `state badge ${stateClass(task.state)}`, text: task.state ?? "" }));
  cells[4].replaceChildren(time(task.started));
  cells[5].replaceChildren(time(task.ended));
  cells[6].textContent = duration(task.duration_ms);
  cells[6].className = "num";
  cells[7].textContent = String(attempts);
  cells[7].className = "num";
  cells[8].textContent = task.worker ?? "";
  row.dataset.state = task.state ?? "";
  const details = cells[9].firstChild;
  details.task = task;
  if (details.open) details.dispatchEvent(new Event("toggle"));
}
