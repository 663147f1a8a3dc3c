// The admin dashboard: a single page with hash routes. All data comes from /admin/api/….

import { api, ApiError, Unauthorized } from "./api.js";
import { barChart, lineChart } from "./charts.js";
import { $, ago, clear, h, prettyJson } from "./dom.js";
import { renderHistory } from "./history.js";
import { link, ms, parseHash, sessionLink } from "./admin_links.js";
import { approvalRow, approvalsTable, renderApprovals, renderRun, renderRuns, runRow, runsTable } from "./admin_runs.js";
import { emptyGuide, renderConfig } from "./admin_extra.js";
import { renderUsage } from "./admin_usage.js";
import { weixinLoginPanel } from "./admin_weixin.js";
import { currentLang, setLang, t, translateStatic } from "./i18n.js";
import { pageHasEdits, startLive } from "./live.js";
import { themeButton } from "./theme.js";

const page = $("#page");
let refreshTimer = null;
let renderToken = 0;

// --- routing ---------------------------------------------------------------------------

const views = {
  overview: renderOverview,
  sessions: renderSessions,
  session: renderSession,
  runs: renderRuns,
  run: renderRun,
  approvals: renderApprovals,
  usage: renderUsage,
  "dead-letters": renderDeadLetters,
  cron: renderCron,
  channels: renderChannels,
  config: renderConfig,
};

// `refresh`: a live update redrawing the page the user is on; it gives way to their edits.
async function route(refresh = false) {
  if (refresh && pageHasEdits()) return;
  clearInterval(refreshTimer);
  refreshTimer = null;
  const { route: name, arg, params } = parseHash();
  const view = views[name] || renderOverview;
  const navName = name === "session" ? "sessions" : name === "run" ? "runs" : name;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.route === navName);
  }
  const mine = ++renderToken;
  try {
    const content = await view(arg, params);
    if (mine !== renderToken) return; // a newer navigation won
    if (refresh && pageHasEdits()) return; // the user changed a form while this was loading
    showApp();
    clear(page).append(...[content].flat(Infinity).filter((x) => x !== null && x !== undefined && x !== false));
  } catch (err) {
    if (mine !== renderToken) return;
    if (err instanceof Unauthorized) return showLogin();
    clear(page).append(errorBox(err));
    if (err instanceof ApiError && err.status === 503) return showDisabled();
    showApp();
  }
}

function errorBox(err) {
  const text =
    err instanceof ApiError && err.status === 503
      ? t("The admin API is disabled on this server: set ADMIN_TOKEN and restart.")
      : err instanceof ApiError
        ? t("The server answered {s}: {d}", { s: err.status, d: err.detail })
        : String(err);
  return h("div", { class: "empty", role: "alert" }, text);
}

function toast(text) {
  for (const old of document.querySelectorAll(".toast")) old.remove();
  const el = h("div", { class: "toast", role: "status" }, text);
  document.body.append(el);
  setTimeout(() => el.remove(), 3000);
}

// --- login -----------------------------------------------------------------------------

// No ADMIN_TOKEN on the server (503): nothing to sign in to or out of.
function showDisabled() {
  $("#login").classList.add("hidden");
  $("#nav").classList.add("hidden");
  $("#logout").classList.add("hidden");
  live.close();
}

function showLogin() {
  clearInterval(refreshTimer);
  live.close();
  $("#login").classList.remove("hidden");
  $("#nav").classList.add("hidden");
  $("#logout").classList.add("hidden");
  clear(page);
  $("#login-token").focus();
}

function showApp() {
  $("#login").classList.add("hidden");
  $("#nav").classList.remove("hidden");
  $("#logout").classList.remove("hidden");
  live.open();
}

// --- live updates, language, theme -------------------------------------------------------

const live = startLive({
  onChange: () => route(true),
  onState: (on) => {
    const el = $("#live");
    el.classList.toggle("hidden", false);
    el.classList.toggle("on", on);
    el.dataset.on = on ? "1" : "0";
    el.textContent = on ? t("live") : t("offline");
  },
});

function showLanguage() {
  translateStatic();
  const button = $("#lang");
  const other = currentLang() === "zh" ? "en" : "zh";
  button.textContent = other === "zh" ? "中文" : "English";
  button.lang = other === "zh" ? "zh" : "en";
  button.dataset.switchTo = other;
  showTheme();
  const el = $("#live");
  if (el.dataset.on) el.textContent = el.dataset.on === "1" ? t("live") : t("offline");
}

$("#lang").addEventListener("click", () => {
  setLang($("#lang").dataset.switchTo);
  showLanguage();
  if (!$("#login").classList.contains("hidden")) return;
  route();
});

const showTheme = themeButton($("#theme"), (next) => t(next === "dark" ? "Switch to dark theme" : "Switch to light theme"));

$("#login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const error = $("#login-error");
  error.textContent = "";
  try {
    await api.login($("#login-token").value);
    $("#login-token").value = "";
    await route();
  } catch (err) {
    error.textContent = err instanceof Unauthorized ? t("Wrong token.") : `Sign-in failed: ${err.message}`;
  }
});

$("#logout").addEventListener("click", async () => {
  await api.logout().catch(() => null);
  showLogin();
});

// --- overview --------------------------------------------------------------------------

const WINDOWS = [
  [15, "15 min"],
  [60, "1 hour"],
  [360, "6 hours"],
  [1440, "24 hours"],
];

function card(label, value, sub, bad = false) {
  return h(
    "div",
    { class: "card", dataset: { stat: label } },
    h("div", { class: "k" }, t(label)),
    h("div", { class: bad ? "v bad" : "v" }, value ?? "—"),
    sub ? h("div", { class: "sub" }, sub) : null,
  );
}

async function renderOverview(_arg, params) {
  const minutes = Number(params.minutes) || 60;
  const [ov, ts] = await Promise.all([api.overview(minutes), api.timeseries(minutes)]);
  const s = ov.sessions;
  const failures = ov.failures.inbox_failed + ov.failures.outbox_failed + ov.failures.runs_failed;
  const picker = h(
    "select",
    {
      "aria-label": t("Window"),
      onChange: (ev) => {
        window.location.hash = link("overview", null, { minutes: ev.target.value });
      },
    },
    WINDOWS.map(([m, label]) => h("option", { value: m, selected: m === minutes }, t(label))),
  );
  const points = ts.points;
  const series = (key) => points.map((p) => ({ t: p.t, value: p[key] }));
  const failuresSeries = points.map((p) => ({ t: p.t, value: p.run_failures + p.send_failures }));

  if (!refreshTimer) {
    // The charts move with the clock even when nothing changed: redraw each minute.
    refreshTimer = setInterval(() => {
      if (document.visibilityState === "visible" && parseHash().route === "overview") route();
    }, 60000);
  }
  return [
    h("div", { class: "row" }, h("h1", null, t("Overview")), h("span", { class: "spacer" }), picker),
    h(
      "div",
      { class: "cards" },
      card("Active sessions", s.active ?? 0),
      card("Suspended", s.suspended ?? 0),
      card("Expired", s.expired ?? 0, t("{n} archived", { n: s.archived ?? 0 })),
      card("Events / min", ov.events_per_minute, t("{a} in window · {b} this minute", { a: ov.events_in_window, b: ov.events_last_minute })),
      card("Run latency p50", ms(ov.runs.latency_ms.p50), t("p95 {a} · {b} runs", { a: ms(ov.runs.latency_ms.p95), b: ov.runs.count })),
      card("Inbox backlog", ov.backlog.inbox_pending, t("events not processed yet"), ov.backlog.inbox_pending > 100),
      card("Outbox backlog", ov.backlog.outbox_pending, t("replies not delivered yet"), ov.backlog.outbox_pending > 100),
      card(
        "Failures",
        failures,
        t("{a} runs · {b} events · {c} deliveries", { a: ov.failures.runs_failed, b: ov.failures.inbox_failed, c: ov.failures.outbox_failed }),
        failures > 0,
      ),
    ),
    h(
      "div",
      { class: "charts" },
      barChart(t("Events per minute"), series("events")),
      lineChart(t("Run latency (avg per minute)"), series("run_ms_avg"), { unit: " ms" }),
      barChart(t("Replies delivered per minute"), series("sent")),
      barChart(t("Failures per minute"), failuresSeries, { bad: true }),
    ),
    h("p", { class: "small muted" }, t("Updated {t} · live", { t: new Date(ov.generated_at).toLocaleTimeString() })),
  ];
}

// --- sessions --------------------------------------------------------------------------

const STATUSES = ["active", "suspended", "expired", "archived"];

async function renderSessions(_arg, params) {
  const [list, chans] = await Promise.all([
    api.sessions({
      channel: params.channel,
      status: params.status,
      q: params.q,
      key_prefix: params.key_prefix,
      include_archived: params.include_archived ? "true" : undefined,
      limit: 200,
    }),
    api.channels(),
  ]);
  const form = h(
    "form",
    {
      class: "filters",
      role: "search",
      onSubmit: (ev) => {
        ev.preventDefault();
        const data = new FormData(ev.target);
        window.location.hash = link("sessions", null, {
          channel: data.get("channel"),
          status: data.get("status"),
          q: data.get("q").trim(),
          key_prefix: data.get("key_prefix").trim(),
          include_archived: data.get("include_archived") ? "1" : "",
        });
      },
    },
    h("input", { type: "search", name: "q", placeholder: t("Search key or message text"), value: params.q || "" }),
    h("input", { type: "text", name: "key_prefix", placeholder: t("Key prefix"), value: params.key_prefix || "" }),
    h(
      "select",
      { name: "channel", "aria-label": t("Channel") },
      h("option", { value: "" }, t("All channels")),
      chans.channels.map((c) => h("option", { value: c.name, selected: c.name === params.channel }, c.name)),
    ),
    h(
      "select",
      { name: "status", "aria-label": t("Status") },
      h("option", { value: "" }, t("Any status")),
      STATUSES.map((st) => h("option", { value: st, selected: st === params.status }, st)),
    ),
    h(
      "label",
      { class: "row small" },
      h("input", { type: "checkbox", name: "include_archived", checked: Boolean(params.include_archived) }),
      t("include archived"),
    ),
    h("button", { class: "primary", type: "submit" }, t("Filter")),
  );
  const rows = list.sessions.map((x) =>
    h(
      "tr",
      { dataset: { key: x.key } },
      h("td", { "data-label": t("Key") }, sessionLink(x.key)),
      h("td", { "data-label": t("Channel") }, x.channel),
      h("td", { "data-label": t("Status") }, h("span", { class: `badge ${x.status}` }, x.status)),
      h("td", { class: "num", "data-label": t("Gen") }, x.generation),
      h("td", { class: "num", "data-label": t("Messages") }, x.message_count),
      h("td", { "data-label": t("Last active") }, ago(x.last_active_at)),
      x.title ? h("td", { class: "muted", "data-label": t("Title") }, x.title) : h("td", { class: "muted" }),
    ),
  );
  return [
    h("h1", null, t("Sessions")),
    form,
    rows.length
      ? h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "grid sessions-table", id: "sessions-table" },
            h("thead", null, h("tr", null, ["Key", "Channel", "Status", "Gen", "Messages", "Last active", "Title"].map((x) => h("th", null, t(x))))),
            h("tbody", null, rows),
          ),
        )
      : emptyGuide(Object.values(params).some((v) => v) ? "sessions-filtered" : "sessions"),
  ];
}

// --- one session -----------------------------------------------------------------------

async function renderSession(key, params) {
  const [current, gens, runs, approvals] = await Promise.all([
    api.session(key),
    api.generations(key),
    api.sessionRuns(key),
    api.approvals({ session_key: key }),
  ]);
  const generation = Number(params.generation) || current.generation;
  const shown = gens.generations.find((g) => g.generation === generation) || current;
  const history = await api.messages(key, generation);
  const isCurrent = shown.generation === current.generation;

  const actions = h(
    "div",
    { class: "actions" },
    h("button", { type: "button", id: "action-reset", onClick: () => doReset(key, current) }, t("Reset")),
    h("button", { type: "button", id: "action-archive", onClick: () => doArchive(key) }, t("Archive")),
    gens.generations.length > 1 || !isCurrent
      ? h(
          "span",
          { class: "row" },
          h(
            "select",
            { id: "generation-select", "aria-label": t("Generation"), onChange: (ev) => {
              window.location.hash = link("session", key, { generation: ev.target.value });
            } },
            gens.generations.map((g) =>
              h("option", { value: g.generation, selected: g.generation === generation },
                t(g.current ? "generation {g} · {status} (current) · {n} msgs" : "generation {g} · {status} · {n} msgs", { g: g.generation, status: t(g.status), n: g.message_count })),
            ),
          ),
          isCurrent ? null : h("button", { type: "button", id: "action-reopen", onClick: () => doReopen(key, generation) }, t("Reopen generation {g}", { g: generation })),
        )
      : null,
  );

  const facts = h(
    "div",
    { class: "facts" },
    h("span", null, t("channel {name}", { name: current.channel })),
    h("span", null, t("generation {a} of {b}", { a: current.generation, b: current.generations })),
    h("span", null, t("{n} messages", { n: current.message_count })),
    h("span", null, t("{n} runs", { n: current.runs })),
    h("span", null, t("inbox pending {n}", { n: current.inbox_pending })),
    h("span", null, t("outbox pending {n}", { n: current.outbox_pending })),
    h("span", null, t("last active") + " ", ago(current.last_active_at)),
    current.lease && current.lease.owner ? h("span", null, t("lease {owner} (fence {fence})", { owner: current.lease.owner, fence: current.lease.fence })) : null,
  );

  const runRows = runs.runs.map(runRow);
  const approvalRows = approvals.approvals.map(approvalRow);
  return [
    h(
      "div",
      { class: "session-head" },
      h("h1", null, key),
      h("span", { class: `badge ${current.status}`, id: "session-status", dataset: { status: current.status } }, t(current.status)),
    ),
    facts,
    actions,
    isCurrent ? null : h("p", { class: "muted" }, t("Showing generation {g} ({status}); the current one is {c}.", { g: generation, status: t(shown.status), c: current.generation })),
    h("h2", null, t("History ({n} messages)", { n: history.messages.length })),
    renderHistory(history.messages),
    h("h2", null, t("Runs")),
    runRows.length ? runsTable(runRows) : h("div", { class: "empty" }, t("No runs yet.")),
    h("h2", null, t("Approvals")),
    approvalRows.length ? approvalsTable(approvalRows) : h("div", { class: "empty" }, t("No approval requests.")),
  ];
}

async function waitForChange(key, before, tries = 40) {
  for (let i = 0; i < tries; i++) {
    const now = await api.session(key).catch(() => null);
    if (now && (now.status !== before.status || now.generation !== before.generation)) return now;
    await new Promise((r) => setTimeout(r, 250));
  }
  return null;
}

async function doReset(key, before) {
  $("#action-reset").disabled = true;
  try {
    await api.reset(key);
    toast(t("Reset queued behind the session's events…"));
    const after = await waitForChange(key, before);
    toast(after ? t("Session is now {status}.", { status: after.status }) : t("Reset is still queued."));
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin();
    toast(t("Reset failed: {error}", { error: err.message }));
  }
  await route();
}

async function doArchive(key) {
  try {
    await api.archive(key);
    toast(t("Archived."));
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin();
    toast(t("Archive failed: {error}", { error: err.message }));
  }
  await route();
}

async function doReopen(key, generation) {
  try {
    await api.reopen(key, generation);
    toast(t("Generation {g} is current again.", { g: generation }));
    window.location.hash = link("session", key);
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin();
    toast(t("Reopen failed: {error}", { error: err.message }));
  }
}

// --- dead letters ----------------------------------------------------------------------
// Failed events and deliveries: retry once more or discard, one by one or all shown.

function deadLetterSelection(params) {
  const sel = {};
  if (params.kind) sel.kind = params.kind;
  if (params.channel) sel.channel = params.channel;
  if (params.session_key) sel.session_key = params.session_key;
  if (params.error_contains) sel.error_contains = params.error_contains;
  return sel;
}

async function resolveDeadLetters(action, selection) {
  try {
    const result = action === "retry" ? await api.retryDeadLetters(selection) : await api.discardDeadLetters(selection);
    const done = result.retried || result.discarded || [];
    toast(t(action === "retry" ? "Retried {n} dead letter(s)." : "Discarded {n} dead letter(s).", { n: done.length }));
  } catch (err) {
    if (err instanceof Unauthorized) return showLogin();
    toast(`${action} failed: ${err.message}`);
  }
  await route();
}

function deadLetterRow(d) {
  return h(
    "tr",
    { dataset: { id: d.id } },
    h("td", { class: "mono" }, d.id),
    h("td", null, d.channel),
    h("td", null, sessionLink(d.session_key)),
    h("td", { class: "small" }, d.text || "—"),
    h("td", { class: "small error-text" }, d.error || "—"),
    h("td", { class: "num" }, d.attempts),
    h("td", null, ago(d.failed_at)),
    h(
      "td",
      null,
      h("button", { type: "button", class: "retry", onClick: () => resolveDeadLetters("retry", { ids: [d.id] }) }, t("Retry")),
      " ",
      h("button", { type: "button", class: "discard", onClick: () => resolveDeadLetters("discard", { ids: [d.id] }) }, t("Discard")),
    ),
  );
}

async function renderDeadLetters(_arg, params) {
  const data = await api.deadLetters({ ...deadLetterSelection(params), limit: 500 });
  const selection = deadLetterSelection(params);
  const filtered = Object.keys(selection).length > 0;
  const all = filtered ? selection : { ...selection, all: true };
  const rows = data.dead_letters.map(deadLetterRow);
  return [
    h("h1", null, t("Dead letters")),
    h("p", { class: "small" }, `Unresolved: ${data.counts.inbox} event(s), ${data.counts.outbox} delivery(ies). A retry gives exactly one more attempt.`),
    h(
      "form",
      { class: "filters", onSubmit: (ev) => {
        ev.preventDefault();
        const form = new FormData(ev.target);
        window.location.hash = link("dead-letters", null, Object.fromEntries(form.entries()));
      } },
      h("select", { name: "kind", "aria-label": t("Kind") },
        h("option", { value: "" }, t("Events and deliveries")),
        ["inbox", "outbox"].map((k) => h("option", { value: k, selected: k === params.kind }, k))),
      h("input", { name: "channel", placeholder: "channel", value: params.channel || "" }),
      h("input", { name: "session_key", placeholder: "session key", value: params.session_key || "" }),
      h("input", { name: "error_contains", placeholder: "error contains", value: params.error_contains || "" }),
      h("button", { type: "submit" }, t("Filter")),
    ),
    rows.length
      ? [
          h("div", { class: "actions" },
            h("button", { type: "button", id: "dead-retry-all", onClick: () => resolveDeadLetters("retry", all) }, t(filtered ? "Retry all matching" : "Retry all")),
            " ",
            h("button", { type: "button", id: "dead-discard-all", onClick: () => resolveDeadLetters("discard", all) }, t(filtered ? "Discard all matching" : "Discard all"))),
          h("table", { class: "grid", id: "dead-letters-table" },
            h("thead", null, h("tr", null, ["Id", "Channel", "Session", "Text", "Error", "Attempts", "Failed", ""].map((x) => h("th", null, t(x))))),
            h("tbody", null, rows)),
        ]
      : emptyGuide("dead-letters"),
  ];
}

// --- cron jobs -------------------------------------------------------------------------

async function renderCron() {
  let data;
  try {
    data = await api.cronJobs();
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      return [h("h1", null, t("Cron jobs")), h("div", { class: "empty", id: "cron-missing" }, "This server has no cron jobs API (/admin/api/cron-jobs answered 404).")];
    }
    throw err;
  }
  const jobs = Array.isArray(data) ? data : data.jobs || data.cron_jobs || [];
  const rows = jobs.map((j) => {
    const target = j.target || { channel: j.target_channel, chat_id: j.target_chat_id };
    return h(
      "tr",
      null,
      h("td", { class: "num" }, j.id),
      h("td", null, j.name, h("div", { class: "small muted" }, (j.prompt || "").slice(0, 80))),
      h("td", { class: "mono" }, j.schedule || (j.run_at ? `once at ${j.run_at}` : "—"), j.timezone && j.timezone !== "UTC" ? ` (${j.timezone})` : ""),
      h("td", null, h("span", { class: `badge ${j.enabled ? "ok" : ""}` }, j.enabled ? "enabled" : "disabled")),
      h("td", null, ago(j.next_fire_at)),
      h("td", null, ago(j.last_fired_at)),
      h("td", { class: "num" }, j.max_runs ? `${j.runs ?? 0} / ${j.max_runs}` : j.runs ?? "—"),
      h("td", null, j.source_session_key ? sessionLink(j.source_session_key) : "—"),
      h("td", { class: "mono small" }, target.channel ? `${target.channel}:${target.chat_id}` : "—"),
      h("td", { class: "small" }, j.last_error || ""),
    );
  });
  return [
    h("h1", null, t("Cron jobs")),
    rows.length
      ? h(
          "table",
          { class: "grid", id: "cron-table" },
          h("thead", null, h("tr", null, ["#", "Name", "Schedule", "State", "Next", "Last", "Runs", "Session", "Target", "Last error"].map((x) => h("th", null, t(x))))),
          h("tbody", null, rows),
        )
      : emptyGuide("cron"),
  ];
}

// --- channels --------------------------------------------------------------------------

function connectionCell(k) {
  const owner = k.owner ? (k.held_here ? `${k.owner} (this replica)` : k.owner) : "nobody";
  const taken = k.takeovers ? ` · ${k.takeovers} takeover${k.takeovers === 1 ? "" : "s"}` : "";
  return h("div", { class: "mono", title: k.name, dataset: { connection: k.name } }, `${owner}${taken}`);
}

async function renderChannels() {
  const data = await api.channels();
  const weixin = data.channels.find((c) => c.name === "weixin");
  const rows = data.channels.map((c) =>
    h(
      "tr",
      { dataset: { channel: c.name } },
      h("td", { class: "mono" }, c.name),
      h("td", null, h("span", { class: `badge ${c.health}` }, c.health)),
      h("td", null, c.enabled ? c.adapter : h("span", { class: "muted" }, "not running")),
      h("td", { class: "small" }, c.session_scope ? `${c.session_scope} · ${c.busy_policy}` : "—"),
      h("td", null, ago(c.last_inbound_at)),
      h("td", null, ago(c.last_outbound_at)),
      h("td", { class: "num" }, `${c.inbound_recent} / ${c.outbound_recent}`),
      h("td", { class: "num" }, `${c.inbox_pending} / ${c.outbox_pending}`),
      h("td", { class: "num" }, `${c.inbox_failed} / ${c.outbox_failed}`),
      h("td", { class: "small" }, c.last_error ? [c.last_error, " · ", ago(c.last_error_at)] : ""),
      h("td", { class: "small" }, c.connections.map((k) => connectionCell(k))),
    ),
  );
  return [
    h("h1", null, t("Channels")),
    h("p", { class: "small muted" }, `Counts "recent" are the last ${data.window_minutes} minutes; in / out pairs are inbox / outbox.`),
    rows.length
      ? h(
          "table",
          { class: "grid", id: "channels-table" },
          h("thead", null, h("tr", null, ["Channel", "Health", "Adapter", "Scope · busy", "Last inbound", "Last outbound", "Recent in / out", "Pending in / out", "Failed in / out", "Last error", "Connection owner"].map((x) => h("th", null, t(x))))),
          h("tbody", null, rows),
        )
      : emptyGuide("channels"),
    weixin && weixin.enabled ? weixinLoginPanel(weixin.health === "degraded" ? weixin.last_error : "") : null,
  ];
}

window.addEventListener("hashchange", () => route());
showLanguage();
route();
