// Live updates for every dashboard page: one WebSocket on /admin/api/live; a `change`
// frame (something in inbox, outbox, runs, approvals or sessions changed) calls
// `onChange`, at most about once a second, never while the user is typing in the page or
// has changed a form there without submitting it (a refresh would put the form back).
// Reconnects with backoff; `onState(true|false)` drives the "live" pill.

// A form in the page the user changed and has not submitted: a refresh must not redraw it.
export function pageHasEdits() {
  return document.querySelector("#page form[data-edited]") !== null;
}

document.addEventListener("input", markEdited, true);
document.addEventListener("change", markEdited, true);

function markEdited(ev) {
  const form = ev.target instanceof Element ? ev.target.closest("#page form") : null;
  if (form) form.dataset.edited = "1";
}

export function startLive({ onChange, onState }) {
  let ws = null;
  let wanted = false;
  let attempt = 0;
  let retry = null;
  let due = false;
  let timer = null;

  const typing = () => {
    const el = document.activeElement;
    return el && el.closest("#page") && ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName);
  };
  const fire = () => {
    timer = null;
    if (!due) return;
    if (typing() || pageHasEdits() || document.visibilityState !== "visible") {
      timer = setTimeout(fire, 1000);
      return;
    }
    due = false;
    onChange();
  };
  const open = () => {
    wanted = true;
    if (ws) return;
    clearTimeout(retry);
    const socket = new WebSocket(`${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/admin/api/live`);
    ws = socket;
    socket.addEventListener("message", (ev) => {
      let frame;
      try {
        frame = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (frame.type === "hello") {
        attempt = 0;
        onState(true);
      } else if (frame.type === "change") {
        due = true;
        if (!timer) timer = setTimeout(fire, 300);
      }
    });
    socket.addEventListener("close", (ev) => {
      if (ws === socket) ws = null;
      onState(false);
      if (!wanted || ev.code === 4001 || ev.code === 4503) return;
      attempt += 1;
      retry = setTimeout(open, Math.min(15000, 500 * 2 ** Math.min(attempt, 5)));
    });
  };
  const close = () => {
    wanted = false;
    clearTimeout(retry);
    if (ws) ws.close();
    ws = null;
    onState(false);
  };
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && due && !timer) timer = setTimeout(fire, 0);
  });
  return { open, close };
}
