// The chat page: one conversation at a time through the browser gateway (/ws).

import { $, clear, h, prettyJson } from "./dom.js";
import { GatewayClient } from "./gateway.js";
import { t, translateStatic } from "./i18n.js";
import { renderMarkdown } from "./markdown.js";

const TOKEN_KEY = "chatgate.gatewayToken";
const NEW_KEY = "\u0000new";

const thread = $("#thread");
const scroller = $("#scroller");
const select = $("#session-select");
const conn = $("#conn");

let client = null;
let allowed = { keys: [], prefix: null };
let seen = new Set(); // "session_id:seq" already on screen
const pendingByClientId = new Map(); // client_message_id -> bubble
const pendingByEvent = new Map(); // event_id -> bubble
const streaming = new Map(); // run_id -> bubble
const toolCalls = new Map(); // tool_call_id -> {root, status, result}
const approvalCards = new Map(); // approval_id -> card
const afterReady = []; // notices to show once the next session is on screen
const closing = new Set(); // client_message_id / event_id of a /new, /reset or /end sent here
const liveText = new WeakMap(); // streaming bubble -> the text so far (rendered as Markdown)
const CLOSING_COMMAND = /^\/(new|reset|end)(\s|$)/i;

// --- token: from the URL fragment (#token=…&session=…), the tab, or the form ----------

function readFragment() {
  const params = new URLSearchParams(window.location.hash.slice(1));
  const token = params.get("token");
  const session = params.get("session");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    // Keep the token out of the address bar, history and screenshots.
    const rest = session ? `#session=${encodeURIComponent(session)}` : "";
    history.replaceState(null, "", window.location.pathname + rest);
  }
  return { token: token || sessionStorage.getItem(TOKEN_KEY), session };
}

function showTokenPanel(message = "") {
  if (client) client.close();
  client = null;
  $("#chat").classList.add("hidden");
  $("#token-panel").classList.remove("hidden");
  $("#token-error").textContent = message;
  $("#token-input").focus();
}

$("#token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const token = $("#token-input").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#token-input").value = "";
  start(token, null);
});

$("#forget").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  showTokenPanel();
});

// --- rendering -------------------------------------------------------------------------

function nearBottom() {
  return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120;
}

// Committed messages go above the bubbles still waiting for the server, so the thread
// stays in seq order when missed messages arrive after a reconnect.
function add(el) {
  const stick = nearBottom();
  const firstPending = thread.querySelector(".msg.pending");
  if (firstPending && el !== firstPending) thread.insertBefore(el, firstPending);
  else thread.append(el);
  if (stick) scroller.scrollTop = scroller.scrollHeight;
  return el;
}

function addPending(el) {
  thread.append(el);
  scroller.scrollTop = scroller.scrollHeight;
  return el;
}

function bubble(role, text, extra = {}) {
  if (role === "assistant") return renderMarkdown(h("div", { class: "msg assistant", ...extra }), text);
  return h("div", { class: `msg ${role}`, ...extra }, text ?? "");
}

function notice(text, cls = "notice") {
  return add(h("div", { class: cls }, text));
}

function resetView() {
  clear(thread);
  seen = new Set();
  pendingByClientId.clear();
  pendingByEvent.clear();
  streaming.clear();
  toolCalls.clear();
  approvalCards.clear();
  closing.clear();
}

function toolCallElement(call) {
  const fn = call.function || {};
  const status = h("span", { class: "small muted tool-status" }, t("running…"));
  const result = h("pre", { class: "tool-result" }, t("waiting for the result…"));
  const root = h(
    "details",
    { class: "tool", dataset: { callId: call.id } },
    h("summary", null, t("Tool call") + " ", h("strong", null, fn.name || "?"), " · ", status),
    h("div", { class: "label" }, t("arguments")),
    h("pre", null, prettyJson(fn.arguments ?? "{}")),
    h("div", { class: "label" }, t("result")),
    result,
  );
  toolCalls.set(call.id, { root, status, result });
  return root;
}

function renderMessage(m) {
  const id = `${m.session_id}:${m.seq}`;
  if (m.seq !== undefined && seen.has(id)) return;
  seen.add(id);
  if (m.role === "user") {
    const mine = m.event_id && pendingByEvent.get(m.event_id);
    if (mine) {
      mine.classList.remove("pending");
      mine.dataset.seq = m.seq;
      pendingByEvent.delete(m.event_id);
      add(mine); // moves it to its place in seq order
      return;
    }
    add(bubble("user", m.content, { dataset: { seq: m.seq } }));
    return;
  }
  if (m.role === "assistant") {
    const live = streaming.get(m.run_id) || (streaming.size === 1 ? [...streaming.values()][0] : null);
    if (live) {
      streaming.delete([...streaming].find(([, el]) => el === live)[0]);
      if (m.tool_calls && m.tool_calls.length && !m.content) live.remove();
    }
    if (m.content || !(m.tool_calls && m.tool_calls.length)) {
      if (live && live.isConnected) {
        renderMarkdown(live, m.content ?? "");
        live.classList.remove("streaming");
        live.dataset.seq = m.seq;
      } else {
        add(bubble("assistant", m.content, { dataset: { seq: m.seq } }));
      }
    }
    for (const call of m.tool_calls || []) add(toolCallElement(call));
    return;
  }
  if (m.role === "tool") {
    const entry = toolCalls.get(m.tool_call_id);
    let target = entry;
    if (!target) {
      add(toolCallElement({ id: m.tool_call_id, function: { name: m.name, arguments: "" } }));
      target = toolCalls.get(m.tool_call_id);
    }
    target.result.textContent = prettyJson(m.content ?? "");
    target.status.textContent = toolFailed(m.content) ? t("error") : t("done");
    target.root.classList.add("done");
    for (const [approvalId, card] of approvalCards) {
      if (card.dataset.toolCallId === m.tool_call_id) {
        card.remove();
        approvalCards.delete(approvalId);
      }
    }
  }
}

function toolFailed(content) {
  try {
    const data = JSON.parse(content);
    return Boolean(data && typeof data === "object" && "error" in data);
  } catch {
    return false;
  }
}

function renderDelta(frame) {
  let live = streaming.get(frame.run_id);
  if (!live) {
    live = add(bubble("assistant", "", { class: "msg assistant streaming" }));
    streaming.set(frame.run_id, live);
  }
  const stick = nearBottom();
  const text = (liveText.get(live) ?? "") + (frame.text ?? "");
  liveText.set(live, text);
  renderMarkdown(live, text);
  if (stick) scroller.scrollTop = scroller.scrollHeight;
}

function renderApproval(a) {
  const id = a.approval_id ?? a.id;
  if (id === undefined || approvalCards.has(id)) return;
  const tool = a.tool_name || a.tool || t("a tool");
  const state = h("span", { class: "small muted" });
  const decide = (approve) => {
    if (!client) return;
    client.decide(id, approve);
    for (const b of card.querySelectorAll("button")) b.disabled = true;
    state.textContent = approve ? t("approval sent…") : t("denial sent…");
  };
  const card = h(
    "div",
    { class: "approval", dataset: { approvalId: id, toolCallId: a.tool_call_id || "" } },
    h("strong", null, t("Approval needed: {tool}", { tool })),
    h("pre", null, prettyJson(a.arguments ?? {})),
    a.expires_at ? h("div", { class: "small muted" }, t("Denied automatically at {time}.", { time: new Date(a.expires_at).toLocaleTimeString() })) : null,
    h(
      "div",
      { class: "row" },
      h("button", { class: "primary", type: "button", onClick: () => decide(true) }, t("Approve")),
      h("button", { class: "danger", type: "button", onClick: () => decide(false) }, t("Deny")),
      state,
    ),
  );
  approvalCards.set(id, card);
  const call = toolCalls.get(a.tool_call_id);
  if (call) call.status.textContent = t("waiting for approval");
  add(card);
}

// --- session switcher ------------------------------------------------------------------

const known = new Map(); // session key -> label, everything this tab has seen

function fillSessions(extra = []) {
  const current = client ? client.sessionKey : null;
  for (const k of allowed.keys) if (!known.has(k)) known.set(k, k);
  for (const s of extra) known.set(s.key, s.status && s.status !== "active" ? `${s.key} · ${s.status}` : s.key);
  if (current && !known.has(current)) known.set(current, current);
  clear(select);
  for (const [k, label] of known) select.append(h("option", { value: k, selected: k === current }, label));
  if (allowed.prefix !== null && allowed.prefix !== undefined) {
    select.append(h("option", { value: NEW_KEY }, allowed.prefix ? t("+ new conversation under {prefix}", { prefix: allowed.prefix }) : t("+ new conversation")));
  }
}

select.addEventListener("change", () => {
  let key = select.value;
  if (key === NEW_KEY) {
    const stamp = new Date().toISOString().replace(/[-:T]/g, "").slice(0, 14);
    key = `${allowed.prefix}${stamp}`;
  }
  if (!client || key === client.sessionKey) return;
  resetView();
  notice(t("Opening {key}…", { key }));
  client.attach(key);
  fillSessions(); // shows the key just chosen (a new one included) as selected
});

// --- connection ------------------------------------------------------------------------

function setStatus({ state, code, inMs }) {
  conn.className = "pill";
  if (state === "connected") {
    conn.classList.add("ok");
    conn.textContent = t("connected");
  } else if (state === "reconnecting") {
    conn.classList.add("warn");
    conn.textContent = inMs ? t("reconnecting in {n} s…", { n: Math.max(1, Math.round(inMs / 1000)) }) : t("reconnecting…");
    if (code === 4503 && !conn.dataset.disabledNoticeShown) {
      conn.dataset.disabledNoticeShown = "1";
      notice(t("The browser gateway is not enabled on this server (CHANNELS must include browser)."), "notice error-text");
    }
  } else if (state === "offline") {
    conn.classList.add("bad");
    conn.textContent = t("offline");
  } else {
    conn.textContent = t("connecting…");
  }
  conn.dataset.state = state;
}

function wsUrl() {
  return `${window.location.protocol === "https:" ? "wss:" : "ws:"}//${window.location.host}/ws`;
}

function onFrame(frame) {
  switch (frame.type) {
    case "authenticated":
      allowed = { keys: frame.session_keys || [], prefix: frame.key_prefix ?? null };
      fillSessions();
      client.listSessions();
      break;
    case "sessions":
      fillSessions(frame.sessions || []);
      break;
    case "ready": {
      if (!frame.resumed) resetView();
      for (const text of afterReady.splice(0)) notice(text, "notice error-text");
      fillSessions();
      history.replaceState(null, "", `${window.location.pathname}#session=${encodeURIComponent(frame.session_key)}`);
      const ended = frame.status === "expired" || frame.status === "archived";
      if (!frame.resumed && (ended || !frame.messages.length)) {
        // After /new (or an expiry) the key's newest generation is closed: its messages are
        // history, not this conversation. The next message opens a new one.
        notice(
          ended
            ? t("The last conversation in {key} has ended. Say hello to start a new one.", { key: frame.session_key })
            : t("This is {key}. Say hello.", { key: frame.session_key }),
        );
        if (ended) {
          for (const a of frame.pending_approvals || []) renderApproval(a);
          break;
        }
      }
      if (frame.truncated) notice(t("Some older messages are not shown."));
      for (const m of frame.messages || []) renderMessage({ session_id: frame.session_id, ...m });
      for (const a of frame.pending_approvals || []) renderApproval(a);
      break;
    }
    case "accepted": {
      const mine = pendingByClientId.get(frame.client_message_id);
      if (mine) {
        pendingByClientId.delete(frame.client_message_id);
        if (frame.event_id) pendingByEvent.set(frame.event_id, mine);
      }
      if (closing.delete(frame.client_message_id) && frame.event_id) closing.add(frame.event_id);
      break;
    }
    case "message":
      renderMessage(frame);
      break;
    case "delta":
      renderDelta(frame);
      break;
    case "approval_request":
      renderApproval(frame);
      break;
    case "notice": {
      const text = frame.text || "";
      if (frame.in_reply_to_event && closing.has(frame.in_reply_to_event)) {
        // The answer to our /new (/reset, /end): the conversation on screen is over.
        resetView();
        notice(text);
        break;
      }
      const dup = [...approvalCards.keys()].some((id) => text.includes(`/approve ${id}`));
      if (!dup) notice(text);
      break;
    }
    case "new_session": {
      // The first message of a key opens its first generation: nothing to mark then.
      if (frame.previous_session_id === null || frame.previous_session_id === undefined) break;
      if (!thread.querySelector(".msg:not(.pending), .tool, .approval")) break; // already cleared
      const divider = h("div", { class: "divider" }, t("— new conversation —"));
      const firstPending = [...pendingByClientId.values(), ...pendingByEvent.values()].find((el) => el.isConnected);
      if (firstPending) thread.insertBefore(divider, firstPending);
      else add(divider);
      break;
    }
    case "error":
      if (frame.code === "forbidden" && allowed.keys.length && client.sessionKey !== allowed.keys[0]) {
        // A link to a key this token may not open: fall back to the token's own session,
        // and say why once it is shown (its `ready` clears the view).
        afterReady.push(`⚠ ${frame.detail || frame.code}`);
        client.attach(allowed.keys[0]);
      } else {
        notice(`⚠ ${frame.detail || frame.code}`, "notice error-text");
      }
      break;
    default:
      break;
  }
}

function start(token, sessionKey) {
  if (client) client.close();
  $("#token-panel").classList.add("hidden");
  $("#chat").classList.remove("hidden");
  resetView();
  known.clear(); // a new token: the old one's keys are not this one's
  client = new GatewayClient({ url: wsUrl(), token, sessionKey });
  client.addEventListener("frame", (ev) => onFrame(ev.detail));
  client.addEventListener("status", (ev) => setStatus(ev.detail));
  client.addEventListener("unauthorized", (ev) => {
    const why = ev.detail.code === 4002 ? t("The token has expired.") : t("The gateway refused this token.");
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenPanel(why);
  });
  client.connect();
  $("#text").focus();
}

// --- composer --------------------------------------------------------------------------

function sendCurrent() {
  const box = $("#text");
  const text = box.value.trim();
  if (!text || !client) return;
  const clientId = client.send(text);
  if (CLOSING_COMMAND.test(text)) closing.add(clientId);
  const mine = addPending(bubble("user", text, { class: "msg user pending", dataset: { clientId } }));
  pendingByClientId.set(clientId, mine);
  box.value = "";
  autosize();
}

function autosize() {
  const box = $("#text");
  box.style.height = "auto";
  box.style.height = `${Math.min(180, box.scrollHeight)}px`;
}

$("#composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sendCurrent();
});

$("#text").addEventListener("keydown", (ev) => {
  // Enter sends; Shift+Enter is a new line; never while an IME is composing (CJK input).
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    sendCurrent();
  }
});
$("#text").addEventListener("input", autosize);

$("#stop").addEventListener("click", () => client && client.stop());

// A link pasted into the address bar of an open page (say, a good token after a refused
// one) changes only the fragment: no reload, so pick it up here.
window.addEventListener("hashchange", () => {
  const carriesToken = new URLSearchParams(window.location.hash.slice(1)).has("token");
  const { token, session } = readFragment();
  if (carriesToken) start(token, session);
  else if (client && session && session !== client.sessionKey) {
    resetView();
    client.attach(session);
  }
});

translateStatic();
const initial = readFragment();
if (initial.token) start(initial.token, initial.session);
else showTokenPanel();
