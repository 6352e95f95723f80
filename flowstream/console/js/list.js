// The workflow list: filters, cursor pages, live through GET /api/workflows/stream.
import { api, query, subscribe } from "./api.js";
import { confirmAction } from "./confirm.js";
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
    this.streamFor = null; // the filters the open event stream was asked with
    this.reload = throttle(() => this.load(), 1000);
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
    this.bulk = document.getElementById("bulk");
    this.bulkResult = document.getElementById("bulk-result");
    this.bulk.addEventListener("submit", (event) => {
      event.preventDefault();
      this.bulkAction();
    });
  }

  /** One action on every workflow the filters select, however many (POST /api/actions). */
  async bulkAction() {
    const { state, flow, schedule } = this.filters();
    const action = document.getElementById("bulk-action").value;
    if (!state && !flow && !schedule) {
      this.bulkResult.textContent =
        "Choose a state, a flow or a schedule first: an action on every workflow is not offered.";
      return;
    }
    const selected = [state && `state ${state}`, flow && `flow ${flow}`, schedule && `schedule ${schedule}`]
      .filter(Boolean).join(" and ");
    const answer = await confirmAction({
      title: `${action} every matching workflow?`,
      text: `${action} every workflow with ${selected} — all of them, not only this page.${
        action === "delete" ? " Deleting cannot be undone." : ""}`,
      ok: `${action} all`,
      reason: action === "terminate",
      returnTo: document.getElementById("bulk-apply"),
    });
    if (!answer.ok) return;
    const filter = {};
    if (state) filter.state = state;
    if (flow) filter.flow = flow;
    if (schedule) filter.schedule = schedule;
    const body = { action, filter };
    if (answer.reason) body.reason = answer.reason;
    this.bulkResult.textContent = `${action}: sending…`;
    try {
      const done = await api("POST", "/api/actions", body);
      const refusals = (done.refusals || []).map((r) => `${r.id}: ${r.why}`).join("; ");
      this.bulkResult.textContent = `${action}: ${done.matched} matched, ${done.applied} sent, ${
        done.already} already so, ${done.refused} refused${refusals ? ` (${refusals})` : ""}.`;
    } catch (problem) {
      this.bulkResult.textContent = `${action} failed: ${problem.message}`;
    }
    this.load();
  }

  filters() {
    const data = new FormData(this.form);
    return {
      state: data.get("state"),
      flow: data.get("flow").trim(),
      schedule: data.get("schedule").trim(),
      limit: data.get("limit"),
    };
  }

  enter() {
    this.bulk.hidden = this.session.role === "read";
    this.bulkResult.textContent = "";
    this.load();
  }

  leave() {
    this.stopLive();
  }

  stopLive() {
    if (this.source) this.source.close();
    this.source = null;
    this.streamFor = null;
  }

  /** Follow the list with the current filters: the server sends their first page on each
   *  change (GET /api/workflows/stream), at most once a second. */
  follow(filters) {
    const wanted = query({ state: filters.state, flow: filters.flow, limit: filters.limit });
    if (this.source && this.streamFor === wanted) return;
    this.stopLive();
    this.streamFor = wanted;
    this.source = subscribe(`/api/workflows/stream${wanted}`, (data) => this.changed(data), (state) => {
      this.live.textContent = state === "live" ? "Live: updates as workflows change." : `Live updates: ${state}.`;
    });
  }

  changed(page) {
    if (!page || !Array.isArray(page.items)) return;
    if (this.filters().schedule) {
      // The event stream does not filter by schedule: its page is only a sign of change.
      this.reload();
      return;
    }
    if (this.cursor === null) {
      this.render(page);
      return;
    }
    // A later page: the rows it shows that changed are updated where they are.
    for (const item of page.items) {
      const row = this.rows.get(item.id);
      if (row) row.replaceWith(this.row(item));
    }
  }

  async load(focusTable = false) {
    const filters = this.filters();
    const { state, flow, schedule, limit } = filters;
    let page;
    try {
      page = await api("GET", `/api/workflows${query({ state, flow, schedule, limit, cursor: this.cursor })}`);
    } catch (problem) {
      this.summary.textContent = `Could not read the list: ${problem.message}`;
      return;
    }
    this.render(page);
    this.follow(filters);
    if (focusTable) {
      const link = this.body.querySelector("a");
      if (link) link.focus();
    }
  }

  render(page) {
    const { state, flow, schedule } = this.filters();
    // A live re-render must not take the keyboard focus away from the row it was on.
    const focused = this.body.contains(document.activeElement)
      ? document.activeElement.closest("tr")?.dataset.id : null;
    const fragment = document.createDocumentFragment();
    this.rows.clear();
    for (const item of page.items || []) fragment.append(this.row(item));
    this.body.replaceChildren(fragment);
    if (focused && this.rows.has(focused)) this.rows.get(focused).querySelector("a").focus();
    this.nextCursor = page.next || null;
    this.next.disabled = !this.nextCursor;
    this.first.disabled = this.cursor === null;
    const count = (page.items || []).length;
    const filtered = [state && `state ${state}`, flow && `flow ${flow}`, schedule && `schedule ${schedule}`]
      .filter(Boolean).join(", ");
    this.summary.textContent = `${count} workflow${count === 1 ? "" : "s"}${
      this.cursor ? " (later page)" : ""}${filtered ? `, ${filtered}` : ""}${this.nextCursor ? "; more on the next page" : ""}.`;
  }

  row(item) {
    const ended = item.tasks_ended ?? 0;
    const total = item.tasks_total ?? 0;
    const progress = el("progress", { max: Math.max(total, 1), value: Math.min(ended, Math.max(total, 1)),
      "aria-label": `${ended} of ${total} tasks ended` });
    const tr = el("tr", { "data-id": item.id },
      el("td", { class: "nowrap" }, el("a", { href: `#/workflows/${encodeURIComponent(item.id)}`, text: item.id })),
      el("td", { class: "nowrap", text: item.flow ?? "" }),
      el("td", {}, el("span", { class: `state badge ${stateClass(item.state)}`, text: item.state ?? "" })),
      el("td", { class: "nowrap" }, progress, ` ${ended} / ${total}`),
      el("td", {}, time(item.created)),
      el("td", {}, time(item.ended)));
    this.rows.set(item.id, tr);
    return tr;
  }
}
