// Status: what `lifecycle status --json` shows, from GET /api/status, refreshed every 5 s.
import { api } from "./api.js";
import { el } from "./dom.js";

export class StatusPage {
  constructor(session) {
    this.session = session;
    this.timer = null;
    this.auto = document.getElementById("status-auto");
    document.getElementById("status-refresh").addEventListener("click", () => this.load());
    this.auto.addEventListener("change", () => this.schedule());
  }

  enter() {
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
    const notes = status.notes || [];
    document.getElementById("status-notes").replaceChildren(
      ...(notes.length ? notes.map((note) => el("li", { text: note })) : [el("li", { text: "None." })]));
    const workers = status.lifecycle_workers || [];
    document.getElementById("status-workers").textContent = `Lifecycle workers alive: ${workers.length}${
      workers.length ? ` (${workers.join(", ")})` : ""}.`;
  }
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
