// Status: what `lifecycle status --json` shows, from GET /api/status, refreshed every 5 s.
import { api } from "./api.js";
import { confirmAction } from "./confirm.js";
import { el, time } from "./dom.js";

const DEAD_SHOWN = 200; // dead letters listed; the CLI's dead-letters command reads them all

export class StatusPage {
  constructor(session) {
    this.session = session;
    this.timer = null;
    this.deadCount = null; // dead letters in the last status: the list is re-read when it moves
    this.deadAction = ""; // what the last requeue did, shown with the list until the next one
    this.auto = document.getElementById("status-auto");
    document.getElementById("status-refresh").addEventListener("click", () => this.load());
    this.auto.addEventListener("change", () => this.schedule());
  }

  enter() {
    this.deadCount = null;
    this.load();
    this.schedule();
  }

  leave() {
    clearInterval(this.timer);
    this.timer = null;
  }

  schedule() {
    clearInterval(this.timer);
    this.timer = this.auto.checked ? setInterval(() => this.load(), 5000) : null;
  }

  async load() {
    const when = document.getElementById("status-when");
    let status;
    try {
      status = await api("GET", "/api/status");
    } catch (problem) {
      when.textContent = `Could not read the status: ${problem.message}`;
      return;
    }
    status = oneReport(status);
    when.textContent = `Read at ${new Date().toLocaleTimeString()}.`;
    const warnings = status.warnings || [];
    document.getElementById("status-warnings").replaceChildren(
      ...(warnings.length ? warnings.map((w) => el("li", { text: w }))
        : [el("li", { class: "ok", text: "No warnings." })]));
    const streams = [status.lifecycle, ...(status.kinds || [])].filter(Boolean);
    document.querySelector("#status-streams tbody").replaceChildren(...streams.map(streamRow));
    const counts = status.workflows || {};
    const facts = [];
    for (const [state, n] of Object.entries(counts.states || {})) {
      facts.push(el("dt", { text: state }), el("dd", { class: "num", text: n }));
    }
    if (counts.partial) {
      facts.push(el("dt", { text: "counted" }),
        el("dd", { text: `the newest ${counts.scanned} of ${counts.listed}` }));
    }
    document.getElementById("status-workflows").replaceChildren(...facts);
    const dead = streams.reduce((sum, info) => sum + (info.dead_letters || 0), 0);
    if (dead !== this.deadCount) {
      this.deadCount = dead;
      this.loadDead();
    }
    const notes = status.notes || [];
    document.getElementById("status-notes").replaceChildren(
      ...(notes.length ? notes.map((note) => el("li", { text: note })) : [el("li", { text: "None." })]));
    const workers = status.lifecycle_workers || [];
    document.getElementById("status-workers").textContent = `Lifecycle workers alive: ${workers.length}${
      workers.length ? ` (${workers.join(", ")})` : ""}.`;
  }

  async loadDead() {
    const note = document.getElementById("dead-note");
    const body = document.querySelector("#dead-table tbody");
    let answer;
    try {
      answer = await api("GET", `/api/dead-letters?limit=${DEAD_SHOWN}`);
    } catch (problem) {
      note.textContent = `Could not read the dead letters: ${problem.message}`;
      return;
    }
    const items = answer.items || [];
    const count = items.length
      ? `${items.length}${items.length === DEAD_SHOWN ? " (the first)" : ""} dead letter${items.length === 1 ? "" : "s"}.`
      : "None.";
    // The last requeue's outcome stays in front of the count the refreshes rewrite.
    note.textContent = this.deadAction ? `${this.deadAction} ${count}` : count;
    const operator = this.session.role !== "read";
    body.replaceChildren(...items.map((letter) => deadRow(letter, operator, () => this.requeue(letter))));
  }

  async requeue(letter) {
    const note = document.getElementById("dead-note");
    const answer = await confirmAction({
      title: "Requeue this dead letter?",
      text: `Send entry ${letter.original_id ?? letter.id} again on ${letter.stream ?? letter.source} and remove the dead letter.`,
      ok: "Requeue",
    });
    if (!answer.ok) return;
    try {
      const done = await api("POST", "/api/dead-letters/requeue", { stream: letter.source, id: letter.id });
      this.deadAction = done.new_id
        ? `Requeued ${letter.id} on ${done.stream} as ${done.new_id}.`
        : `${letter.id} was no longer there (requeued or purged meanwhile).`;
    } catch (problem) {
      this.deadAction = `Requeue of ${letter.id} failed: ${problem.message}.`;
    }
    note.textContent = this.deadAction;
    this.deadCount = null;
    this.load();
  }
}

// A deployment of several partitions answers one report per partition ("partitions",
// each with its "prefix"): shown as one, warnings naming their partition, streams listed
// by key, workflow counts summed.
function oneReport(status) {
  const parts = status.partitions;
  if (!Array.isArray(parts)) return status;
  const states = {};
  const counts = { states, partial: false, scanned: 0, listed: 0 };
  for (const part of parts) {
    const workflows = part.workflows || {};
    for (const [state, n] of Object.entries(workflows.states || {})) states[state] = (states[state] || 0) + n;
    counts.partial = counts.partial || Boolean(workflows.partial);
    counts.scanned += workflows.scanned || 0;
    counts.listed += workflows.listed || 0;
  }
  return {
    warnings: parts.flatMap((part) => (part.warnings || []).map((w) => `${part.prefix}: ${w}`)),
    notes: [...new Set(parts.flatMap((part) => part.notes || []))],
    lifecycle: null,
    kinds: parts.flatMap((part) => [part.lifecycle, ...(part.kinds || [])].filter(Boolean)),
    workflows: counts,
    lifecycle_workers: [...new Set(parts.flatMap((part) => part.lifecycle_workers || []))],
  };
}

function deadRow(letter, operator, requeue) {
  const event = letter.event || {};
  const what = el("td", {}, event.kind ?? "");
  if (event.workflow) {
    what.append(" ", el("a", { href: `#/workflows/${encodeURIComponent(event.workflow)}`, text: String(event.workflow) }));
  }
  const where = [event.key != null && `key ${event.key}`, event.name && String(event.name),
    event.attempt != null && `attempt ${event.attempt}`].filter(Boolean).join(", ");
  if (where) what.append(` (${where})`);
  const reason = [letter.reason, letter.error].filter(Boolean).join(": ");
  const button = el("button", { type: "button", "data-id": letter.id, text: "Requeue",
    "aria-label": `Requeue dead letter ${letter.id}` });
  button.disabled = !operator;
  button.addEventListener("click", requeue);
  return el("tr", { "data-id": letter.id },
    el("td", {}, time(letter.at)), el("td", { text: letter.source }), what,
    el("td", { text: reason }), el("td", { class: "num", text: letter.deliveries ?? "" }),
    el("td", {}, button));
}

function streamRow(info) {
  const group = info.group || {};
  const consumers = group.consumers || [];
  const names = consumers.map((c) => `${c.name} (pending ${c.pending}, idle ${Math.round(c.idle_ms / 1000)} s)`);
  const lag = group.lag === undefined ? "" : `${group.lag}${group.lag_capped ? "+" : ""}`;
  return el("tr", { "data-source": info.source },
    el("th", { scope: "row", text: info.source }),
    el("td", { text: info.stream }),
    el("td", { class: "num", text: info.length ?? "" }),
    el("td", { class: "num", text: lag }),
    el("td", { class: "num", text: group.pending ?? "" }),
    el("td", { class: "num", text: info.waiting ?? "" }),
    el("td", { title: names.join("\n"), text: `${consumers.length}${names.length ? `: ${names.join(", ")}` : ""}` }),
    el("td", { class: "num", text: info.dead_letters ?? "" }));
}
