// Live updates for every dashboard page: one EventSource on /admin/api/live; a `change`
// event (something in inbox, outbox, runs, approvals or sessions changed) calls
// `onChange`, at most once a second, never while the user is typing in the page.

export function startLive({ onChange, onState }) {
  let source = null;
  let due = false;
  let timer = null;

  const typing = () => {
    const el = document.activeElement;
    return el && el.closest("#page") && ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName);
  };
  const fire = () => {
    timer = null;
    if (!due) return;
    if (typing() || document.visibilityState !== "visible") {
      timer = setTimeout(fire, 1000);
      return;
    }
    due = false;
    onChange();
  };
  const open = () => {
    if (source) return;
    source = new EventSource("/admin/api/live");
    source.addEventListener("hello", () => onState(true));
    source.addEventListener("change", () => {
      due = true;
      if (!timer) timer = setTimeout(fire, 300);
    });
    source.addEventListener("error", () => onState(source && source.readyState === EventSource.OPEN));
  };
  const close = () => {
    if (source) source.close();
    source = null;
    onState(false);
  };
  document.addEventListener("visibilitychange", () => {
    if (document.visibilityState === "visible" && due && !timer) timer = setTimeout(fire, 0);
  });
  return { open, close };
}
