// A client of the browser gateway (/ws, protocol in docs/gateway.md): authenticates,
// attaches, keeps `session_id` + the highest `seq` seen, reconnects with backoff and
// resumes from there, and resends unacknowledged messages (same client_message_id, so
// the server answers `duplicate` instead of processing them twice).

const NO_RETRY = new Set([4001, 4002]);

function randomId() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}

export class GatewayClient extends EventTarget {
  constructor({ url, token, sessionKey = null }) {
    super();
    this.url = url;
    this.token = token;
    this.sessionKey = sessionKey;
    this.sessionId = null;
    this.lastSeq = 0;
    this.unacked = new Map(); // client_message_id -> frame
    this.ws = null;
    this.attempt = 0;
    this.closedByUs = false;
    this.retryTimer = null;
    this.pingTimer = null;
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  connect() {
    this.closedByUs = false;
    clearTimeout(this.retryTimer);
    this.emit("status", { state: this.attempt ? "reconnecting" : "connecting" });
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("open", () => {
      ws.send(JSON.stringify({ type: "auth", token: this.token }));
    });
    ws.addEventListener("message", (ev) => {
      let frame;
      try {
        frame = JSON.parse(ev.data);
      } catch {
        return;
      }
      this.handle(frame);
    });
    ws.addEventListener("close", (ev) => {
      clearInterval(this.pingTimer);
      if (this.ws !== ws) return;
      this.ws = null;
      if (this.closedByUs) return;
      if (NO_RETRY.has(ev.code)) {
        this.emit("unauthorized", { code: ev.code, reason: ev.reason });
        this.emit("status", { state: "offline", code: ev.code });
        return;
      }
      this.attempt += 1;
      const delay = Math.min(10000, 400 * 2 ** Math.min(this.attempt - 1, 5)) * (0.8 + Math.random() * 0.4);
      this.emit("status", { state: "reconnecting", code: ev.code, reason: ev.reason, inMs: Math.round(delay) });
      this.retryTimer = setTimeout(() => this.connect(), delay);
    });
  }

  handle(frame) {
    switch (frame.type) {
      case "authenticated":
        this.attach(this.sessionKey, true);
        this.pingTimer = setInterval(() => this.raw({ type: "ping" }), 25000);
        break;
      case "ready":
        this.attempt = 0;
        this.sessionKey = frame.session_key;
        // A resume continues the same generation; anything else starts the view afresh.
        frame.resumed = Boolean(this.resuming && frame.session_id === this.sessionId);
        this.lastSeq = frame.resumed ? Math.max(frame.last_seq || 0, this.lastSeq) : frame.last_seq || 0;
        this.sessionId = frame.session_id ?? null;
        this.resuming = false;
        this.emit("status", { state: "connected" });
        for (const f of this.unacked.values()) this.raw(f);
        break;
      case "accepted":
        this.unacked.delete(frame.client_message_id);
        break;
      case "new_session":
        frame.previous_session_id = this.sessionId;
        this.sessionId = frame.session_id;
        this.lastSeq = 0;
        break;
      case "message":
        if (frame.session_id !== undefined && frame.session_id !== null) this.sessionId = frame.session_id;
        if (typeof frame.seq === "number" && frame.seq > this.lastSeq) this.lastSeq = frame.seq;
        break;
      default:
        break;
    }
    this.emit("frame", frame);
  }

  raw(frame) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify(frame));
      return true;
    }
    return false;
  }

  /** Attach (or switch) to a key; `resume` continues from the seq seen so far. */
  attach(sessionKey, resume = false) {
    const same = sessionKey === this.sessionKey;
    const frame = { type: "attach" };
    if (sessionKey) frame.session_key = sessionKey;
    if (resume && same && this.sessionId !== null && this.lastSeq > 0) {
      frame.session_id = this.sessionId;
      frame.last_seq = this.lastSeq;
      this.resuming = true;
    } else {
      this.sessionId = null;
      this.lastSeq = 0;
      this.resuming = false;
      if (!same) this.unacked.clear();
    }
    this.sessionKey = sessionKey;
    this.raw(frame);
    return frame;
  }

  /** Send a user message; it is resent after a reconnect until the server accepts it. */
  send(text) {
    const frame = { type: "send", text, client_message_id: randomId() };
    this.unacked.set(frame.client_message_id, frame);
    this.raw(frame);
    return frame.client_message_id;
  }

  decide(approvalId, approve) {
    return this.raw({ type: approve ? "approve" : "deny", approval_id: approvalId, client_message_id: randomId() });
  }

  stop() {
    return this.raw({ type: "stop", client_message_id: randomId() });
  }

  listSessions() {
    return this.raw({ type: "list_sessions" });
  }

  close() {
    this.closedByUs = true;
    clearTimeout(this.retryTimer);
    clearInterval(this.pingTimer);
    if (this.ws) this.ws.close(1000);
    this.ws = null;
  }
}
