// Personal WeChat (iLink) QR login on the channels page: start a login, show the QR code
// as an image, follow its status until WeChat confirms (POST/GET /admin/api/channels/weixin/login).

import { api } from "./api.js";
import { h } from "./dom.js";
import { t } from "./i18n.js";

const POLL_MS = 1500;

export function weixinLoginPanel(paused) {
  const status = h("p", { id: "weixin-login-status", class: "small" }, paused ? paused : "");
  const qr = h("div", { id: "weixin-qr" });
  const button = h("button", { id: "weixin-login", type: "button" }, t("Log in with a QR code"));
  let shownUrl = null;

  function show(login) {
    status.textContent = `${t(login.status)}${login.message ? ` · ${login.message}` : ""}`;
    if (login.done || !login.qr_url) {
      qr.replaceChildren();
      shownUrl = null;
    } else if (login.qr_url !== shownUrl) {
      // The image comes from the server (the session cookie authenticates it); a new QR a new URL.
      shownUrl = login.qr_url;
      const src = `/admin/api/channels/weixin/login/qr.svg?u=${encodeURIComponent(login.qr_url)}`;
      qr.replaceChildren(
        h("img", { src, alt: t("WeChat login QR code"), width: 220, height: 220 }),
        h("p", { class: "small mono" }, login.qr_url),
      );
    }
  }

  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      let login = await api.weixinLogin();
      show(login);
      while (!login.done) {
        await new Promise((resolve) => setTimeout(resolve, POLL_MS));
        login = (await api.weixinLoginStatus()).login || login;
        show(login);
      }
    } catch (err) {
      status.textContent = String(err.detail || err);
    } finally {
      button.disabled = false;
    }
  });

  return h(
    "section",
    { id: "weixin-login-panel" },
    h("h2", null, t("Personal WeChat login")),
    h("p", { class: "small muted" }, t("Scan the code with WeChat and confirm on the phone.")),
    button,
    status,
    qr,
  );
}
