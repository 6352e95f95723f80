// The workflow list: filters, cursor pages, live through GET /api/workflows/stream.
import { api, query, subscribe } from "./api.js";
import { el, stateClass, throttle, time } from "./dom.js";

export class ListPage {
  constructor(session) {
    this.session = session;
    this.form = document.getElementById("list-filters");
    this.body = document.querySelector("#list-table tbody");
    this.summary = document.getElementById("list-summary");
    this.live = document.getElementById("list-live");
    this.next = document.getElementById("list-next");
    this.first = document.getElementById("list-first");
    this.cursor = null; // of the page shown (null: the first)
    this.nextCursor = null;
    this.rows = new Map(); // workflow id -> <tr>
    this.source = null;
    // Live events only mark the page stale; it is re-read at most once a second.
    this.refresh = throttle(() => this.load(), 1000);
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.cursor = null;
      this.load();
    });
    this.form.addEventListener("change", (event) => {
      if (event.target.tagName === "SELECT") {
        this.cursor = null;
        this.load();
      }
    });
    this.next.addEventListener("click", () => {
      this.cursor = this.nextCursor;
      this.load(true);
    });
    this.first.addEventListener("click", () => {
      this.cursor = null;
      this.load(true);
    });
  }

  filters() {
    const data = new FormData(this.form);
    return { state: data.get("state"), flow: data.get("flow").trim(), limit: data.get("limit") };
  }

  enter() {
    this.load();
    this.source = subscribe("/api/workflows/stream", (data) => this.changed(data), (state) => {
      this.live.textContent = state === "live" ? "live" : `live updates ${state}`;
    });
  }

  leave() {
    if (this.source) this.source.close();
    this.source = null;
  }

  changed(data) {
    // An event that carries a summary already shown updates that row in place; anything
    // else (a new workflow, a list of ids, a bare notice) re-reads the page.
    const items = Array.isArray(data?.items) ? data.items : data && data.id ? [data] : [];
    const known = items.length && items.every((item) => this.rows.has(item.id) && "state" in item);
    if (known) {
      for (const item of items) this.rows.get(item.id).replaceWith(this.row(item));
    } else {
      this.refresh();
    }
  }

  async load(focusTable = false) {
    const { state, flow, limit } = this.filters();
    let page;
    try {
      page = await api("GET", `/api/workflows${query({ state, flow, limit, cursor: this.cursor })}`);
    } catch (problem) {
      this.summary.textContent = `Could not read the list: ${problem.message}`;
      return;
    }
    const fragment = document.createDocumentFragment();
    this.rows.clear();
    for (const item of page.items || []) fragment.append(this.row(item));
    this.body.replaceChildren(fragment);
    this.nextCursor = page.next || null;
    this.next.disabled = !this.nextCursor;
    this.first.disabled = this.cursor === null;
    const count = (page.items || []).length;
    const filtered = [state && `state ${state}`, flow && `flow ${flow}`].filter(Boolean).join(", ");
    this.summary.textContent = `${count} workflow${count === 1 ? "" : "s"}${
      this.cursor ? " (later page)" : ""}${filtered ? `, ${filtered}` : ""}${this.nextCursor ? "; more on the next page" : ""}.`;
    if (focusTable) {
      const link = this.body.querySelector("a");
      if (link) link.focus();
    }
  }

  row(item) {
    const ended = item.tasks_ended ?? 0;
    const total = item.tasks_total ?? 0;
    const progress = el("progress", { max: Math.max(total, 1), value: Math.min(ended, Math.max(total, 1)),
      "aria-label": `${ended} of ${total} tasks ended` });
    const tr = el("tr", { "data-id": item.id },
      el("td", {}, el("a", { href: `#/workflows/${encodeURIComponent(item.id)}`, text: item.id })),
      el("td", { text: item.flow ?? "" }),
      el("td", {}, el("span", { class: `state ${stateClass(item.state)}-text`, text: item.state ?? "" })),
      el("td", {}, progress, ` ${ended} / ${total}`),
      el("td", {}, time(item.created)),
      el("td", {}, time(item.ended)));
    this.rows.set(item.id, tr);
    return tr;
  }
}
