"""One browser gateway connection: authenticate, attach, send, and watch one session.

Three tasks per connection: the reader (client frames), the pump (session bus events →
frames, de-duplicated and gap-filled by seq) and the writer (the only one that sends on
the socket). The pump never waits for the client: it puts frames into a bounded queue
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
from collections.abc import Sequence
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from pydantic import ValidationError

from app.events import InboundEvent, TextPart
from app.gateway import history
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

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from app.bus import SessionBus
    from app.channel import AcceptResult
    from app.config import Settings
    from app.gateway.ratelimit import SubjectRates
    from app.gateway.tokens import TokenVerifier
    from app.metrics import Metrics

log = structlog.get_logger(__name__)

BUS_QUEUE_SIZE = 1000  # events between the bus and the pump; the pump never waits on the client


class GatewaySocket(Protocol):
    """The little a connection needs from a WebSocket (`app.api` adapts Starlette's)."""

    async def accept(self) -> None: ...

    async def receive_text(self) -> str | None:
        """The next text frame, or None once the peer is gone."""
        ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class GatewayHost(Protocol):
    """What a connection needs from the gateway it belongs to (`app.gateway.hub.GatewayHub`)."""

    settings: Settings
    engine: AsyncEngine
    metrics: Metrics
    verifier: TokenVerifier
    subject_rates: SubjectRates

    @property
    def bus(self) -> SessionBus: ...

    @property
    def available(self) -> bool: ...

    async def accept(self, events: Sequence[InboundEvent]) -> list[AcceptResult]: ...


_SURROGATE = re.compile("[\ud800-\udfff]")


class _TooSlow(Exception):
    pass


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
        self.key: str | None = None
        self.session_id: int | None = None
        self.last_seq = 0
        self.close_code: int | None = None
        self._out: asyncio.Queue[str] = asyncio.Queue(maxsize=settings.gateway_send_queue_size)
        self._last_frame_at = time.monotonic()
        self._subscription: AsyncExitStack | None = None
        self._pump: asyncio.Task[None] | None = None
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
            for task in (self._reader, self._ticker, self._pump, self._writer):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if self._closer is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._closer
            await self._detach()

    @property
    def closing(self) -> bool:
        return self.close_code is not None

    async def close(self, code: CloseCode, detail: str | None = None) -> None:
        """Close with `code`; never waits longer than the send timeout for a stuck client."""
        if self.closing:
            return
        self.close_code = int(code)
        current = asyncio.current_task()
        for task in (self._writer, self._pump, self._ticker):
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
            raise _TooSlow
        if frame.get("type") == "message" and frame.get("event_id") in self._accepting:
            self.emit(self._accepting.pop(frame["event_id"]))  # committed: it is on the bus
        try:
            data = json.dumps(frame, default=str, ensure_ascii=False)
            if _SURROGATE.search(data):  # echoed client input: no UTF-8 form, send it escaped
                data = json.dumps(frame, default=str)
            self._out.put_nowait(data)
        except asyncio.QueueFull:
            self._close_soon(CloseCode.TOO_SLOW, f"too slow: more than {self._out.maxsize} frames behind")
            raise _TooSlow from None

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
            except _TooSlow:
                return

    def _rejected(self, reason: str) -> None:
        self.hub.metrics.events_rejected.labels("browser", reason).inc()

    def _try_emit(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(_TooSlow):
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
            except Exception:
                log.exception("gateway_list_failed")
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
            await self._detach()
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
        except Exception:
            log.exception("gateway_accept_failed", session_key=key)
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
        await self._detach()
        stack = AsyncExitStack()
        try:
            # Subscribe first, then read: nothing committed after the read can be missed,
            # and what both deliver is dropped by seq.
            queue = await stack.enter_async_context(self.hub.bus.subscribe(key, maxsize=BUS_QUEUE_SIZE))
            ready = await self._ready_frame(key, frame)
        except Exception:
            await stack.aclose()
            log.exception("gateway_attach_failed", session_key=key)
            self.emit(error_frame("unavailable", "could not read the session; retry"))
            return
        self._subscription = stack
        self.key = key
        self.emit(ready)
        self._pump = asyncio.create_task(self._pump_loop(queue))

    async def _ready_frame(self, key: str, frame: AttachFrame) -> dict[str, Any]:
        """Read the key's current generation: what the client missed, or recent history."""
        settings = self.hub.settings
        engine = self.hub.engine
        current = await history.current_session(engine, key)
        messages: list[dict[str, Any]] = []
        truncated = False
        self.session_id, self.last_seq = None, 0
        if current is not None:
            self.session_id = current.id
            since = frame.last_seq
            resumable = (
                since is not None and frame.session_id in (None, current.id) and since <= current.last_seq
            )
            if resumable and since is not None:
                messages = await history.messages_between(
                    engine, key, current.id, after_seq=since, limit=settings.gateway_resume_limit + 1
                )
                if len(messages) > settings.gateway_resume_limit:
                    resumable = False
                else:
                    self.last_seq = messages[-1]["seq"] if messages else since
            if not resumable:
                # Not a continuation of what the client has: it must replace its view.
                truncated = bool(since)
                messages = await history.recent_messages(
                    engine, key, current.id, limit=settings.gateway_history_limit
                )
                self.last_seq = messages[-1]["seq"] if messages else 0
        return {
            "type": "ready",
            "session_key": key,
            "session_id": current.id if current else None,
            "generation": current.generation if current else None,
            "status": current.status if current else None,
            "messages": messages,
            "last_seq": self.last_seq,
            "truncated": truncated,
            "pending_approvals": await history.pending_approvals(engine, key),
        }

    async def _detach(self) -> None:
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._pump = None
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.aclose()
        self._subscription = None
        self.key = None
        self.session_id = None
        self.last_seq = 0

    # --- the session's events -----------------------------------------------------------

    async def _pump_loop(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            event = await queue.get()
            try:
                await self._deliver(event)
            except _TooSlow:
                return
            except Exception:
                log.exception("gateway_deliver_failed", session_key=self.key)

    async def _deliver(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("resync", "overflow"):
            await self._catch_up()
            return
        if kind != "message":
            self.emit(event)
            return
        session_id, seq = event.get("session_id"), event.get("seq")
        if not isinstance(session_id, int) or not isinstance(seq, int):
            return
        if session_id != self.session_id:
            if self.session_id is not None and session_id < self.session_id:
                return  # a late event of an older generation
            self._new_session(session_id)
        if seq <= self.last_seq:
            return  # already sent (from the history read, or twice on the bus)
        if seq > self.last_seq + 1:
            await self._fill(before_seq=seq)  # published out of order, or a replica's NOTIFY lagged
        self.emit(event)
        self.last_seq = seq

    def _new_session(self, session_id: int) -> None:
        self.emit({"type": "new_session", "session_key": self.key, "session_id": session_id})
        self.session_id = session_id
        self.last_seq = 0

    async def _fill(self, before_seq: int | None = None) -> None:
        assert self.key is not None and self.session_id is not None
        rows = await history.messages_between(
            self.hub.engine,
            self.key,
            self.session_id,
            after_seq=self.last_seq,
            before_seq=before_seq,
            limit=self.hub.settings.gateway_resume_limit,
        )
        for row in rows:
            self.emit(row)
            self.last_seq = row["seq"]

    async def _catch_up(self) -> None:
        """The bus may have lost events: read what the database has after our last seq."""
        assert self.key is not None
        current = await history.current_session(self.hub.engine, self.key)
        if current is None:
            return
        if current.id != self.session_id:
            if self.session_id is not None and current.id < self.session_id:
                return
            self._new_session(current.id)
        await self._fill()

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
                except _TooSlow:
                    return
