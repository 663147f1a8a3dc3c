// The dashboard's run and approval pages (and the tables the session page reuses).

import { api } from "./api.js";
import { emptyGuide } from "./admin_extra.js";
import { link, ms, sessionLink } from "./admin_links.js";
import { ago, h, prettyJson } from "./dom.js";
import { t } from "./i18n.js";

export function outcomeBadge(outcome) {
  const cls = outcome === "ok" ? "ok" : outcome === "running" ? "running" : "bad";
  return h("span", { class: `badge ${cls}` }, outcome);
}

export function runRow(r) {
  return h(
    "tr",
    null,
    h("td", null, h("a", { href: link("run", r.id) }, `#${r.id}`)),
    h("td", null, sessionLink(r.session_key)),
    h("td", null, outcomeBadge(r.outcome)),
    h("td", null, ago(r.started_at)),
    h("td", { class: "num" }, ms(r.duration_ms)),
    h("td", { class: "num" }, r.iterations),
    h("td", { class: "mono" }, (r.tool_calls || []).map((c) => c.name).join(", ") || "—"),
    h("td", { class: "num" }, `${r.prompt_tokens} / ${r.completion_tokens}`),
    h("td", { class: "small" }, r.model || r.provider),
  );
}

export function runsTable(rows) {
  return h(
    "table",
    { class: "grid" },
    h("thead", null, h("tr", null, ["Run", "Session", "Outcome", "Started", "Duration", "Steps", "Tool calls", "Tokens in / out", "Model"].map((x) => h("th", null, t(x))))),
    h("tbody", null, rows),
  );
}

export async function renderRuns(_arg, params) {
  const data = await api.runs({ outcome: params.outcome, session_key: params.session_key, before_id: params.before_id, limit: 100 });
  const outcomes = ["ok", "running", "provider_error", "max_iterations", "cancelled", "error"];
  const filter = h(
    "form",
    {
      class: "filters",
      onSubmit: (ev) => {
        ev.preventDefault();
        const d = new FormData(ev.target);
        window.location.hash = link("runs", null, { outcome: d.get("outcome"), session_key: d.get("session_key").trim() });
      },
    },
    h("input", { type: "text", name: "session_key", placeholder: t("Session key"), value: params.session_key || "" }),
    h("select", { name: "outcome", "aria-label": t("Outcome") }, h("option", { value: "" }, t("Any outcome")),
      outcomes.map((o) => h("option", { value: o, selected: o === params.outcome }, o))),
    h("button", { class: "primary", type: "submit" }, t("Filter")),
  );
  const last = data.runs[data.runs.length - 1];
  return [
    h("h1", null, t("Runs")),
    filter,
    data.runs.length ? runsTable(data.runs.map(runRow)) : emptyGuide("runs"),
    data.runs.length === 100 && last
      ? h("p", null, h("a", { href: link("runs", null, { ...params, before_id: last.id }) }, t("Older runs →")))
      : null,
  ];
}

export async function renderRun(id) {
  const r = await api.run(id);
  const fact = (k, v) => h("tr", null, h("th", null, k), h("td", null, v));
  return [
    h("div", { class: "session-head" }, h("h1", null, `Run #${r.id}`), outcomeBadge(r.outcome)),
    h(
      "table",
      { class: "grid kv" },
      h(
        "tbody",
        null,
        fact("Session", sessionLink(r.session_key, r.generation)),
        fact("Generation", r.generation ?? "—"),
        fact("Provider / model", `${r.provider} / ${r.model || "—"}`),
        fact("Started", ago(r.started_at)),
        fact("Duration", ms(r.duration_ms)),
        fact("Model calls", r.iterations),
        fact("Tokens (prompt / completion)", `${r.prompt_tokens} / ${r.completion_tokens}`),
        fact("Events", h("span", { class: "mono small" }, (r.event_ids || []).join(", "))),
        r.error ? fact("Error", h("pre", null, r.error)) : null,
      ),
    ),
    h("h2", null, t("Tool calls")),
    (r.tool_calls || []).length
      ? h(
          "table",
          { class: "grid" },
          h("thead", null, h("tr", null, h("th", null, t("Call id")), h("th", null, t("Tool")), h("th", null, t("Time")))),
          h("tbody", null, r.tool_calls.map((c) => h("tr", null, h("td", { class: "mono" }, c.id), h("td", { class: "mono" }, c.name), h("td", { class: "num" }, ms(c.ms))))),
        )
      : h("div", { class: "empty" }, t("No tool calls.")),
    h("h2", null, t("Messages appended by this run")),
    r.messages.length
      ? h("p", null, r.messages.map((m) => h("span", { class: "pill" }, `#${m.seq} ${m.role}${m.name ? ` · ${m.name}` : ""}`)))
      : h("div", { class: "empty" }, t("None.")),
    h("h2", null, t("Approvals")),
    r.approvals.length ? approvalsTable(r.approvals.map(approvalRow)) : h("div", { class: "empty" }, t("No approval requests.")),
    Object.keys(r.details || {}).length ? [h("h2", null, t("Details")), h("pre", null, prettyJson(r.details))] : null,
  ];
}

// --- approvals -------------------------------------------------------------------------

export function approvalRow(a) {
  return h(
    "tr",
    null,
    h("td", { class: "num" }, a.id),
    h("td", null, sessionLink(a.session_key)),
    h("td", null, a.run_id ? h("a", { href: link("run", a.run_id) }, `#${a.run_id}`) : "—"),
    h("td", { class: "mono" }, a.tool_name),
    h("td", null, h("details", null, h("summary", { class: "small" }, "arguments"), h("pre", null, prettyJson(a.arguments)))),
    h("td", null, h("span", { class: `badge ${a.status}` }, a.status)),
    h("td", null, ago(a.requested_at)),
    h("td", null, a.decided_by || "—", a.decided_at ? [" · ", ago(a.decided_at)] : null),
  );
}

export function approvalsTable(rows) {
  return h(
    "table",
    { class: "grid" },
    h("thead", null, h("tr", null, ["#", "Session", "Run", "Tool", "Arguments", "Status", "Requested", "Decided"].map((x) => h("th", null, t(x))))),
    h("tbody", null, rows),
  );
}

export async function renderApprovals(_arg, params) {
  const data = await api.approvals({ status: params.status, limit: 200 });
  const statuses = ["pending", "approved", "denied", "expired"];
  return [
    h("h1", null, t("Approvals")),
    h("div", { class: "filters" },
      h("select", { "aria-label": t("Status"), onChange: (ev) => {
        window.location.hash = link("approvals", null, { status: ev.target.value });
      } }, h("option", { value: "" }, t("Any status")), statuses.map((st) => h("option", { value: st, selected: st === params.status }, st)))),
    data.approvals.length ? approvalsTable(data.approvals.map(approvalRow)) : emptyGuide("approvals"),
  ];
}
