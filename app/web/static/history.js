// A session's history for the dashboard, with each assistant tool-call message and its
// tool results shown together as one group (the unit trimming never splits).

import { ago, h, prettyJson } from "./dom.js";
import { t } from "./i18n.js";

function who(m, extra) {
  return h(
    "div",
    { class: "who" },
    h("strong", null, t(m.role)),
    h("span", null, `#${m.seq}`),
    m.run_id ? h("span", null, t("run #{id}", { id: m.run_id })) : null,
    extra,
    h("span", { class: "spacer" }),
    ago(m.created_at),
  );
}

function plain(m, orphan = false) {
  return h(
    "div",
    { class: `hmsg ${m.role}`, dataset: { seq: m.seq } },
    who(m, orphan ? h("span", { class: "orphan" }, t("result of {id} (call not in view)", { id: m.tool_call_id })) : m.name),
    m.role === "tool" ? h("pre", null, prettyJson(m.content ?? "")) : h("div", { class: "text" }, m.content ?? ""),
    m.parts && m.parts.length ? h("div", { class: "small muted" }, t("+ {n} attachment(s): {types}", { n: m.parts.length, types: m.parts.map((p) => p.type).join(", ") })) : null,
  );
}

function group(assistant, results) {
  const bySeq = [assistant.seq, ...results.map((r) => r.seq)];
  return h(
    "div",
    { class: "toolgroup", dataset: { seq: assistant.seq } },
    h(
      "div",
      { class: "who" },
      h("strong", null, t("tool calls ({n})", { n: assistant.tool_calls.length })),
      h("span", null, `#${Math.min(...bySeq)}–${Math.max(...bySeq)}`),
      assistant.run_id ? h("span", null, t("run #{id}", { id: assistant.run_id })) : null,
      h("span", { class: "spacer" }),
      ago(assistant.created_at),
    ),
    assistant.content ? h("div", { class: "text" }, assistant.content) : null,
    assistant.tool_calls.map((call) => {
      const fn = call.function || {};
      const result = results.find((r) => r.tool_call_id === call.id);
      return h(
        "div",
        { class: "toolcall", dataset: { callId: call.id } },
        h("div", { class: "row" }, h("span", { class: "name" }, fn.name || "?"), h("span", { class: "small muted mono" }, call.id)),
        h("details", null, h("summary", { class: "small muted" }, t("arguments")), h("pre", null, prettyJson(fn.arguments ?? "{}"))),
        result
          ? [h("div", { class: "small muted" }, t("result #{seq}", { seq: result.seq })), h("pre", { class: "result" }, prettyJson(result.content ?? ""))]
          : h("div", { class: "orphan" }, t("no result recorded (interrupted run?)")),
      );
    }),
  );
}

export function renderHistory(messages) {
  const out = [];
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i];
    if (m.role === "assistant" && m.tool_calls && m.tool_calls.length) {
      const ids = new Set(m.tool_calls.map((c) => c.id));
      const results = [];
      while (i + 1 < messages.length && messages[i + 1].role === "tool" && ids.has(messages[i + 1].tool_call_id)) {
        results.push(messages[++i]);
      }
      out.push(group(m, results));
    } else {
      out.push(plain(m, m.role === "tool"));
    }
  }
  return out.length ? h("div", { class: "history", id: "history" }, out) : h("div", { class: "empty" }, t("No messages in this generation."));
}
