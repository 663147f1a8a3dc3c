// Dashboard pieces kept out of admin.js: the configuration page and empty-state guidance.

import { api } from "./api.js";
import { h } from "./dom.js";
import { t } from "./i18n.js";

const GUIDES = {
  sessions: [
    "No sessions yet",
    "A session starts with the first message on any channel. Open the chat page (/) with a gateway token, or send a signed webhook, then come back.",
  ],
  "sessions-filtered": ["No sessions match", "Clear the filters or search for part of a key."],
  runs: [
    "No runs yet",
    "A run is one answer of the model. Send a message on any channel and its run appears here with model, tokens and tool calls.",
  ],
  approvals: [
    "No approval requests",
    "Tools marked risky ask before they run. Their requests, and who approved or denied them, are listed here.",
  ],
  "dead-letters": [
    "No dead letters",
    "Events and replies that failed every retry land here, to be retried or discarded. Nothing has failed.",
  ],
  cron: [
    "No cron jobs",
    "Ask the assistant to remind you of something (\"remind me in 10 minutes\"), or add CRON to CHANNELS; scheduled jobs are listed here.",
  ],
  usage: [
    "No model calls in this period",
    "Every model call is counted with its tokens and cost as it happens (and each voice note transcribed, with its seconds). Send a message on any channel, or pick a longer period.",
  ],
  channels: ["No channels", "Enable channels with CHANNELS=webhook,browser,… and restart."],
};

/** What an empty page is for and how to fill it. */
export function emptyGuide(page) {
  const [title, text] = GUIDES[page];
  return h("div", { class: "empty-guide", dataset: { empty: page } }, h("strong", null, t(title)), t(text));
}

function shown(row) {
  if (row.secret) return row.is_set ? h("span", { class: "secret" }, row.value) : h("span", { class: "muted" }, t("not set"));
  if (row.value === null || row.value === undefined || row.value === "") return h("span", { class: "muted" }, t("not set"));
  return h("code", null, typeof row.value === "string" ? row.value : JSON.stringify(row.value));
}

/** #/config: the effective settings, read-only, secrets redacted by the server. */
export async function renderConfig() {
  const data = await api.config();
  return [
    h("h1", null, t("Configuration")),
    h("p", { class: "small muted" }, t("Read only. Settings come from the environment (or .env) at start-up; secrets are never shown.")),
    data.sections.map((section) => [
      h("h2", null, section.name),
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { class: "grid config-table", dataset: { section: section.name } },
          h("thead", null, h("tr", null, [t("Environment variable"), t("Value"), ""].map((x) => h("th", null, x)))),
          h(
            "tbody",
            null,
            section.settings.map((row) =>
              h(
                "tr",
                { dataset: { setting: row.env }, title: row.description || "" },
                h("td", { class: "mono" }, row.env),
                h("td", null, shown(row)),
                h(
                  "td",
                  { class: "small muted" },
                  row.secret ? t("secret") : "",
                  !row.secret && row.default ? t("default") : "",
                ),
              ),
            ),
          ),
        ),
      ),
    ]),
  ];
}
