// The dashboard's client of the admin REST API. Authentication is the HttpOnly session
// cookie set by POST /admin/login; every request carries X-Requested-With, which the
// server requires for cookie-authenticated writes (a cross-site form cannot send it).

export class Unauthorized extends Error {}

export class ApiError extends Error {
  constructor(status, detail) {
    super(`${status}: ${detail}`);
    this.status = status;
    this.detail = detail;
  }
}

async function request(method, path, { params, body } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== "") url.searchParams.set(k, v);
  }
  const headers = { "X-Requested-With": "chatgate-dashboard", Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 401) throw new Unauthorized("not signed in");
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, (data && data.detail) || resp.statusText);
  return data;
}

export const key = (k) => encodeURIComponent(k);

export const api = {
  login: (token) => request("POST", "/admin/login", { body: { token } }),
  logout: () => request("POST", "/admin/logout"),
  overview: (minutes) => request("GET", "/admin/api/overview", { params: { minutes } }),
  timeseries: (minutes) => request("GET", "/admin/api/timeseries", { params: { minutes } }),
  sessions: (params) => request("GET", "/admin/api/sessions", { params }),
  session: (k) => request("GET", `/admin/api/sessions/${key(k)}`),
  messages: (k, generation) =>
    request("GET", `/admin/api/sessions/${key(k)}/messages`, { params: { generation } }),
  generations: (k) => request("GET", `/admin/api/session-generations/${key(k)}`),
  sessionRuns: (k) => request("GET", `/admin/api/sessions/${key(k)}/runs`),
  reset: (k) => request("POST", `/admin/api/sessions/${key(k)}/reset`),
  archive: (k) => request("POST", `/admin/api/sessions/${key(k)}/archive`),
  reopen: (k, generation) =>
    request("POST", `/admin/api/sessions/${key(k)}/reopen`, { params: { generation } }),
  runs: (params) => request("GET", "/admin/api/runs", { params }),
  run: (id) => request("GET", `/admin/api/runs/${id}`),
  approvals: (params) => request("GET", "/admin/api/approvals", { params }),
  channels: () => request("GET", "/admin/api/channels"),
  weixinLogin: () => request("POST", "/admin/api/channels/weixin/login"),
  weixinLoginStatus: () => request("GET", "/admin/api/channels/weixin/login"),
  config: () => request("GET", "/admin/api/config"),
  cronJobs: () => request("GET", "/admin/api/cron-jobs"),
  usage: (params) => request("GET", "/admin/api/usage", { params }),
  usageBudgets: () => request("GET", "/admin/api/usage/budgets"),
  deadLetters: (params) => request("GET", "/admin/api/dead-letters", { params }),
  retryDeadLetters: (selection) => request("POST", "/admin/api/dead-letters/retry", { body: selection }),
  discardDeadLetters: (selection) => request("POST", "/admin/api/dead-letters/discard", { body: selection }),
};
