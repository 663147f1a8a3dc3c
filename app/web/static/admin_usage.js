// #/usage: tokens, speech seconds and cost per day (charts), the top sessions, senders,
// chats, agents and models, and each budget with its use (bars). Filter by period and
// channel. Everything comes from GET /admin/api/usage and /admin/api/usage/budgets.

import { api } from "./api.js";
import { barChart, dayLabels, lineChart } from "./charts.js";
import { h, s } from "./dom.js";
import { emptyGuide } from "./admin_extra.js";
import { link, sessionLink } from "./admin_links.js";
import { t } from "./i18n.js";

const PERIODS = [
  [1, "Today"],
  [7, "7 days"],
  [30, "30 days"],
  [90, "90 days"],
];
const TOPS = [
  ["session", "Top sessions", "Session"],
  ["sender", "Top senders", "Sender"],
  ["chat", "Top chats", "Chat"],
  ["agent", "Top agents", "Agent"],
  ["model", "Models", "Model"],
];

const tokens = (r) => r.input_tokens + r.output_tokens;
const number = (n) => Number(n).toLocaleString("en-US");

function money(v, currency) {
  if (v === null || v === undefined) return "—";
  const digits = v !== 0 && Math.abs(v) < 0.01 ? 6 : 2;
  return `${v.toFixed(digits)} ${currency}`;
}

/** The last `days` UTC days, oldest first, as YYYY-MM-DD. */
function lastDays(days) {
  const out = [];
  const today = new Date();
  for (let i = days - 1; i >= 0; i--) {
    out.push(new Date(Date.UTC(today.getUTCFullYear(), today.getUTCMonth(), today.getUTCDate() - i)).toISOString().slice(0, 10));
  }
  return out;
}

function card(label, value, sub) {
  return h(
    "div",
    { class: "card", dataset: { stat: label } },
    h("div", { class: "k" }, t(label)),
    h("div", { class: "v" }, value),
    sub ? h("div", { class: "sub" }, sub) : null,
  );
}

function filters(days, channel, channels) {
  const go = (next) => {
    window.location.hash = link("usage", null, { days, channel, ...next });
  };
  return h(
    "div",
    { class: "filters usage-filters" },
    h(
      "select",
      { id: "usage-days", "aria-label": t("Period"), onChange: (ev) => go({ days: ev.target.value }) },
      PERIODS.map(([d, label]) => h("option", { value: d, selected: d === days }, t(label))),
    ),
    h(
      "select",
      { id: "usage-channel", "aria-label": t("Channel"), onChange: (ev) => go({ channel: ev.target.value }) },
      h("option", { value: "" }, t("All channels")),
      channels.map((c) => h("option", { value: c, selected: c === channel }, c)),
    ),
  );
}

function subjectCell(group, key) {
  if (group === "session") return sessionLink(key);
  return h("span", { class: "mono" }, key);
}

function topTable(group, title, header, rows, currency) {
  return h(
    "div",
    { class: "usage-top" },
    h("h2", null, t(title)),
    rows.length
      ? h(
          "div",
          { class: "table-wrap" },
          h(
            "table",
            { class: "grid", id: `usage-top-${group}` },
            h(
              "thead",
              null,
              h("tr", null, [t(header), t("Calls"), t("Tokens in / out"), t("Speech"), t("Cost")].map((x) => h("th", null, x))),
            ),
            h(
              "tbody",
              null,
              rows.map((r) =>
                h(
                  "tr",
                  { dataset: { key: r[group], tokens: tokens(r) } },
                  h("td", null, subjectCell(group, r[group])),
                  h("td", { class: "num" }, r.calls),
                  h("td", { class: "num" }, `${number(r.input_tokens)} / ${number(r.output_tokens)}`),
                  h("td", { class: "num" }, r.audio_seconds ? `${r.audio_seconds} s` : "—"),
                  h("td", { class: "num" }, money(r.cost, currency)),
                ),
              ),
            ),
          ),
        )
      : h("div", { class: "empty small" }, t("Nothing in this period.")),
  );
}

const BAR_W = 300;

/** One horizontal bar per subject: its use against the budget's limit. */
function budgetBlock(budget, currency) {
  const unit = budget.unit === "tokens" ? t("tokens") : currency;
  const fmt = (v) => (budget.unit === "tokens" ? number(v) : v.toFixed(4));
  const period = t(budget.period === "day" ? "today" : "this month");
  return h(
    "div",
    { class: "card budget", dataset: { scope: budget.scope, period: budget.period } },
    h("div", { class: "k" }, t("{scope} budget, {period}: {limit} {unit} each", { scope: t(budget.scope), period, limit: fmt(budget.limit), unit })),
    budget.subjects.length
      ? budget.subjects.map((sub) => {
          const share = Math.min(1, sub.share);
          const level = sub.share >= 0.95 ? "bad" : sub.share >= 0.8 ? "warn" : "";
          return h(
            "div",
            { class: "budget-row", dataset: { subject: sub.subject, share: sub.share } },
            h(
              "span",
              { class: "mono small budget-subject", title: sub.subject },
              sub.subject === "deployment" ? t("whole deployment") : sub.subject,
            ),
            s(
              "svg",
              { class: "budget-bar", viewBox: `0 0 ${BAR_W} 10`, preserveAspectRatio: "none", role: "img", "aria-label": `${Math.round(sub.share * 100)} %` },
              s("rect", { class: "track", x: 0, y: 0, width: BAR_W, height: 10 }),
              s("rect", { class: `fill ${level}`, x: 0, y: 0, width: (share * BAR_W).toFixed(1), height: 10 }),
            ),
            h("span", { class: "small num" }, `${fmt(sub.used)} / ${fmt(budget.limit)} · ${Math.round(sub.share * 100)} %`),
          );
        })
      : h("div", { class: "small muted" }, t("Nothing used yet.")),
  );
}

export async function renderUsage(_arg, params) {
  const days = Number(params.days) || 30;
  const channel = params.channel || "";
  const [byDay, byChannel, budgets, ...tops] = await Promise.all([
    api.usage({ group: "day", days, channel, limit: 366 }),
    api.usage({ group: "channel", days }),
    api.usageBudgets(),
    ...TOPS.map(([group]) => api.usage({ group, days, channel, limit: 10 })),
  ]);
  const currency = byDay.currency;
  const rows = byDay.rows;
  const sum = (f) => rows.reduce((acc, r) => acc + f(r), 0);
  const priced = rows.some((r) => r.cost !== null);
  const channels = byChannel.rows.map((r) => r.channel);
  if (channel && !channels.includes(channel)) channels.push(channel);

  const perDay = Object.fromEntries(rows.map((r) => [r.day, r]));
  const series = lastDays(days).map((day) => ({ t: day, row: perDay[day] }));
  const tokenPoints = series.map(({ t: day, row }) => ({ t: day, value: row ? tokens(row) : 0 }));
  const costPoints = series.map(({ t: day, row }) => ({ t: day, value: row && row.cost !== null ? row.cost : 0 }));
  const speech = sum((r) => r.audio_seconds);

  return [
    h("div", { class: "row" }, h("h1", null, t("Usage")), h("span", { class: "spacer" }), filters(days, channel, channels)),
    rows.length ? null : emptyGuide("usage"),
    h(
      "div",
      { class: "cards", id: "usage-cards" },
      card("Model calls", number(sum((r) => r.calls))),
      card("Input tokens", number(sum((r) => r.input_tokens)), t("{n} cached", { n: number(sum((r) => r.cached_tokens)) })),
      card("Output tokens", number(sum((r) => r.output_tokens))),
      card("Speech to text", `${Math.round(speech * 10) / 10} s`),
      card("Cost", priced ? money(sum((r) => r.cost || 0), currency) : "—", priced ? null : t("no price known for these models")),
    ),
    h(
      "div",
      { class: "charts usage-charts" },
      barChart(t("Tokens per day"), tokenPoints, { labels: dayLabels, id: "usage-tokens-chart" }),
      (days > 1 ? lineChart : barChart)(t("Cost per day ({c})", { c: currency }), costPoints, { labels: dayLabels, id: "usage-cost-chart" }),
    ),
    h("h2", null, t("Budgets")),
    budgets.budgets.length
      ? h("div", { class: "cards budgets", id: "usage-budgets" }, budgets.budgets.map((b) => budgetBlock(b, budgets.currency)))
      : h("div", { class: "empty small", id: "usage-no-budgets" }, t("No budgets set (USAGE_BUDGETS).")),
    h(
      "div",
      { class: "usage-tops" },
      TOPS.map(([group, title, header], i) => topTable(group, title, header, tops[i].rows, currency)),
    ),
  ];
}
