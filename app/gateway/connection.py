"""One browser gateway connection: authenticate, attach, send, and watch one session.

Three tasks per connection: the reader (client frames), the pump (session bus events →
frames, de-duplicated and gap-filled by seq: `app.gateway.feed`) and the writer (the only
one that sends on the socket). The pump never waits for the client: it puts frames into a bounded queue
and a full queue closes the connection with 4008, so a slow client slows nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import re
import time
from typing import Any

import structlog
from pydantic import ValidationError

from app.db.outage import log_failure
from app.events import InboundEvent, TextPart
from app.gateway import history
from app.gateway.feed import SessionFeed
from app.gateway.host import GatewayHost, GatewaySocket, TooSlow
from app.gateway.protocol import (
    CLOSE_REASONS,
    ApprovalFrame,
    AttachFrame,
    AuthFrame,
    BadFrame,
    ClientFrame,
    CloseCode,
    ListSessionsFrame,
    PingFrame,
    SendFrame,
    StopFrame,
    error_frame,
    parse_client_frame,
)
from app.gateway.ratelimit import SendRate, seconds_text
from app.gateway.tokens import GatewayGrant, TokenInvalid

__all__ = ["GatewayConnection", "GatewayHost", "GatewaySocket", "external_id_for"]

log = structlog.get_logger(__name__)

_SURROGATE = re.compile("[\ud800-\udfff]")


def external_id_for(subject: str, key: str, client_message_id: str) -> str:
    """Dedup id of a client message: scoped to who sent it where, so ids never collide
    across users (a guessed id must not swallow, or reveal, someone else's message)."""
    raw = f"{subject}\x00{key}\x00{client_message_id}".encode(errors="surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()
    return f"gw:{digest}"


class GatewayConnection:
    def __init__(self, hub: GatewayHost, ws: GatewaySocket) -> None:
        self.hub = hub
        self.ws = ws
        settings = hub.settings
        self.grant: GatewayGrant | None = None
        self.close_code: int | None = None
        self.feed = SessionFeed(hub, self.emit)  # the attached session
        self._out: asyncio.Queue[str] = asyncio.Queue(maxsize=settings.gateway_send_queue_size)
        self._last_frame_at = time.monotonic()
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closer: asyncio.Task[None] | None = None
        # Events this connection is accepting: their `accepted` frames, built before the
        # accept returns. The event's first message can reach the bus before that (a worker
        # may start its turn as soon as the event committed); `emit` sends the `accepted`
        # frame first then, so the client can match its pending message.
        self._accepting: dict[str, dict[str, Any]] = {}
        self._send_rate = SendRate(settings.gateway_sends_per_minute)

    @property
    def key(self) -> str | None:
        """The attached session key, if any."""
        return self.feed.key

    # --- lifecycle ------------------------------------------------------------------

    async def run(self) -> None:
        await self.ws.accept()
        self._writer = asyncio.create_task(self._write_loop())
        self._reader = asyncio.create_task(self._read_loop())
        try:
            # wait() rather than await: the reader being cancelled by close() is the normal
            # end, while a cancellation of this task itself must still propagate.
            await asyncio.wait({self._reader})
        finally:
            self.feed.cancel()
            for task in (self._reader, self._ticker, self._writer):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if self._closer is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._closer
            await self.feed.detach()

    @property
    def closing(self) -> bool:
        return self.close_code is not None

    async def close(self, code: CloseCode, detail: str | None = None) -> None:
        """Close with `code`; never waits longer than the send timeout for a stuck client."""
        if self.closing:
            return
        self.close_code = int(code)
        current = asyncio.current_task()
        self.feed.cancel()
        for task in (self._writer, self._ticker):
            if task is not None and task is not current:
                task.cancel()
        # A close reason may be at most 123 bytes.
        reason = (detail or CLOSE_REASONS[code]).encode()[:123].decode(errors="ignore")
        try:
            await asyncio.wait_for(
                self.ws.close(int(code), reason), self.hub.settings.gateway_send_timeout_seconds
            )
        except Exception:
            log.info("gateway_close_not_sent", code=int(code))
        if self._reader is not None and self._reader is not current:
            self._reader.cancel()

    def _close_soon(self, code: CloseCode, detail: str | None = None) -> None:
        """Close from code that must not wait (the pump, the ticker)."""
        if self.closing or self._closer is not None:
            return
        self._closer = asyncio.create_task(self.close(code, detail))

    # --- sending ---------------------------------------------------------------------

    def emit(self, frame: dict[str, Any]) -> None:
        """Queue a frame for the client; a full queue means the client is too slow."""
        if self.closing:
            raise TooSlow
        if frame.get("type") == "message" and frame.get("event_id") in self._accepting:
            self.emit(self._accepting.pop(frame["event_id"]))  # committed: it is on the bus
        try:
            data = json.dumps(frame, default=str, ensure_ascii=False)
            if _SURROGATE.search(data):  # echoed client input: no UTF-8 form, send it escaped
                data = json.dumps(frame, default=str)
            self._out.put_nowait(data)
        except asyncio.QueueFull:
            self._close_soon(CloseCode.TOO_SLOW, f"too slow: more than {self._out.maxsize} frames behind")
            raise TooSlow from None

    async def _write_loop(self) -> None:
        timeout = self.hub.settings.gateway_send_timeout_seconds
        while True:
            data = await self._out.get()
            try:
                await asyncio.wait_for(self.ws.send_text(data), timeout)
            except TimeoutError:
                self._close_soon(CloseCode.TOO_SLOW, f"too slow: a send took over {timeout:g} s")
                return
            except Exception:
                return  # the peer is gone; the reader sees it too

    # --- reading ----------------------------------------------------------------------

    async def _read_loop(self) -> None:
        settings = self.hub.settings
        if not self.hub.available:
            await self.close(CloseCode.UNAVAILABLE)
            return
        try:
            first = await asyncio.wait_for(self.ws.receive_text(), settings.gateway_auth_timeout_seconds)
        except TimeoutError:
            await self.close(CloseCode.UNAUTHORIZED, "unauthorized: no auth frame in time")
            return
        if first is None:
            return
        if len(first) > settings.gateway_max_frame_bytes:  # characters ≤ bytes: no encoding needed
            await self.close(CloseCode.TOO_BIG, f"frame over {settings.gateway_max_frame_bytes} bytes")
            return
        try:
            frame = parse_client_frame(first)
        except BadFrame as exc:
            await self.close(CloseCode.UNAUTHORIZED, f"unauthorized: {exc.detail}")
            return
        if not isinstance(frame, AuthFrame):
            await self.close(CloseCode.UNAUTHORIZED, "unauthorized: the first frame must be auth")
            return
        try:
            self.grant = self.hub.verifier.verify(frame.token)
        except TokenInvalid as exc:
            await self.close(CloseCode.UNAUTHORIZED, f"unauthorized: {exc}")
            return
        self._last_frame_at = time.monotonic()
        self._emit_authenticated()
        self._ticker = asyncio.create_task(self._tick_loop())
        while not self.closing:
            text = await self.ws.receive_text()
            if text is None:
                return
            self._last_frame_at = time.monotonic()
            if len(text.encode()) > settings.gateway_max_frame_bytes:
                await self.close(CloseCode.TOO_BIG, f"frame over {settings.gateway_max_frame_bytes} bytes")
                return
            try:
                await self._handle(parse_client_frame(text))
            except BadFrame as exc:
                self._rejected("bad_frame")
                self._try_emit(error_frame("bad_frame", exc.detail))
            except TooSlow:
                return

    def _rejected(self, reason: str) -> None:
        self.hub.metrics.events_rejected.labels("browser", reason).inc()

    def _try_emit(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(TooSlow):
            self.emit(frame)

    def _emit_authenticated(self) -> None:
        assert self.grant is not None
        expires = self.grant.expires_at
        self.emit(
            {
                "type": "authenticated",
                "subject": self.grant.subject,
                "session_keys": list(self.grant.session_keys),
                "key_prefix": self.grant.key_prefix,
                "expires_at": None
                if expires is None
                else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires)),
            }
        )

    async def _handle(self, frame: ClientFrame) -> None:
        assert self.grant is not None
        if isinstance(frame, PingFrame):
            self.emit({"type": "pong"})
        elif isinstance(frame, AuthFrame):
            await self._reauthenticate(frame)
        elif isinstance(frame, AttachFrame):
            await self._attach(frame)
        elif isinstance(frame, ListSessionsFrame):
            try:
                found = await history.sessions_in_scope(self.hub.engine, self.grant)
            except Exception as exc:
                log_failure(log, "gateway_list_failed", exc)
                self.emit(error_frame("unavailable", "could not read sessions; retry"))
                return
            self.emit({"type": "sessions", "sessions": found})
        elif isinstance(frame, SendFrame):
            if len(frame.text) > self.hub.settings.gateway_max_text_chars:
                self._rejected("text_too_long")
                self.emit(
                    error_frame(
                        "text_too_long",
                        f"text is over {self.hub.settings.gateway_max_text_chars} characters",
                        client_message_id=frame.client_message_id,
                    )
                )
                return
            if not frame.text.strip():
                self._rejected("bad_frame")
                self.emit(
                    error_frame("bad_frame", "text is empty", client_message_id=frame.client_message_id)
                )
                return
            await self._send_text(frame.text, frame.client_message_id)
        elif isinstance(frame, ApprovalFrame):
            await self._send_text(f"/{frame.type} {frame.approval_id}", frame.client_message_id)
        elif isinstance(frame, StopFrame):
            await self._send_text("/stop", frame.client_message_id)

    async def _reauthenticate(self, frame: AuthFrame) -> None:
        """A fresh token on an open connection (a signed token is about to expire)."""
        try:
            grant = self.hub.verifier.verify(frame.token)
        except TokenInvalid as exc:
            self.emit(error_frame("unauthorized", str(exc)))
            return
        self.grant = grant
        if self.key is not None and not grant.allows(self.key):
            await self.feed.detach()
        self._emit_authenticated()

    # --- inbound messages -------------------------------------------------------------

    def _rate_limited(self, client_message_id: str | None) -> bool:
        """Whether this connection or its subject sent too many messages this minute."""
        assert self.grant is not None
        subject_rate = self.hub.subject_rates.get(self.grant.subject)
        for rate, who in ((self._send_rate, "this connection"), (subject_rate, "this subject")):
            wait = rate.retry_after()
            if wait is not None:
                self._rejected("rate_limited")
                self.emit(
                    error_frame(
                        "rate_limited",
                        f"{who} may send {rate.limit} messages a minute; retry in {seconds_text(wait)} s",
                        client_message_id=client_message_id,
                        retry_after=math.ceil(wait),
                    )
                )
                return True
        self._send_rate.record()
        subject_rate.record()
        return False

    async def _send_text(self, text: str, client_message_id: str | None) -> None:
        assert self.grant is not None
        if self.key is None:
            self._rejected("not_attached")
            self.emit(
                error_frame("not_attached", "attach to a session first", client_message_id=client_message_id)
            )
            return
        if self._rate_limited(client_message_id):
            return
        key = self.key
        try:
            event = InboundEvent(
                channel="browser",
                chat_id=key,
                sender_id=self.grant.subject,
                parts=(TextPart(text=text),),
                external_id=external_id_for(self.grant.subject, key, client_message_id)
                if client_message_id
                else None,
                session_key_override=key,
                metadata={"client_message_id": client_message_id} if client_message_id else {},
            )
        except ValidationError as exc:  # `InboundEvent._storable`: nothing is stored
            self._rejected("bad_frame")
            detail = exc.errors()[0]["msg"].removeprefix("Value error, ")
            self.emit(error_frame("bad_frame", detail, client_message_id=client_message_id))
            return
        accepted: dict[str, Any] = {
            "type": "accepted",
            "client_message_id": client_message_id,
            "event_id": event.event_id,
            "session_key": event.session_key,
            "duplicate": False,
        }
        self._accepting[event.event_id] = accepted
        try:
            [result] = await self.hub.accept([event])
        except Exception as exc:
            log_failure(log, "gateway_accept_failed", exc, session_key=key)
            self.emit(
                error_frame(
                    "unavailable", "the message was not stored; retry", client_message_id=client_message_id
                )
            )
            return
        finally:
            # Gone: its message came first and `emit` sent the frame already.
            sent = self._accepting.pop(event.event_id, None) is None
        if sent:
            return
        if result.skipped:
            self.emit(
                error_frame(
                    "rejected",
                    "the browser channel's sender policy does not admit this subject",
                    client_message_id=client_message_id,
                )
            )
            return
        accepted.update(event_id=result.event_id, session_key=result.session_key, duplicate=result.duplicate)
        self.emit(accepted)

    # --- attaching --------------------------------------------------------------------

    async def _attach(self, frame: AttachFrame) -> None:
        assert self.grant is not None
        key = frame.session_key or self.grant.default_key
        if key is None:
            self.emit(error_frame("bad_frame", "session_key is required: this token lists no default key"))
            return
        if not self.grant.allows(key):
            # The same answer whether the key exists or not: knowing a key gives nothing.
            self.emit(
                error_frame("forbidden", "this token may not attach to that session key", session_key=key)
            )
            return
        try:
            ready = await self.feed.attach(key, frame)
        except Exception as exc:
            log_failure(log, "gateway_attach_failed", exc, session_key=key)
            self.emit(error_frame("unavailable", "could not read the session; retry"))
            return
        self.emit(ready)
        self.feed.start()

    # --- heartbeats, idle and expiry ------------------------------------------------------

    async def _tick_loop(self) -> None:
        settings = self.hub.settings
        tick = min(1.0, settings.gateway_heartbeat_seconds, settings.gateway_idle_timeout_seconds / 4)
        next_beat = time.monotonic() + settings.gateway_heartbeat_seconds
        while not self.closing:
            await asyncio.sleep(tick)
            now = time.monotonic()
            if now - self._last_frame_at > settings.gateway_idle_timeout_seconds:
                self._close_soon(CloseCode.IDLE, "idle: no frame from the client")
                return
            if self.grant is not None and self.grant.expired():
                self._close_soon(CloseCode.TOKEN_EXPIRED)
                return
            if now >= next_beat:
                next_beat = now + settings.gateway_heartbeat_seconds
                try:
                    self.emit({"type": "heartbeat", "ts": int(time.time())})
                except TooSlow:
                    return
