// The console's shell: hash routes, login and logout, the role shown in the bar.
//   #/               workflow list        #/workflows/<id>  one workflow
//   #/start          start a workflow     #/status          streams and workers
//   #/login          the token form (shown whenever the API answers 401)
import { api, setUnauthorizedHandler } from "./api.js";
import { ListPage } from "./list.js";
import { StartPage } from "./start.js";
import { StatusPage } from "./status.js";
import { WorkflowPage } from "./workflow.js";

const session = { role: null };
const pages = {
  list: new ListPage(session),
  workflow: new WorkflowPage(session),
  start: new StartPage(session),
  status: new StatusPage(session),
  login: { enter() {}, leave() {} },
};
let current = null;
let afterLogin = "#/";

function route() {
  const hash = location.hash || "#/";
  const match = hash.match(/^#\/workflows\/(.+)$/);
  if (match) return ["workflow", { id: decodeURIComponent(match[1]) }];
  if (hash === "#/start") return ["start", {}];
  if (hash === "#/status") return ["status", {}];
  if (hash === "#/login") return ["login", {}];
  return ["list", {}];
}

function show(name, params) {
  if (current && pages[current].leave) pages[current].leave();
  current = name;
  for (const section of document.querySelectorAll(".page")) {
    section.hidden = section.id !== `page-${name}`;
  }
  for (const link of document.querySelectorAll("nav a")) {
    const here = link.dataset.page === name;
    if (here) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  // Focus the new page's heading, so keyboard and screen reader users start there.
  const heading = document.querySelector(`#page-${name} h1`);
  if (heading) heading.focus();
  pages[name].enter(params);
}

async function navigate() {
  const [name, params] = route();
  if (name !== "login" && session.role === null) {
    if (!(await loadSession())) {
      afterLogin = location.hash || "#/";
      location.hash = "#/login";
      return;
    }
  }
  show(name, params);
}

async function loadSession() {
  try {
    const answer = await api("GET", "/api/session", undefined, { quiet401: true });
    setRole((answer && answer.role) || "operate", answer?.auth !== false);
    return true;
  } catch {
    setRole(null);
    return false;
  }
}

function setRole(role, auth = true) {
  session.role = role;
  const who = !role ? "" : auth ? `signed in: ${role}` : "no authentication (development server)";
  document.getElementById("who").textContent = who;
  document.getElementById("logout").hidden = !role || !auth;
  document.body.dataset.role = role || "";
}

setUnauthorizedHandler(() => {
  setRole(null);
  if (current !== "login") {
    afterLogin = location.hash && location.hash !== "#/login" ? location.hash : "#/";
    location.hash = "#/login";
  }
});

document.getElementById("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = document.getElementById("login-token");
  const error = document.getElementById("login-error");
  error.textContent = "";
  try {
    await api("POST", "/api/session", { token: input.value }, { quiet401: true });
    input.value = ""; // the cookie holds it now; nothing in this page keeps it
    await loadSession();
    location.hash = afterLogin === "#/login" ? "#/" : afterLogin;
  } catch (problem) {
    error.textContent = problem.status === 401 || problem.status === 403
      ? "That token was not accepted."
      : `Could not log in: ${problem.message}`;
    input.focus();
  }
});

document.getElementById("logout").addEventListener("click", async () => {
  try {
    await api("DELETE", "/api/session", undefined, { quiet401: true });
  } catch {
    // already gone: the login form is what to show either way
  }
  setRole(null);
  location.hash = "#/login";
});

window.addEventListener("hashchange", navigate);
navigate();
