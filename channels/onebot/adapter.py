"""OneBot v11 adapter: QQ (NapCat, Lagrange, go-cqhttp …) and WeChat bridges.

Two ways in:

* reverse WebSocket (`WS /channels/onebot/ws`): the bridge connects to us with
  `Authorization: Bearer <ONEBOT_ACCESS_TOKEN>` (or `?access_token=`), `X-Self-ID` and
  `X-Client-Role: Universal`; events arrive on the socket and API calls go back on it.
  Several bots may be connected at once, keyed by their self id.
* HTTP POST (`POST /channels/onebot`): events are POSTed, signed with
  `X-Signature: sha1=<hex HMAC-SHA1(ONEBOT_SECRET, raw body)>`; API calls then go to the
  bridge's HTTP API at `ONEBOT_HTTP_API_URL`.

Chat ids are `group:<group_id>` and `private:<user_id>`; the bot that received a message
travels as `reply_self_id` in the event metadata, so the answer leaves through that bot.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
from collections import OrderedDict
from typing import Any

import httpx
import structlog
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import (
    ChannelContext,
    ChannelRequest,
    ChannelResponse,
    ChannelSettings,
    ChannelWebSocket,
    SendResult,
)
from app.errors import (
    ChannelAuthError,
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
    InvalidPayload,
)
from app.events import ChatType, InboundEvent, OutboundMessage, ReplyToPart
from channels.onebot.connection import BotConnection
from channels.onebot.message import Segment, normalize, parts_to_segments, segments_to_parts, split_text

log = structlog.get_logger(__name__)

# Close codes for refused reverse-WebSocket connections (4000-4999 is ours to define).
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_NOT_CONFIGURED = 4503
CLOSE_REPLACED = 4000

_SENT_IDS_KEPT = 10_000


class OneBotSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="ONEBOT_", env_file=".env", extra="ignore")

    access_token: str | None = Field(
        None, description="Token bridges must present on the reverse WebSocket; also sent to the HTTP API."
    )
    secret: str | None = Field(None, description="HMAC-SHA1 key of HTTP POST mode (X-Signature).")
    http_api_url: str | None = Field(None, description="The bridge's HTTP API, e.g. http://127.0.0.1:3000.")
    api_timeout_seconds: float = Field(10.0, description="How long an API call waits for the bridge.")
    max_text_chars: int = Field(3000, description="Longer replies are sent as several messages.")
    quote_in_groups: bool = Field(True, description="Group answers quote the message they answer.")
    max_frame_bytes: int = Field(
        1024 * 1024, ge=1, description="Largest reverse-WebSocket frame; larger ones close with 1009."
    )


class OneBotChannel:
    name = "onebot"

    def __init__(self, settings: OneBotSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._bots: dict[str, BotConnection] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Message ids our bots sent, so "a reply to the bot" counts as addressing it.
        self._sent: OrderedDict[tuple[str, str], None] = OrderedDict()
        # Batches of an outbound message already delivered, so a retry sends only the rest.
        self._delivered: OrderedDict[tuple[str, int], str | None] = OrderedDict()
        self._warned_unsigned = False

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for conn in list(self._bots.values()):
            conn.fail_pending("server shutting down")
            with contextlib.suppress(Exception):
                await conn.ws.close(1001, "server shutting down")
        for task in list(self._tasks):
            task.cancel()
        self._bots.clear()

    @property
    def connected_bots(self) -> list[str]:
        return sorted(self._bots)

    # --- reverse WebSocket -------------------------------------------------------------

    async def handle_websocket(self, path: str, ws: ChannelWebSocket) -> None:
        refusal = self._check_handshake(path, ws)
        await ws.accept()  # accept first so that the bridge sees our close code and reason
        if refusal is not None:
            code, reason = refusal
            log.warning("onebot_ws_refused", code=code, reason=reason)
            await ws.close(code, reason)
            return
        self_id = ws.headers["x-self-id"].strip()
        role = ws.headers.get("x-client-role", "universal").strip().lower() or "universal"
        conn = BotConnection(self_id, ws, role)
        if conn.serves_api:
            old = self._bots.get(self_id)
            self._bots[self_id] = conn
            if old is not None:  # the bridge reconnected; the old socket is dead or about to be
                old.fail_pending("replaced by a new connection")
                with contextlib.suppress(Exception):
                    await old.ws.close(CLOSE_REPLACED, "replaced by a new connection")
        log.info("onebot_bot_connected", self_id=self_id, role=role)
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        worker = asyncio.create_task(self._event_worker(self_id, events), name=f"onebot-events-{self_id}")
        self._tasks.add(worker)
        try:
            while True:
                try:
                    raw = await ws.receive_text()
                except Exception:  # disconnect (the framework's exception type is not ours to import)
                    break
                if len(raw) > self.settings.max_frame_bytes:  # characters ≤ bytes: a cheap first test
                    log.warning("onebot_ws_frame_too_big", self_id=self_id)
                    await ws.close(1009, f"frame over {self.settings.max_frame_bytes} bytes")
                    break
                try:
                    frame = json.loads(raw)
                except (ValueError, RecursionError):
                    # The bridge keeps its connection: one bad frame loses only itself.
                    log.warning("onebot_ws_bad_frame", self_id=self_id)
                    continue
                if not isinstance(frame, dict):
                    continue
                if "post_type" in frame:
                    events.put_nowait(frame)  # handled in arrival order by the worker
                elif "echo" in frame:
                    conn.resolve(frame)
        finally:
            if self._bots.get(self_id) is conn:
                del self._bots[self_id]
            conn.fail_pending("connection closed")
            with contextlib.suppress(Exception):  # e.g. after a binary frame we cannot read
                await ws.close(1000, "closing")
            events.put_nowait(None)
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            self._tasks.discard(worker)
            log.info("onebot_bot_disconnected", self_id=self_id)

    def _check_handshake(self, path: str, ws: ChannelWebSocket) -> tuple[int, str] | None:
        if path.strip("/") != "ws":
            return CLOSE_NOT_FOUND, "the OneBot reverse WebSocket is at /channels/onebot/ws"
        expected = self.settings.access_token
        if not expected:
            return CLOSE_NOT_CONFIGURED, "ONEBOT_ACCESS_TOKEN is not set on this server"
        given = _presented_token(ws.headers.get("authorization"), ws.query.get("access_token"))
        if given is None:
            return CLOSE_UNAUTHORIZED, "missing access token"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            return CLOSE_UNAUTHORIZED, "wrong access token"
        self_id = ws.headers.get("x-self-id", "").strip()
        if not self_id or len(self_id) > 64:
            return CLOSE_BAD_REQUEST, "missing X-Self-ID header"
        role = ws.headers.get("x-client-role", "Universal").strip().lower()
        if role not in ("universal", "api", "event"):
            return CLOSE_BAD_REQUEST, f"unknown X-Client-Role {role!r}"
        return None

    async def _event_worker(self, self_id: str, events: asyncio.Queue[dict[str, Any] | None]) -> None:
        while (frame := await events.get()) is not None:
            try:
                event = self.parse_event(frame, self_id)
                if event is not None:
                    await self.context.accept([event])
            except InvalidPayload as exc:
                log.warning("onebot_event_invalid", self_id=self_id, detail=exc.detail)
            except Exception:
                # A WebSocket event has no acknowledgement the bridge would retry on.
                log.exception("onebot_event_not_accepted", self_id=self_id)

    # --- HTTP POST ---------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/") != "":
            return ChannelResponse.json(
                {"error": "not_found", "detail": "POST /channels/onebot or WS /channels/onebot/ws"}, 404
            )
        if self.settings.secret:
            _verify_signature(self.settings.secret, request.headers.get("x-signature"), request.body)
        elif not self._warned_unsigned:
            self._warned_unsigned = True
            log.warning("onebot_http_post_unsigned", detail="ONEBOT_SECRET unset: reports not verified")
        header_self_id = request.headers.get("x-self-id", "").strip()
        if not header_self_id:
            raise InvalidPayload("missing X-Self-ID header")
        data = request.json()
        if not isinstance(data, dict):
            raise InvalidPayload("body must be a JSON object")
        body_self_id = data.get("self_id")
        if body_self_id is not None and str(body_self_id) != header_self_id:
            raise InvalidPayload("X-Self-ID does not match self_id of the event")
        event = self.parse_event(data, header_self_id)
        if event is not None:
            await self.context.accept([event])
        return ChannelResponse(status=204)  # no quick operation: replies go through the API

    # --- parsing -----------------------------------------------------------------------

    def parse_event(self, data: dict[str, Any], self_id: str) -> InboundEvent | None:
        """An `InboundEvent` for a message event; None for what is acknowledged and ignored."""
        if data.get("post_type") != "message":
            return None  # meta_event (heartbeat, lifecycle), notice, request, message_sent
        message_type = data.get("message_type")
        user_id = _id(data.get("user_id"))
        if user_id is None:
            raise InvalidPayload("message event without user_id")
        if user_id == self_id:
            return None  # our own message reported back
        if message_type == "group":
            group_id = _id(data.get("group_id"))
            if group_id is None:
                raise InvalidPayload("group message without group_id")
            chat_id, chat_type = f"group:{group_id}", ChatType.GROUP
        elif message_type == "private":
            chat_id, chat_type = f"private:{user_id}", ChatType.DIRECT
        else:
            return None
        parsed = segments_to_parts(normalize(data.get("message")), self_id)
        if not parsed.has_content:
            return None  # a poke, a bare @, a sticker-only message …
        if chat_type is ChatType.GROUP and self.settings.require_mention_in_groups:
            addressed = parsed.mentions_self or (
                parsed.reply_to is not None and (self_id, parsed.reply_to) in self._sent
            )
            if not addressed:
                return None  # group talk not meant for the bot is neither stored nor answered
        message_id = _id(data.get("message_id"))
        sender = data.get("sender")
        sender = sender if isinstance(sender, dict) else {}
        metadata: dict[str, Any] = {"reply_self_id": self_id, "reply_message_type": message_type}
        if message_id is not None:
            metadata["reply_message_id"] = message_id
        name = sender.get("card") or sender.get("nickname")
        if name:
            metadata["sender_name"] = str(name)
        return InboundEvent(
            channel=self.name,
            chat_id=chat_id,
            sender_id=user_id,
            chat_type=chat_type,
            parts=parsed.parts,
            external_id=f"{self_id}:{message_id}" if message_id is not None else None,
            session_scope=self.settings.session_scope,
            metadata=metadata,
        )

    # --- sending -----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        kind, _, target = message.chat_id.partition(":")
        if kind not in ("group", "private") or not target:
            raise ChannelRejected(f"not a OneBot chat id: {message.chat_id!r}")
        segments = parts_to_segments(message.parts)
        reply_id = message.metadata.get("reply_message_id")
        if (
            kind == "group"
            and reply_id
            and self.settings.quote_in_groups
            and not any(isinstance(p, ReplyToPart) for p in message.parts)
        ):
            segments.insert(0, {"type": "reply", "data": {"id": str(reply_id)}})
        if not segments:
            return SendResult()
        self_id = message.metadata.get("reply_self_id")
        self_id = str(self_id) if self_id is not None else None
        action = "send_group_msg" if kind == "group" else "send_private_msg"
        key = "group_id" if kind == "group" else "user_id"
        sent_id: str | None = None
        for index, batch in enumerate(_batches(segments, self.settings.max_text_chars)):
            done = (message.message_id, index)
            if done in self._delivered:
                sent_id = self._delivered[done]
                continue
            data = await self._call(self_id, action, {key: _id_param(target), "message": batch})
            sent_id = None
            if isinstance(data, dict) and data.get("message_id") is not None:
                sent_id = str(data["message_id"])
                if self_id is not None:
                    self._remember_sent(self_id, sent_id)
            self._delivered[done] = sent_id
            while len(self._delivered) > _SENT_IDS_KEPT:
                self._delivered.popitem(last=False)
        return SendResult(platform_message_id=sent_id)

    def _remember_sent(self, self_id: str, message_id: str) -> None:
        self._sent[(self_id, message_id)] = None
        while len(self._sent) > _SENT_IDS_KEPT:
            self._sent.popitem(last=False)

    async def _call(self, self_id: str | None, action: str, params: dict[str, Any]) -> Any:
        conn = self._connection_for(self_id)
        if conn is not None:
            response = await conn.call(action, params, self.settings.api_timeout_seconds)
        elif self.settings.http_api_url:
            response = await self._http_call(action, params)
        else:
            who = f"bot {self_id}" if self_id else "any bot"
            raise ChannelUnavailable(f"no OneBot connection for {who} and no ONEBOT_HTTP_API_URL")
        return _result(action, response)

    def _connection_for(self, self_id: str | None) -> BotConnection | None:
        if self_id is not None:
            return self._bots.get(self_id)
        if len(self._bots) == 1:  # cron and other replies without a bot of origin
            return next(iter(self._bots.values()))
        return None

    async def _http_call(self, action: str, params: dict[str, Any]) -> Any:
        assert self.settings.http_api_url
        url = f"{self.settings.http_api_url.rstrip('/')}/{action}"
        headers = {}
        if self.settings.access_token:
            headers["Authorization"] = f"Bearer {self.settings.access_token}"
        try:
            resp = await self.context.http.post(
                url, json=params, headers=headers, timeout=self.settings.api_timeout_seconds
            )
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"OneBot HTTP API unreachable: {exc!r}") from exc
        if resp.status_code in (401, 403):
            raise ChannelSendAuthError(f"OneBot HTTP API refused our access token ({resp.status_code})")
        if resp.status_code == 429:
            raise ChannelRateLimited(_retry_after(resp), "OneBot HTTP API answered 429")
        if resp.status_code >= 500 or resp.status_code == 408:
            raise ChannelUnavailable(f"OneBot HTTP API answered {resp.status_code}")
        if resp.status_code >= 400:
            raise ChannelRejected(f"OneBot HTTP API answered {resp.status_code} to {action}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ChannelUnavailable("OneBot HTTP API answered with something that is not JSON") from exc


def _result(action: str, response: Any) -> Any:
    """The `data` of an OK response; a typed `DeliveryError` otherwise."""
    if not isinstance(response, dict):
        raise ChannelUnavailable(f"{action}: malformed response")
    status, retcode = response.get("status"), response.get("retcode")
    if status in ("ok", "async") or retcode in (0, 1):
        return response.get("data")
    detail = f"{action} failed: retcode {retcode} {response.get('wording') or response.get('msg') or ''}"
    error: DeliveryError
    if retcode in (1401, 1403):
        error = ChannelSendAuthError(detail.strip())
    elif retcode in (100, 1400, 1404):  # bad parameters, unknown action: retrying will not help
        error = ChannelRejected(detail.strip())
    else:  # bridge-side failures (network to QQ, risk control, timeouts): retry, bounded
        error = ChannelUnavailable(detail.strip())
    raise error


def _batches(segments: list[Segment], limit: int) -> list[list[Segment]]:
    """Group segments into messages whose text stays within `limit` characters."""
    batches: list[list[Segment]] = [[]]
    size = 0
    for seg in segments:
        if seg["type"] != "text":
            batches[-1].append(seg)
            continue
        for piece in split_text(seg["data"]["text"], limit):
            if size + len(piece) > limit and batches[-1]:
                batches.append([])
                size = 0
            batches[-1].append({"type": "text", "data": {"text": piece}})
            size += len(piece)
    return [b for b in batches if b]


def _verify_signature(secret: str, header: str | None, body: bytes) -> None:
    if not header:
        raise ChannelAuthError("missing X-Signature header")
    algo, _, given = header.strip().partition("=")
    if algo.lower() != "sha1" or not given:
        raise ChannelAuthError("X-Signature must be sha1=<hex>")
    expected = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.lower().encode()):
        raise ChannelAuthError("signature does not match")


def _presented_token(authorization: str | None, query_token: str | None) -> str | None:
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and token.strip():  # go-cqhttp once sent "Token"
            return token.strip()
        return None
    return query_token or None


def _id(value: Any) -> str | None:
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, int | str):
        return str(value).strip()
    raise InvalidPayload(f"unexpected id {value!r}")


def _id_param(value: str) -> int | str:
    """QQ ids are numbers on the wire; WeChat bridges use strings (wxid_…)."""
    return int(value) if value.isdigit() else value


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
