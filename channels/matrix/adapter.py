"""Matrix: a bot account on a homeserver, `/sync` in, room events out.

Inbound: one replica holds the account's connection (`matrix:<token fingerprint>`, a
connection lease) and long-polls `/sync` from the `next_batch` token the previous answer
gave. The messages of an answer are committed to the inbox (dedup on the event id) before
the new token is saved in the lease row (fenced); a holder that dies in between leaves the
old token, the next holder is given the same events again and the inbox drops them. So a
take-over loses nothing and answers nothing twice. The very first sync of an account (no
token yet) only learns the rooms: old history is never answered.

Invitations are accepted per `MATRIX_INVITES`. A room with `m.room.encryption` is refused:
the bot has no device keys, so it says once, as a notice, that encryption is not
supported, and ignores the room's messages.

Outbound: `PUT /rooms/{room}/send/m.room.message/{txn}` with a transaction id per outbox
message and chunk (a retried call is a no-op on the homeserver); answers in a thread stay
in it, answers in a group reply to the message. Streaming (`edit`): a preview message,
then `m.replace` edits in place. Media: downloaded from the content repository through the
guarded fetcher, answers' files uploaded to it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from typing import Any

import httpx
import structlog

from app.channel import ChannelContext, SendResult
from app.connections import HeldConnection, fingerprint
from app.errors import ChannelNotConfigured, ChannelRejected, ChannelRequestError, DeliveryError
from app.events import DELETE_KEY, FilePart, ImagePart, OutboundMessage, TextPart, build_session_key
from app.streaming.protocol import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks, split_text
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media, tell_too_large
from channels.matrix.api import MatrixClient, MatrixError, delivery_error, media_url
from channels.matrix.native import NATIVE_TYPES, MatrixNative, after_own_join, is_edit
from channels.matrix.parse import is_encryption, parse_message
from channels.matrix.settings import MatrixSettings
from channels.matrix.stream import MatrixStreamer

log = structlog.get_logger(__name__)

ROOM = "room"  # records of rooms refused for their encryption
REFUSED_RETRY_SECONDS = 30.0
MAX_GAP_PAGES = 20  # of 100 events: what a limited timeline left out, fetched back
ENCRYPTION_NOTICE = {
    "en": "This room is end-to-end encrypted, and encryption is not supported by this bot: it "
    "cannot read messages here and will not answer. Invite it to a room without encryption.",
    "zh": "这个房间启用了端到端加密，本机器人不支持加密：它读不到这里的消息，也不会回复。"
    "请在未加密的房间里邀请它。",
}


class MatrixChannel:
    name = "matrix"

    def __init__(self, settings: MatrixSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        homeserver, token = settings.homeserver_url or "", settings.access_token or ""
        # One syncing holder per account; the name carries no secret (a fingerprint).
        self.connection = "matrix:" + fingerprint(homeserver.rstrip("/") + " " + token)
        self._http = httpx.AsyncClient(timeout=settings.request_timeout_seconds)
        self.client = MatrixClient(self._http, homeserver, token, timeout=settings.request_timeout_seconds)
        self.user_id: str | None = None  # the bot (`whoami`), learnt before the first sync
        self.sync_error: str | None = None  # the last /sync failure, for operators and tests
        self.duplicates = 0  # events a sync gave again that the inbox already had
        self._members: dict[str, int] = {}  # room → joined members (2: a direct chat)
        self._encrypted: set[str] = set()
        self._typing: set[str] = set()
        self._progress = ChunkProgress(capacity=1000)
        self._holder: HeldConnection | None = None
        self.native = MatrixNative(self)  # edits, redactions, reactions, joins (docs/events.md)
        self._filter = json.dumps(
            {
                "presence": {"not_types": ["*"]},
                "account_data": {"not_types": ["*"]},
                "room": {
                    "timeline": {"limit": settings.sync_timeline_limit},
                    "state": {"lazy_load_members": True},
                    "ephemeral": {"not_types": ["*"]},
                    "account_data": {"not_types": ["*"]},
                },
            },
            separators=(",", ":"),
        )

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.settings.homeserver_url or not self.settings.access_token:
            raise ChannelNotConfigured("MATRIX_HOMESERVER_URL and MATRIX_ACCESS_TOKEN must be set")
        self._holder = HeldConnection(self.context.hold_connection, self.connection, self._sync)

    async def stop(self) -> None:
        if self._holder is not None:
            await self._holder.release()
            self._holder = None
        await self._http.aclose()

    async def _whoami(self) -> str:
        while self.user_id is None:
            try:
                self.user_id = str((await self.client.whoami())["user_id"])
            except (MatrixError, httpx.HTTPError, KeyError, ValueError) as exc:
                self.sync_error = f"whoami failed: {exc!s}"
                log.warning("matrix_whoami_failed", error=str(exc))
                await asyncio.sleep(max(self._pause(exc), 1.0))
        return self.user_id

    def _pause(self, exc: Exception) -> float:
        """How long to wait after a failed call: long when the token is refused (nothing
        changes until an operator sets a new one; `problem` says so meanwhile)."""
        if isinstance(exc, MatrixError) and exc.status in (401, 403):
            return REFUSED_RETRY_SECONDS
        return self.settings.sync_retry_seconds

    async def problem(self) -> str | None:
        """What keeps this replica's sync from working, if it holds the sync (the dashboard
        shows it as the channel's error)."""
        return self.sync_error

    # --- inbound: the sync loop -----------------------------------------------------------

    async def _sync(self) -> None:
        states = self.context.connection_state
        state = await states.load_state(self.connection) or {}
        since: str | None = state.get("next_batch") or None
        await self._whoami()
        while True:
            certain_for = await states.confirm(self.connection)
            if certain_for <= 0:
                return  # lost, or handing over: no more syncs from this replica
            # The first sync only learns where "now" is: it returns at once.
            hold = 0.0 if since is None else min(self.settings.sync_timeout_seconds, certain_for / 2)
            try:
                data = await self.client.sync(since, hold, self._filter)
            except (MatrixError, httpx.HTTPError, ValueError) as exc:
                self.sync_error = f"/sync failed: {exc!s}"
                log.warning("matrix_sync_failed", error=str(exc))
                await asyncio.sleep(self._pause(exc))
                continue
            self.sync_error = None
            try:
                await self._handle(data, since)
            except asyncio.CancelledError:
                raise
            except Exception:
                # Not saved: the same token gives the same events again (dedup makes that safe).
                log.exception("matrix_sync_handling_failed")
                await asyncio.sleep(self.settings.sync_retry_seconds)
                continue
            new = data.get("next_batch")
            if isinstance(new, str) and new and new != since:
                if not await states.save_state(self.connection, {"next_batch": new}):
                    log.warning("matrix_next_batch_not_saved", detail="the connection is no longer ours")
                    return
                since = new

    async def _handle(self, data: dict[str, Any], since: str | None) -> None:
        found = data.get("rooms")
        rooms: dict[str, Any] = found if isinstance(found, dict) else {}
        for room_id, room in (rooms.get("invite") or {}).items():
            await self._invited(room_id, room if isinstance(room, dict) else {})
        for room_id, room in (rooms.get("join") or {}).items():
            await self._joined(room_id, room if isinstance(room, dict) else {}, since)
        for room_id in rooms.get("leave") or {}:
            self._members.pop(room_id, None)

    async def _invited(self, room_id: str, room: dict[str, Any]) -> None:
        events = (room.get("invite_state") or {}).get("events") or []
        inviter = next(
            (
                str(e.get("sender"))
                for e in events
                if isinstance(e, dict)
                and e.get("type") == "m.room.member"
                and e.get("state_key") == self.user_id
                and (e.get("content") or {}).get("membership") == "invite"
            ),
            "",
        )
        policy = self.settings.invites
        accept = policy == "all" or (
            policy == "allowed"
            and (
                (bool(self.settings.allowed_senders) and self.settings.sender_allowed(inviter))
                or (bool(self.settings.allowed_chats) and self.settings.chat_allowed(room_id))
                or (not self.settings.allowed_senders and not self.settings.allowed_chats)
            )
        )
        try:
            if accept:
                await self.client.join(room_id)
                log.info("matrix_invite_accepted", room=room_id, inviter=inviter)
            else:
                await self.client.leave(room_id)  # declines the invitation
                log.info("matrix_invite_declined", room=room_id, inviter=inviter, policy=policy)
        except MatrixError as exc:  # the invitation withdrawn meanwhile, the room gone
            log.warning("matrix_invite_failed", room=room_id, error=str(exc))
        # A network error propagates: the sync is handled again from the same token.

    async def _joined(self, room_id: str, room: dict[str, Any], since: str | None) -> None:
        summary = room.get("summary") or {}
        if isinstance(summary.get("m.joined_member_count"), int):
            self._members[room_id] = summary["m.joined_member_count"]
        state = (room.get("state") or {}).get("events") or []
        line = room.get("timeline") or {}
        timeline = line.get("events") or []
        if since is None:
            if any(is_encryption(e) for e in [*state, *timeline]):
                await self._refuse_encrypted(room_id)
            return  # where "now" is; history from before is never answered
        if line.get("limited") and isinstance(line.get("prev_batch"), str):
            # More happened than one sync returns (an outage, a take-over): the rest too.
            timeline = [*await self._gap(room_id, line["prev_batch"], since), *timeline]
        if any(is_encryption(e) for e in [*state, *timeline]):
            await self._refuse_encrypted(room_id)
        joined_at = after_own_join(timeline, self.user_id or "")
        for index, raw in enumerate(timeline):
            if not isinstance(raw, dict):
                continue
            if raw.get("type") == "m.room.member":
                self._members.pop(room_id, None)  # counted again when next needed
            native = raw.get("type") in NATIVE_TYPES or is_edit(raw)
            if (raw.get("type") != "m.room.message" and not native) or raw.get("sender") == self.user_id:
                continue
            if await self._is_encrypted(room_id):
                continue  # refused: its messages are never answered
            try:
                if native:
                    await self.native.receive(raw, room_id, members_known=index >= joined_at)
                else:
                    await self._receive(raw, room_id)
            except ChannelRequestError as exc:  # an event we cannot use: skip it, never loop on it
                log.warning("matrix_event_refused", room=room_id, detail=exc.detail)

    async def _gap(self, room_id: str, prev_batch: str, since: str) -> list[Any]:
        """The events between the last sync (`since`) and a limited timeline's start, oldest
        first, at most `MAX_GAP_PAGES` pages."""
        older: list[Any] = []
        start = prev_batch
        for _ in range(MAX_GAP_PAGES):
            page = await self.client.messages_between(room_id, start, since)
            chunk = page.get("chunk") or []
            older.extend(chunk)
            end = page.get("end")
            if not chunk or not isinstance(end, str) or end == start:
                break
            start = end
        else:
            log.warning("matrix_gap_truncated", room=room_id, events=len(older))
        return list(reversed(older))

    async def _is_encrypted(self, room_id: str) -> bool:
        if room_id in self._encrypted:
            return True
        records = self.context.records
        if records is not None and await records.get(ROOM, room_id) is not None:
            self._encrypted.add(room_id)
            return True
        return False

    async def _refuse_encrypted(self, room_id: str) -> None:
        """Say once in the room (a notice, through the outbox) that encryption is not
        supported; its messages are ignored from now on (kept in the records, for every
        replica and after restarts)."""
        if await self._is_encrypted(room_id):
            return
        notice = OutboundMessage(
            message_id=f"matrix-e2ee-{fingerprint(room_id)}",  # the outbox takes it once
            channel=self.name,
            chat_id=room_id,
            session_key=build_session_key(self.name, room_id),
            parts=(TextPart(text=ENCRYPTION_NOTICE[self.settings.locale]),),
            metadata={"matrix_msgtype": "m.notice"},
        )
        records = self.context.records
        if records is None:  # a bare context (tests of the adapter alone): best effort
            with contextlib.suppress(DeliveryError):
                await self.send(notice)
        else:
            # The notice first: a failure in between repeats the sync, and the outbox takes
            # the notice once however often it is handed in.
            await records.deliver([notice])
            await records.put(ROOM, room_id, {"encrypted": True}, open=False)
        self._encrypted.add(room_id)
        log.info("matrix_encrypted_room_refused", room=room_id)

    async def direct(self, room_id: str) -> bool:
        count = self._members.get(room_id)
        if count is None:
            count = self._members[room_id] = await self.client.joined_members(room_id)
        return count <= 2

    async def _receive(self, raw: dict[str, Any], room_id: str) -> None:
        assert self.user_id is not None
        event = parse_message(raw, room_id, self.user_id, self.settings, direct=await self.direct(room_id))
        if event is None:
            return
        try:
            event = await inline_media(
                event,
                self._fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await tell_too_large(self.send, event, self.settings.locale, exc.limit)
            return
        self.native.remember(event)
        results = await self.context.accept([event])
        self.duplicates += sum(1 for r in results if r.duplicate)

    async def _fetch(self, part: ImagePart | FilePart) -> Media | None:
        url = media_url(self.client.homeserver, part.url or "")
        if url is None:
            return None
        # The URL is built on the operator's homeserver from the mxc id's checked parts.
        return await download_capped(
            self.context.fetcher,
            url,
            self.settings.media_max_bytes,
            headers=self.client.auth,
            trusted=[self.client.homeserver],
        )

    # --- outbound -------------------------------------------------------------------------

    def relation(self, message: OutboundMessage, *, first: bool) -> dict[str, Any] | None:
        """Where an answer goes: into the thread it answers, or (the first message of an
        answer in a group) as a reply to the message it answers."""
        replied = message.metadata.get("reply_event_id")
        if message.thread_id:
            return {
                "rel_type": "m.thread",
                "event_id": message.thread_id,
                "is_falling_back": True,
                "m.in_reply_to": {"event_id": replied or message.thread_id},
            }
        if first and replied and message.metadata.get("reply_in_group"):
            return {"m.in_reply_to": {"event_id": replied}}
        return None

    def text_content(self, message: OutboundMessage, text: str, *, first: bool) -> dict[str, Any]:
        content: dict[str, Any] = {
            "msgtype": str(message.metadata.get("matrix_msgtype") or "m.text"),
            "body": text,
        }
        relates = self.relation(message, first=first)
        if relates is not None:
            content["m.relates_to"] = relates
        return content

    async def put(self, room_id: str, content: dict[str, Any], txn_id: str) -> str:
        try:
            return await self.client.send(room_id, content, txn_id)
        except (MatrixError, httpx.HTTPError) as exc:
            raise delivery_error(exc, "send") from exc

    async def send(self, message: OutboundMessage) -> SendResult:
        if DELETE_KEY in message.metadata:  # our answer to a recalled message (docs/events.md)
            await self._redact(message.chat_id, str(message.metadata[DELETE_KEY]), message.message_id)
            return SendResult()
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, ImagePart | FilePart) and p.data_base64]
        if not chunks and not media:
            return SendResult()
        try:
            sent = await self.deliver_steps(message, chunks, media, first=None)
        finally:
            await self._stop_typing(message.chat_id)
        return SendResult(platform_message_id=next((s for s in sent if s), None))

    async def _redact(self, room_id: str, event_id: str, message_id: str) -> None:
        """Redact our event; best-effort: a refusal (gone, not allowed) is logged, a failure
        of the homeserver is retried by the outbox (the transaction id makes it one redaction)."""
        try:
            await self.client.redact(room_id, event_id, f"chatgate-{message_id}-redact")
        except MatrixError as exc:
            if exc.status >= 500 or exc.status == 429:
                raise delivery_error(exc, "redact") from exc
            log.warning("matrix_redact_refused", room=room_id, target=event_id, error=str(exc))
        except httpx.HTTPError as exc:
            raise delivery_error(exc, "redact") from exc

    async def deliver_steps(
        self,
        message: OutboundMessage,
        chunks: list[str],
        media: list[ImagePart | FilePart],
        *,
        first: Any,
    ) -> list[str]:
        """Each chunk, then each file, once (a retry goes on where it failed); `first`,
        when given, delivers chunk 0 itself (a streamed preview's last edit)."""

        async def deliver(index: int, _item: str) -> str:
            if index == 0 and chunks and first is not None:
                return str(await first(chunks[0]))
            txn = f"chatgate-{message.message_id}-{index}"
            if index < len(chunks):
                return await self.put(
                    message.chat_id, self.text_content(message, chunks[index], first=index == 0), txn
                )
            return await self.put(
                message.chat_id, await self._media_content(message, media[index - len(chunks)]), txn
            )

        items = [*chunks, *(f"media:{i}" for i in range(len(media)))]
        return await send_chunks(self._progress, message.message_id, items, deliver)

    async def _media_content(self, message: OutboundMessage, part: ImagePart | FilePart) -> dict[str, Any]:
        assert part.data_base64 is not None
        data = base64.b64decode(part.data_base64)
        mime = part.mime_type or ("image/png" if isinstance(part, ImagePart) else "application/octet-stream")
        name = getattr(part, "name", None) or ("image" if isinstance(part, ImagePart) else "file")
        try:
            uri = await self.client.upload(data, mime, name)
        except (MatrixError, httpx.HTTPError) as exc:
            raise delivery_error(exc, "upload") from exc
        if isinstance(part, ImagePart):
            msgtype = "m.image"
        elif mime.startswith("audio/"):
            msgtype = "m.audio"
        elif mime.startswith("video/"):
            msgtype = "m.video"
        else:
            msgtype = "m.file"
        content: dict[str, Any] = {
            "msgtype": msgtype,
            "body": name,
            "filename": name,
            "url": uri,
            "info": {"mimetype": mime, "size": len(data)},
        }
        relates = self.relation(message, first=False)
        if relates is not None:
            content["m.relates_to"] = relates
        return content

    # --- typing and streaming -------------------------------------------------------------

    async def typing(self, message: OutboundMessage) -> None:
        if self.user_id is None:
            return
        try:
            await self.client.typing(message.chat_id, self.user_id, True)
        except (MatrixError, httpx.HTTPError) as exc:
            raise delivery_error(exc, "typing") from exc
        self._typing.add(message.chat_id)

    async def _stop_typing(self, room_id: str) -> None:
        if room_id not in self._typing or self.user_id is None:
            return
        self._typing.discard(room_id)
        with contextlib.suppress(MatrixError, httpx.HTTPError):
            await self.client.typing(room_id, self.user_id, False)

    async def replace(
        self, message: OutboundMessage, event_id: str, text: str, txn_id: str | None = None
    ) -> str:
        """Edit the bot's message `event_id` in place (`m.replace`) to show `text`."""
        msgtype = str(message.metadata.get("matrix_msgtype") or "m.text")
        content = {
            "msgtype": msgtype,
            "body": f"* {text}",
            "m.new_content": {"msgtype": msgtype, "body": text},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        }
        await self.put(message.chat_id, content, txn_id or f"chatgate-edit-{uuid.uuid4().hex}")
        return event_id

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = [p for p in message.parts if isinstance(p, ImagePart | FilePart) and p.data_base64]

        async def first(text: str) -> str:
            try:
                return await self.replace(message, preview_id, text, f"chatgate-{message.message_id}-final")
            except ChannelRejected:
                # The preview is gone (redacted): the answer replaces it as a new message.
                content = self.text_content(message, text, first=True)
                return await self.put(message.chat_id, content, f"chatgate-{message.message_id}-0")

        try:
            sent = await self.deliver_steps(message, chunks, media, first=first)
        finally:
            await self._stop_typing(message.chat_id)
        return SendResult(platform_message_id=next((s for s in sent if s), preview_id))

    def streamer(self) -> MatrixStreamer | None:
        if self.settings.streaming is StreamingMode.OFF:
            return None
        return MatrixStreamer(self)

    def __repr__(self) -> str:  # never the token
        return f"MatrixChannel(homeserver={self.client.homeserver!r}, user={self.user_id!r})"


__all__ = ["MatrixChannel"]
