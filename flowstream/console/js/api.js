// Calls to the flowstream HTTP API. The session token lives only in the HttpOnly cookie the
// server sets: this code never sees or stores it. Every state-changing request carries
// X-Flowstream: 1, which the server requires with cookie auth (a cross-site form cannot set it).

export class ApiError extends Error {
  /** A problem-details answer (or a network failure: status 0). */
  constructor(status, problem) {
    super(problemText(status, problem));
    this.status = status;
    this.problem = problem || {};
  }
}

function problemText(status, problem) {
  if (!problem) return status ? `HTTP ${status}` : "the server did not answer";
  const where = problem.line != null ? `${problem.line}:${problem.column ?? 1}: ` : "";
  const detail = problem.detail || problem.title || `HTTP ${status}`;
  return typeof detail === "string" ? where + detail : where + JSON.stringify(detail);
}

let onUnauthorized = () => {};

/** Called with no arguments whenever the server answers 401 (the session is gone). */
export function setUnauthorizedHandler(handler) {
  onUnauthorized = handler;
}

const CHANGES = new Set(["POST", "PUT", "PATCH", "DELETE"]);

/** JSON in, JSON out; throws ApiError for any answer that is not 2xx. */
export async function api(method, path, body, { quiet401 = false } = {}) {
  const headers = { Accept: "application/json" };
  if (CHANGES.has(method)) headers["X-Flowstream"] = "1";
  const init = { method, headers, credentials: "same-origin" };
  if (body instanceof FormData) {
    init.body = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new ApiError(0, { detail: `the server did not answer (${error.message})` });
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { detail: text.slice(0, 300) };
    }
  }
  if (!response.ok) {
    if (response.status === 401 && !quiet401) onUnauthorized();
    throw new ApiError(response.status, data);
  }
  return data;
}

/** A query string from the entries of ``params`` that have a value. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(name, String(value));
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

/**
 * Server-sent events from ``path``: ``onData`` gets each event's parsed JSON. EventSource
 * reconnects by itself; ``close()`` on the returned object stops it.
 */
export function subscribe(path, onData, onState = () => {}) {
  const source = new EventSource(path, { withCredentials: true });
  const handle = (event) => {
    let data;
    try {
      data = JSON.parse(event.data);
    } catch {
      return; // a keep-alive or a comment
    }
    onData(data, event.type);
  };
  // The API names its events: "workflows" (the list's first page), "workflow" (one
  // workflow), "gone" (it was deleted); "message" is an unnamed one.
  for (const name of ["message", "workflows", "workflow", "gone"]) {
    source.addEventListener(name, handle);
  }
  source.onopen = () => onState("live");
  source.onerror = () => onState(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  return source;
}
