// Start a workflow: paste or upload a .flow, check it as it is typed (POST /api/flows/check,
// debounced), give input JSON, start it (POST /api/workflows) and go to its page.
import { api } from "./api.js";
import { debounce } from "./dom.js";

export class StartPage {
  constructor(session) {
    this.session = session;
    this.form = document.getElementById("start-form");
    this.flow = document.getElementById("start-flow");
    this.input = document.getElementById("start-input");
    this.check = document.getElementById("start-check");
    this.caret = document.getElementById("start-caret");
    this.inputCheck = document.getElementById("start-input-check");
    this.error = document.getElementById("start-error");
    this.checked = 0; // sequence number: an older check's answer never overwrites a newer one
    this.problem = null;
    const later = debounce(() => this.checkFlow(), 400);
    this.flow.addEventListener("input", later);
    this.input.addEventListener("input", () => this.checkInput());
    document.getElementById("start-file").addEventListener("change", (event) => this.upload(event));
    this.check.addEventListener("click", () => this.goToProblem());
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.start();
    });
  }

  enter() {
    this.error.textContent = "";
    if (this.flow.value.trim()) this.checkFlow();
  }

  leave() {}

  async upload(event) {
    const file = event.target.files[0];
    if (!file) return;
    this.flow.value = await file.text();
    this.checkFlow();
  }

  async checkFlow() {
    const text = this.flow.value;
    const sequence = ++this.checked;
    if (!text.trim()) {
      this.show(null, "");
      return;
    }
    try {
      const answer = await api("POST", "/api/flows/check", { flow: text });
      if (sequence !== this.checked) return;
      const kinds = (answer.kinds || []).join(", ");
      this.show(null, `Compiles: ${answer.nodes} nodes${kinds ? `; task kinds: ${kinds}` : ""}.`);
    } catch (problem) {
      if (sequence !== this.checked) return;
      this.show(problem, problem.message, text);
    }
  }

  /** Shows the check's outcome; for an error with a position, the line and a caret under it. */
  show(problem, text, source = "") {
    this.problem = problem;
    this.check.textContent = text;
    this.check.className = `check ${problem ? "bad" : "ok"}`;
    this.flow.setAttribute("aria-invalid", problem ? "true" : "false");
    const line = problem?.problem?.line;
    if (line && source) {
      const column = problem.problem.column || 1;
      const shown = source.split("\n")[line - 1] ?? "";
      this.caret.textContent = `${String(line).padStart(4)} | ${shown}\n       ${" ".repeat(Math.max(0, column - 1))}^`;
      this.caret.hidden = false;
      this.check.title = "Click to put the cursor there";
    } else {
      this.caret.hidden = true;
      this.check.title = "";
    }
  }

  goToProblem() {
    const line = this.problem?.problem?.line;
    if (!line) return;
    const lines = this.flow.value.split("\n");
    let offset = 0;
    for (let i = 0; i < line - 1 && i < lines.length; i++) offset += lines[i].length + 1;
    offset += Math.max(0, (this.problem.problem.column || 1) - 1);
    this.flow.focus();
    this.flow.setSelectionRange(offset, offset);
  }

  checkInput() {
    const text = this.input.value.trim();
    if (!text) {
      this.inputCheck.textContent = "";
      return true;
    }
    try {
      JSON.parse(text);
      this.inputCheck.textContent = "";
      this.input.setAttribute("aria-invalid", "false");
      return true;
    } catch (error) {
      this.inputCheck.textContent = `Input is not JSON: ${error.message}`;
      this.inputCheck.className = "check bad";
      this.input.setAttribute("aria-invalid", "true");
      return false;
    }
  }

  async start() {
    this.error.textContent = "";
    if (!this.checkInput()) {
      this.input.focus();
      return;
    }
    const body = { flow: this.flow.value };
    const input = this.input.value.trim();
    if (input) body.input = JSON.parse(input);
    const priority = Number(document.getElementById("start-priority").value || 0);
    if (priority) body.priority = priority;
    const id = document.getElementById("start-id").value.trim();
    if (id) body.id = id;
    try {
      const answer = await api("POST", "/api/workflows", body);
      location.hash = `#/workflows/${encodeURIComponent(answer.id)}`;
    } catch (problem) {
      this.error.textContent = `Not started: ${problem.message}`;
      if (problem.problem?.line) this.show(problem, problem.message, this.flow.value);
    }
  }
}
