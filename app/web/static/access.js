// The dashboard's access page: pending pairing codes, stored allowlists, each channel's
// mode and quotas. Data from /admin/api/access…; signed in through the dashboard's cookie.

import { $, ago, clear, h } from "./dom.js";

const page = $("#page");
const BASE = "/admin/api/access";

async function call(method, path, { params, body } = {}) {
  const url = new URL(BASE + path, window.location.origin);
  for (const [k, v] of Object.entries(params || {})) url.searchParams.set(k, v);
  const headers = { "X-Requested-With": "chatgate-dashboard", Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(url, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 401) {
    window.location.href = "/admin"; // sign in there, then come back
    throw new Error("not signed in");
  }
  const data = await resp.json().catch(() => null);
  if (!resp.ok) {
    const detail = data && data.detail;
    throw new Error(typeof detail === "string" ? detail : JSON.stringify(detail || resp.statusText));
  }
  return data;
}

function say(text, bad = false) {
  const box = $("#access-message");
  if (box) clear(box).append(h("span", { class: bad ? "error-text" : "muted" }, text));
}

async function act(work, done) {
  try {
    await work();
    await render();
    say(done);
  } catch (err) {
    say(String(err.message || err), true);
  }
}

function pendingTable(pending) {
  if (!pending.length) return h("div", { class: "empty" }, "No pairing requests are waiting.");
  return h("table", { class: "grid", id: "access-pending" },
    h("thead", {}, h("tr", {}, ["Code", "Channel", "Sender", "Chat", "First message", "Asked", "Expires", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, pending.map((p) => h("tr", {},
      h("td", { class: "mono" }, p.code),
      h("td", {}, p.channel),
      h("td", { class: "mono" }, p.sender_id),
      h("td", { class: "mono" }, p.chat_id),
      h("td", {}, p.text || ""),
      h("td", {}, ago(p.created_at)),
      h("td", {}, new Date(p.expires_at).toLocaleString()),
      h("td", {}, h("button", {
        type: "button",
        class: "primary",
        onClick: () => act(() => call("POST", "/approve", { body: { code: p.code } }), `Approved ${p.sender_id} on ${p.channel}.`),
      }, "Approve"))))));
}

function entriesTable(entries) {
  if (!entries.length) return h("div", { class: "empty" }, "No stored entries; only the static settings apply.");
  return h("table", { class: "grid", id: "access-entries" },
    h("thead", {}, h("tr", {}, ["Channel", "Kind", "Id", "Note", "Added by", "Added", ""].map((c) => h("th", {}, c)))),
    h("tbody", {}, entries.map((e) => h("tr", {},
      h("td", {}, e.channel),
      h("td", {}, e.kind),
      h("td", { class: "mono" }, e.subject),
      h("td", {}, e.note || ""),
      h("td", {}, e.added_by || ""),
      h("td", {}, ago(e.created_at)),
      h("td", {}, h("button", {
        type: "button",
        onClick: () => act(() => call("DELETE", "/entries", { params: { channel: e.channel, kind: e.kind, id: e.subject } }), `Removed ${e.subject}.`),
      }, "Remove"))))));
}

function addForm(channels) {
  const form = h("form", { class: "filters", id: "access-add" },
    h("select", { name: "channel", required: true }, Object.keys(channels).map((c) => h("option", { value: c }, c))),
    h("select", { name: "kind" }, h("option", { value: "sender" }, "sender"), h("option", { value: "chat" }, "group chat (everyone in it)")),
    h("input", { name: "id", placeholder: "id on the platform", required: true, maxlength: 256 }),
    h("input", { name: "note", placeholder: "note (optional)", maxlength: 200 }),
    h("button", { type: "submit", class: "primary" }, "Allow"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const data = Object.fromEntries(new FormData(form).entries());
    if (!data.note) delete data.note;
    act(() => call("POST", "/entries", { body: data }), `Allowed ${data.id} on ${data.channel}.`);
  });
  return form;
}

function quotaText(q) {
  const parts = [];
  if (q.sender_messages_per_minute) parts.push(`${q.sender_messages_per_minute} msg/min per sender`);
  if (q.session_messages_per_minute) parts.push(`${q.session_messages_per_minute} msg/min per session`);
  if (q.sender_tokens_per_day) parts.push(`${q.sender_tokens_per_day} tokens/day per sender`);
  if (q.session_tokens_per_day) parts.push(`${q.session_tokens_per_day} tokens/day per session`);
  return parts.join(", ") || "none";
}

function channelsTable(channels) {
  return h("table", { class: "grid", id: "access-channels" },
    h("thead", {}, h("tr", {}, ["Channel", "Mode", "Static senders", "Static chats", "Quotas"].map((c) => h("th", {}, c)))),
    h("tbody", {}, Object.entries(channels).map(([name, c]) => h("tr", {},
      h("td", {}, name),
      h("td", {}, c.access),
      h("td", { class: "mono" }, c.allowed_senders.join(", ") || "—"),
      h("td", { class: "mono" }, c.allowed_chats.join(", ") || "all"),
      h("td", {}, quotaText(c.quotas))))));
}

async function render() {
  const data = await call("GET", "");
  clear(page).append(
    h("h1", {}, "Who may talk to the bot"),
    h("div", { id: "access-message", role: "status" }),
    h("h2", {}, "Waiting for approval"),
    pendingTable(data.pending),
    h("h2", {}, "Allowed (stored)"),
    addForm(data.channels),
    entriesTable(data.entries),
    h("h2", {}, "Channels"),
    channelsTable(data.channels));
}

render().catch((err) => clear(page).append(h("div", { class: "empty", role: "alert" }, String(err.message || err))));
