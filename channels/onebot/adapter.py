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
import hmac
import json
from collections import OrderedDict
from typing import Any

import httpx
import structlog

from app.channel import (
    ChannelContext,
    ChannelRequest,
    ChannelResponse,
    ChannelWebSocket,
    SendResult,
)
from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    InvalidPayload,
)
from app.events import (
    DELETE_KEY,
    MESSAGE_REF_KEY,
    ROLE_KEY,
    ChatType,
    FilePart,
    ImagePart,
    InboundEvent,
    OutboundMessage,
    ReplyToPart,
)
from channels.common.media import (
    Media,
    MediaTooLarge,
    download_capped,
    inline_media,
    tell_too_large,
)
from channels.common.progress import ProgressStreamer
from channels.onebot.actions import action_result, batches, id_param, retry_after
from channels.onebot.auth import presented_token, verify_signature
from channels.onebot.connection import BotConnection
from channels.onebot.message import normalize, parts_to_segments, segments_to_parts
from channels.onebot.notices import parse_notice
from channels.onebot.settings import OneBotSettings

log = structlog.get_logger(__name__)

# Close codes for refused reverse-WebSocket connections (4000-4999 is ours to define).
CLOSE_BAD_REQUEST = 4400
CLOSE_UNAUTHORIZED = 4401
CLOSE_NOT_FOUND = 4404
CLOSE_NOT_CONFIGURED = 4503
CLOSE_REPLACED = 4000

_SENT_IDS_KEPT = 10_000


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
        given = presented_token(ws.headers.get("authorization"), ws.query.get("access_token"))
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
                if event is not None and (event := await self._with_media(event)) is not None:
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
            verify_signature(self.settings.secret, request.headers.get("x-signature"), request.body)
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
        # Unsigned reports may come from anyone: their URLs are not fetched (no SSRF).
        signed = bool(self.settings.secret)
        if event is not None and not signed and ROLE_KEY in event.metadata:
            # Nor is the role they claim believed: anyone could say "owner".
            metadata = {k: v for k, v in event.metadata.items() if k != ROLE_KEY}
            event = event.model_copy(update={"metadata": metadata})
        if event is not None and (event := await self._with_media(event, fetch=signed)) is not None:
            await self.context.accept([event])
        return ChannelResponse(status=204)  # no quick operation: replies go through the API

    # --- parsing -----------------------------------------------------------------------

    def parse_event(self, data: dict[str, Any], self_id: str) -> InboundEvent | None:
        """An `InboundEvent` for a message event; None for what is acknowledged and ignored."""
        if data.get("post_type") == "notice":  # recalls, members joining and leaving
            return parse_notice(data, self_id, channel=self.name, scope=self.settings.session_scope)
        if data.get("post_type") != "message":
            return None  # meta_event (heartbeat, lifecycle), request, message_sent
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
            metadata[MESSAGE_REF_KEY] = message_id  # a recall of it finds its event
        name = sender.get("card") or sender.get("nickname")
        if name:
            metadata["sender_name"] = str(name)
        role = sender.get("role")  # owner | admin | member, in group messages (app.access.roles)
        if chat_type is ChatType.GROUP and role in ("owner", "admin", "member"):
            metadata[ROLE_KEY] = role
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

    # --- inbound media -----------------------------------------------------------------

    async def _with_media(self, event: InboundEvent, *, fetch: bool = True) -> InboundEvent | None:
        """Images (and, with speech to text, voice records; and, when the gateway keeps
        received files, `file`, `video` and `record` segments) downloaded from their URLs as
        data; over `ONEBOT_MEDIA_MAX_BYTES` a polite reply and None (nothing is stored).
        Without `fetch` (an unsigned HTTP POST report) the URLs stay references."""
        if not fetch:
            return event
        limit = self.settings.media_max_bytes

        async def download(part: ImagePart | FilePart) -> Media | None:
            return await download_capped(self.context.fetcher, part.url, limit) if part.url else None

        try:
            return await inline_media(
                event,
                download,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,  # file/video/record segments, kept in the workspace
            )
        except MediaTooLarge as exc:
            await tell_too_large(self.send, event, self.settings.locale, exc.limit)
            return None

    # --- sending -----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if DELETE_KEY in message.metadata:  # our answer to a recalled message (docs/events.md)
            self_id = message.metadata.get("reply_self_id")
            await self._call(
                str(self_id) if self_id is not None else None,
                "delete_msg",
                {"message_id": id_param(str(message.metadata[DELETE_KEY]))},
            )
            return SendResult()
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
        for index, batch in enumerate(batches(segments, self.settings.max_text_chars)):
            done = (message.message_id, index)
            if done in self._delivered:
                sent_id = self._delivered[done]
                continue
            data = await self._call(self_id, action, {key: id_param(target), "message": batch})
            sent_id = None
            if isinstance(data, dict) and data.get("message_id") is not None:
                sent_id = str(data["message_id"])
                if self_id is not None:
                    self._remember_sent(self_id, sent_id)
            self._delivered[done] = sent_id
            while len(self._delivered) > _SENT_IDS_KEPT:
                self._delivered.popitem(last=False)
        return SendResult(platform_message_id=sent_id)

    # --- progress (`app.streaming`) ---------------------------------------------------

    def streamer(self) -> ProgressStreamer | None:
        if self.settings.working_notice_seconds is None:
            return None
        return ProgressStreamer(
            self.send, locale=self.settings.locale, notice_after=self.settings.working_notice_seconds
        )

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
        return action_result(action, response)

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
            raise ChannelRateLimited(retry_after(resp), "OneBot HTTP API answered 429")
        if resp.status_code >= 500 or resp.status_code == 408:
            raise ChannelUnavailable(f"OneBot HTTP API answered {resp.status_code}")
        if resp.status_code >= 400:
            raise ChannelRejected(f"OneBot HTTP API answered {resp.status_code} to {action}")
        try:
            return resp.json()
        except ValueError as exc:
            raise ChannelUnavailable("OneBot HTTP API answered with something that is not JSON") from exc


def _id(value: Any) -> str | None:
    if value is None or isinstance(value, bool) or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, int | str):
        return str(value).strip()
    raise InvalidPayload(f"unexpected id {value!r}")
