"""A fake Discord: the REST API and a Gateway WebSocket, one local aiohttp server.

The Gateway speaks the published protocol: HELLO (op 10) → IDENTIFY (op 2) → READY
(op 0) with a new `session_id`, heartbeats (op 1 → ACK op 11), dispatches with a
sequence number, RESUME (op 6) of the current session → the dispatches after the given
`seq` replayed in order, then RESUMED; RESUME of an unknown session → INVALID_SESSION
(op 9, `d: false`). Dispatches made while no socket is open wait in the session for a
RESUME, as Discord keeps them. discord.py is pointed at it (`DISCORD_API_BASE`, `DISCORD_GATEWAY_URL`).
REST calls are recorded and can be scripted to fail (429 with `retry_after`, 5xx).
Message edits (`PATCH /channels/{c}/messages/{m}`) change the stored text (`texts`),
attachments (multipart `files[n]` + `payload_json`) are kept (`uploads`), and files put
in `cdn` are served under `/cdn/…` as the attachment CDN.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

BOT_ID = "1100000000000000001"
APP_ID = "1200000000000000002"
TOKEN = "discord-test-token"


@dataclass
class Call:
    method: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    ok: bool = True
    duplicate: bool = False  # a nonce seen before (with enforce_nonce): no new message


@dataclass
class Upload:
    path: str
    filename: str
    content_type: str
    data: bytes
    payload: dict[str, Any]


@dataclass
class FakeDiscord(LocalServer):
    calls: list[Call] = field(default_factory=list)
    # answers of the next message-creating calls, in order: (status, body) or None for success
    script: list[tuple[int, dict[str, Any]] | None] = field(default_factory=list)
    identifies: list[dict[str, Any]] = field(default_factory=list)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    heartbeats: int = 0
    most_sessions: int = 0  # the most identified sockets open at one time
    gateway_url: str = ""
    # answers of the next edits (PATCH of a channel message) / uploads, as `script`
    edit_script: list[tuple[int, dict[str, Any]] | None] = field(default_factory=list)
    upload_script: list[tuple[int, dict[str, Any]] | None] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)  # message id -> its current text
    uploads: list[Upload] = field(default_factory=list)  # accepted attachments
    cdn: dict[str, bytes] = field(default_factory=dict)  # name -> bytes served at /cdn/<name>

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._sockets: list[web.WebSocketResponse] = []
        self._seq = 0
        self._session_no = 0
        self.session_id = ""  # the current Gateway session (the last IDENTIFY's)
        self._log: list[tuple[int, str]] = []  # the session's dispatches: (seq, frame)
        self.replayed = 0  # dispatches sent again on a RESUME
        self._ids = itertools.count(1300000000000000000)
        self._by_nonce: dict[str, dict[str, Any]] = {}
        self._originals: dict[str, str] = {}  # interaction token -> its answer's message id

    # --- test API -------------------------------------------------------------------

    def messages(self) -> list[Call]:
        """Accepted calls that posted or edited a message."""
        return [
            c
            for c in self.calls
            if c.ok and not c.duplicate and c.method in ("POST", "PATCH") and "content" in c.body
        ]

    async def wait_until(self, predicate: Any, timeout: float = 15) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), scaled(timeout))

    async def wait_for_messages(self, count: int, timeout: float = 15) -> list[Call]:
        await self.wait_until(lambda: len(self.messages()) >= count, timeout)
        return self.messages()

    async def wait_ready(self, timeout: float = 15) -> None:
        await self.wait_until(lambda: bool(self._sockets) and bool(self.identifies or self.resumes), timeout)

    async def dispatch(self, kind: str, data: dict[str, Any]) -> None:
        self._seq += 1
        frame = json.dumps({"op": 0, "t": kind, "s": self._seq, "d": data})
        self._log.append((self._seq, frame))
        for ws in list(self._sockets):
            try:
                await ws.send_str(frame)
            except ConnectionError:  # a peer that died: it RESUMEs, or its successor does
                pass

    async def drop_connections(self) -> None:
        """Close the sockets with a resumable code (the client should RESUME)."""
        for ws in list(self._sockets):
            await ws.close(code=4000, message=b"unknown error")

    # --- Gateway --------------------------------------------------------------------

    async def _gateway(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(json.dumps({"op": 10, "d": {"heartbeat_interval": 1000}}))
        try:
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                frame = json.loads(msg.data)
                op = frame.get("op")
                if op == 1:
                    self.heartbeats += 1
                    await ws.send_str(json.dumps({"op": 11}))
                elif op == 2:
                    await self._ready(ws, frame["d"])
                elif op == 6:
                    await self._resume(ws, frame["d"])
        finally:
            if ws in self._sockets:
                self._sockets.remove(ws)
        return ws

    async def _resume(self, ws: web.WebSocketResponse, resume: dict[str, Any]) -> None:
        if not self.session_id or resume.get("session_id") != self.session_id:
            async with self._changed:
                self.resumes.append({**resume, "refused": True})
                self._changed.notify_all()
            await ws.send_str(json.dumps({"op": 9, "d": False}))
            return
        after = resume.get("seq") or 0
        missed = [frame for seq, frame in self._log if seq > after]
        for frame in missed:
            await ws.send_str(frame)
        self._seq += 1
        await ws.send_str(json.dumps({"op": 0, "t": "RESUMED", "s": self._seq, "d": {}}))
        async with self._changed:
            self.replayed += len(missed)
            self.resumes.append(resume)
            self._sockets.append(ws)
            self.most_sessions = max(self.most_sessions, len(self._sockets))
            self._changed.notify_all()

    async def _ready(self, ws: web.WebSocketResponse, identify: dict[str, Any]) -> None:
        self._session_no += 1
        self.session_id = f"session-{self._session_no}"
        self._log = []
        self._seq = 0
        self._seq += 1
        ready = {
            "v": 10,
            "user": {"id": BOT_ID, "username": "gate", "discriminator": "0", "bot": True, "avatar": None},
            "guilds": [],
            "session_id": self.session_id,
            "resume_gateway_url": self.gateway_url,
            "application": {"id": APP_ID, "flags": 0},
            "private_channels": [],
        }
        await ws.send_str(json.dumps({"op": 0, "t": "READY", "s": self._seq, "d": ready}))
        async with self._changed:
            self.identifies.append(identify)
            self._sockets.append(ws)
            self.most_sessions = max(self.most_sessions, len(self._sockets))
            self._changed.notify_all()

    # --- REST -----------------------------------------------------------------------

    def cdn_url(self, name: str) -> str:
        return self.url.replace("/api/v10", "") + f"/cdn/{name}"

    async def _cdn(self, request: web.Request) -> web.Response:
        data = self.cdn.get(request.match_info["name"])
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="image/png")

    async def _rest(self, request: web.Request) -> web.Response:
        path = "/" + request.match_info["path"]
        upload: Upload | None = None
        if request.content_type.startswith("multipart/"):
            body, upload = await _multipart(request, path)
        else:
            body = await request.json() if request.can_read_body else {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        if path == "/users/@me":
            if headers.get("authorization") != f"Bot {TOKEN}":
                return _json({"message": "401: Unauthorized", "code": 0}, status=401)
            return _json(
                {"id": BOT_ID, "username": "gate", "discriminator": "0", "bot": True, "avatar": None}
            )
        if path == "/oauth2/applications/@me":
            owner = {"id": "3999", "username": "owner", "discriminator": "0", "avatar": None}
            app: dict[str, Any] = {"id": APP_ID, "name": "Gate", "description": "", "icon": None, "flags": 0}
            app.update(bot_public=True, bot_require_code_grant=False, owner=owner, verify_key="00" * 32)
            return _json(app)
        if path == "/gateway/bot":
            return _json({"url": self.gateway_url, "shards": 1})
        is_message = request.method in ("POST", "PATCH") and ("content" in body or upload is not None)
        parts = path.strip("/").split("/")
        is_edit = request.method == "PATCH" and len(parts) == 4 and parts[0] == "channels"
        if is_edit and parts[3] not in self.texts:
            return _json({"message": "Unknown Message", "code": 10008}, status=404)
        if (
            is_message
            and not path.startswith("/webhooks/")
            and headers.get("authorization") != f"Bot {TOKEN}"
        ):
            answer: tuple[int, dict[str, Any]] | None = (401, {"message": "401: Unauthorized", "code": 0})
        elif is_edit and self.edit_script:
            answer = self.edit_script.pop(0)
        elif upload is not None and self.upload_script:
            answer = self.upload_script.pop(0)
        else:
            answer = self.script.pop(0) if is_message and self.script else None
        nonce = body.get("nonce") if body.get("enforce_nonce") else None
        async with self._changed:
            earlier = self._by_nonce.get(nonce) if nonce is not None and answer is None else None
            call = Call(request.method, path, body, headers, ok=answer is None, duplicate=earlier is not None)
            self.calls.append(call)
            if answer is None and earlier is None:
                if upload is not None:
                    self.uploads.append(upload)
                if is_edit:
                    self.texts[parts[3]] = str(body.get("content"))
            self._changed.notify_all()
        if answer is not None:
            return _json(answer[1], status=answer[0])
        if earlier is not None:
            return _json(earlier)
        if is_edit:
            return _json({"id": parts[3], "channel_id": parts[1], "content": body.get("content")})
        if path.endswith("/typing"):
            return web.Response(status=204)
        if request.method == "PATCH" and parts[0] == "webhooks" and len(parts) == 5:
            # The interaction's answer (`@original`, one per token) or a message of it, edited.
            mid = (
                self._originals.setdefault(parts[2], str(next(self._ids)))
                if parts[4] == "@original"
                else parts[4]
            )
            self.texts[mid] = str(body.get("content"))
            return _json({"id": mid, "channel_id": "interaction", "content": body.get("content")})
        created = {
            "id": str(next(self._ids)),
            "channel_id": path.split("/")[2],
            "content": body.get("content"),
        }
        if nonce is not None:
            self._by_nonce[nonce] = created
        if path.startswith("/channels/") and "content" in body:
            self.texts[str(created["id"])] = str(body["content"])
        return _json(created)

    async def __aenter__(self) -> FakeDiscord:
        app = web.Application()
        app.router.add_get("/gateway", self._gateway)
        app.router.add_get("/cdn/{name}", self._cdn)
        app.router.add_route("*", "/api/v10/{path:.*}", self._rest)
        port = await self._serve(app, "/api/v10", shutdown_timeout=0.5)
        self.gateway_url = f"ws://127.0.0.1:{port}/gateway"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await super().__aexit__(*exc)


async def _multipart(request: web.Request, path: str) -> tuple[dict[str, Any], Upload | None]:
    """A message with attachments: `payload_json` and `files[n]` (Discord's multipart form)."""
    body: dict[str, Any] = {}
    upload: Upload | None = None
    reader = await request.multipart()
    async for part in reader:
        if not isinstance(part, aiohttp.BodyPartReader):
            continue
        if part.name == "payload_json":
            body = json.loads(await part.text())
        elif part.name and part.name.startswith("files["):
            data = bytes(await part.read())
            kind = part.headers.get("Content-Type", "")
            upload = Upload(path, part.filename or "", kind, data, {})
    if upload is not None:
        upload.payload = body
    return body, upload


def _json(data: Any, status: int = 200) -> web.Response:
    # Exactly `application/json`, as Discord answers (discord.py compares the header as is).
    return web.Response(body=json.dumps(data).encode(), status=status, content_type="application/json")


RATE_LIMITED = (429, {"message": "You are being rate limited.", "retry_after": 0.2, "global": False})
SERVER_ERROR = (500, {"message": "500: Internal Server Error", "code": 0})

_message_ids = itertools.count(1400000000000000000)


def message(
    content: str,
    *,
    channel_id: str = "2000",
    guild_id: str | None = None,
    author_id: str = "3000",
    mentions: list[str] | None = None,
    message_id: str | None = None,
    attachments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A MESSAGE_CREATE payload as the Gateway sends it."""
    data: dict[str, Any] = {
        "id": message_id or str(next(_message_ids)),
        "channel_id": channel_id,
        "author": {"id": author_id, "username": "alice", "discriminator": "0", "avatar": None},
        "content": content,
        "timestamp": "2026-12-04T12:00:00.000000+00:00",
        "edited_timestamp": None,
        "tts": False,
        "mention_everyone": False,
        "mentions": [
            {"id": m, "username": "gate", "discriminator": "0", "avatar": None} for m in mentions or []
        ],
        "mention_roles": [],
        "attachments": attachments or [],
        "embeds": [],
        "pinned": False,
        "type": 0,
    }
    if guild_id:
        data["guild_id"] = guild_id
    return data
