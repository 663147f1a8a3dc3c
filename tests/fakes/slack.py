"""A fake Slack Web API: a real local HTTP server that slack_sdk's AsyncWebClient talks to.

It serves `POST /api/{method}` like slack.com (bearer token, JSON or form parameters,
answers `{"ok": true, …}` or `{"ok": false, "error": …}` with Slack's status codes),
records every call and can be scripted to fail. Also builds Events API payloads and
signs them with Slack's published rule (independently of the adapter's code).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import json
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

BOT_TOKEN = "xoxb-test-token"
APP_TOKEN = "xapp-test-token"
BOT_USER_ID = "UBOT01"
BOT_ID = "BBOT01"
TEAM_ID = "T0001"
SIGNING_SECRET = "slack-signing-secret"


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    headers: dict[str, str]
    ok: bool = True  # False when the fake answered with an error


@dataclass
class Failure:
    status: int
    error: str
    retry_after: int | None = None


RATE_LIMITED = Failure(429, "ratelimited", retry_after=1)
SERVER_ERROR = Failure(500, "internal_error")
INVALID_AUTH = Failure(200, "invalid_auth")
CHANNEL_NOT_FOUND = Failure(200, "channel_not_found")


@dataclass
class FakeSlack(LocalServer):
    token: str = BOT_TOKEN
    bot_user_id: str = BOT_USER_ID
    calls: list[Call] = field(default_factory=list)
    # method -> answers of its next calls, in order: a failure, or None for a normal answer
    script: dict[str, list[Failure | None]] = field(default_factory=dict)
    always: dict[str, Failure] = field(default_factory=dict)
    # user id -> users.info flags (is_admin, is_owner, is_restricted …); others: plain members
    users: dict[str, dict[str, Any]] = field(default_factory=dict)
    # conversation id -> failures of chat.postMessage to it, answered in order
    by_channel: dict[str, list[Failure | None]] = field(default_factory=dict)
    url: str = ""
    # ts -> the message's current text, as the conversation shows it (posted, then updated)
    texts: dict[str, str] = field(default_factory=dict)
    threads: dict[str, str] = field(
        default_factory=dict
    )  # ts of a message we posted in a thread -> thread_ts
    # chat.startStream messages not stopped yet (their text grows with each append)
    streaming: set[str] = field(default_factory=set)
    # external uploads: file id -> bytes received at its upload URL; completed: shared files
    uploads: dict[str, bytes] = field(default_factory=dict)
    completed: list[dict[str, Any]] = field(default_factory=list)
    # answers of the next POSTs to upload URLs: an HTTP status, or None for 200
    upload_failures: list[int | None] = field(default_factory=list)
    # url_private files: path under /files-pri/ -> bytes (served to the bot token only)
    files: dict[str, bytes] = field(default_factory=dict)
    # Socket Mode: envelope ids the app acknowledged, in order
    acks: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._ts = itertools.count(1)
        self._sockets: list[web.WebSocketResponse] = []
        self._port = 0

    def fail(self, method: str, *failures: Failure | None) -> None:
        self.script.setdefault(method, []).extend(failures)

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def posted(self) -> list[dict[str, Any]]:
        """Messages Slack accepted (failed attempts excluded)."""
        return [c.params for c in self.calls_of("chat.postMessage") if c.ok]

    async def wait_for(self, method: str, count: int, timeout: float = 15) -> list[Call]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.calls_of(method)) >= count), scaled(timeout)
            )
        return self.calls_of(method)

    # --- Socket Mode ------------------------------------------------------------------

    async def wait_for_socket(self, timeout: float = 15) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: bool(self._sockets)), scaled(timeout))

    async def push_envelope(
        self, payload: dict[str, Any], envelope_id: str, retry_attempt: int = 0, *, kind: str = "events_api"
    ) -> None:
        """Send an envelope to every connected app, as Slack's Socket Mode does: `events_api`
        (an Events API payload) or `interactive` (an interaction payload, e.g. block_actions)."""
        envelope: dict[str, Any] = {"envelope_id": envelope_id, "type": kind, "payload": payload}
        if kind == "events_api":
            envelope.update(retry_attempt=retry_attempt, retry_reason="timeout" if retry_attempt else "")
        envelope["accepts_response_payload"] = kind == "interactive"
        for ws in list(self._sockets):
            await ws.send_str(json.dumps(envelope))

    async def wait_for_acks(self, count: int, timeout: float = 15) -> list[str]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.acks) >= count), scaled(timeout))
        return list(self.acks)

    async def _socket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        await ws.send_str(
            json.dumps({"type": "hello", "num_connections": 1, "connection_info": {"app_id": "A0001"}})
        )
        async with self._changed:
            self._sockets.append(ws)
            self._changed.notify_all()
        try:
            async for msg in ws:
                data = json.loads(msg.data) if isinstance(msg.data, str) else {}
                if "envelope_id" in data:
                    async with self._changed:
                        self.acks.append(data["envelope_id"])
                        self._changed.notify_all()
        finally:
            self._sockets.remove(ws)
        return ws

    # --- Web API --------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        if request.content_type == "application/json":
            params = await request.json()
        else:
            params = dict(await request.post())
        params = {**dict(request.query), **params}  # Slack takes arguments in the query string too
        headers = {k.lower(): v for k, v in request.headers.items()}
        if method == "apps.connections.open":
            expected = f"Bearer {APP_TOKEN}"
        else:
            expected = f"Bearer {self.token}"
        async with self._changed:
            if headers.get("authorization") != expected:
                failure: Failure | None = Failure(200, "invalid_auth")
            else:
                scripted = self.script.get(method) or self.by_channel.get(str(params.get("channel")))
                failure = scripted.pop(0) if scripted else self.always.get(method)
            self.calls.append(Call(method, params, headers, ok=failure is None))
            self._changed.notify_all()
        if method == "apps.connections.open" and failure is None:
            return web.json_response({"ok": True, "url": f"ws://127.0.0.1:{self._port}/link/?ticket=t1"})
        if failure is not None:
            extra = {"Retry-After": str(failure.retry_after)} if failure.retry_after is not None else {}
            return web.json_response(
                {"ok": False, "error": failure.error}, status=failure.status, headers=extra
            )
        if method == "auth.test":
            return web.json_response(
                {
                    "ok": True,
                    "url": "https://test.slack.com/",
                    "team": "Test",
                    "user": "gate",
                    "team_id": TEAM_ID,
                    "user_id": self.bot_user_id,
                    "bot_id": BOT_ID,
                }
            )
        if method == "users.info":
            flags = self.users.get(str(params.get("user")), {})
            return web.json_response(
                {"ok": True, "user": {"id": params.get("user"), "team_id": TEAM_ID, **flags}}
            )
        if method == "chat.postMessage":
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            message = {"type": "message", "text": params.get("text"), "user": self.bot_user_id, "ts": ts}
            if params.get("thread_ts"):
                message["thread_ts"] = params["thread_ts"]
                self.threads[ts] = str(params["thread_ts"])
            self.texts[ts] = str(params.get("text"))
            return web.json_response(
                {"ok": True, "channel": params.get("channel"), "ts": ts, "message": message}
            )
        if method == "files.getUploadURLExternal":
            file_id = f"F{next(self._ts):08d}"
            return web.json_response(
                {
                    "ok": True,
                    "upload_url": f"http://127.0.0.1:{self._port}/upload/{file_id}",
                    "file_id": file_id,
                }
            )
        if method == "files.completeUploadExternal":
            raw = params.get("files")
            files: list[dict[str, Any]] = json.loads(raw) if isinstance(raw, str) else list(raw or [])
            missing = [f["id"] for f in files if f["id"] not in self.uploads]
            if missing:
                return web.json_response({"ok": False, "error": "file_not_found"})
            for f in files:
                self.completed.append(
                    {
                        "id": f["id"],
                        "title": f.get("title"),
                        "channel": params.get("channel_id"),
                        "thread_ts": params.get("thread_ts"),
                        "bytes": self.uploads[f["id"]],
                    }
                )
            return web.json_response(
                {"ok": True, "files": [{"id": f["id"], "title": f.get("title")} for f in files]}
            )
        if method.endswith("Stream"):
            return self._stream(method, params)
        if method == "chat.update":
            ts = str(params.get("ts"))
            if ts not in self.texts:
                return web.json_response({"ok": False, "error": "message_not_found"})
            self.texts[ts] = str(params.get("text"))
            return web.json_response(
                {
                    "ok": True,
                    "channel": params.get("channel"),
                    "ts": ts,
                    "text": params.get("text"),
                    "message": {"type": "message", "text": params.get("text"), "user": self.bot_user_id},
                }
            )
        if method == "conversations.replies":
            # The thread a message belongs to (a reply's thread_ts is its parent's ts).
            ts = str(params.get("ts"))
            parent = self.threads.get(ts)
            if parent is None and ts not in self.texts:
                return web.json_response({"ok": False, "error": "thread_not_found"})
            first: dict[str, Any] = {
                "type": "message",
                "ts": parent or ts,
                "text": self.texts.get(parent or ts),
            }
            if parent is not None:
                first["thread_ts"] = parent
            return web.json_response({"ok": True, "messages": [first], "has_more": False})
        if method == "chat.delete":
            if self.texts.pop(str(params.get("ts")), None) is None:
                return web.json_response({"ok": False, "error": "message_not_found"})
            return web.json_response({"ok": True, "channel": params.get("channel"), "ts": params.get("ts")})
        if method == "chat.postEphemeral":
            return web.json_response({"ok": True, "message_ts": f"{int(time.time())}.{next(self._ts):06d}"})
        return web.json_response({"ok": False, "error": "unknown_method"}, status=404)

    def _stream(self, method: str, params: dict[str, Any]) -> web.Response:
        """chat.startStream / appendStream / stopStream: one message whose markdown grows, then ends.

        Slack's rules as documented: startStream needs a channel and, outside a DM, the
        recipient's user and team; appendStream needs markdown_text; a stream that was
        stopped takes no more appends or stops.
        """
        channel, text = str(params.get("channel") or ""), params.get("markdown_text")
        if method == "chat.startStream":
            if not channel.startswith("D") and not (
                params.get("recipient_user_id") and params.get("recipient_team_id")
            ):
                return web.json_response({"ok": False, "error": "invalid_arguments"})
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            self.texts[ts] = str(text or "")
            self.streaming.add(ts)
            return web.json_response({"ok": True, "channel": channel, "ts": ts})
        ts = str(params.get("ts"))
        if ts not in self.texts:
            return web.json_response({"ok": False, "error": "message_not_found"})
        if ts not in self.streaming:
            return web.json_response({"ok": False, "error": "message_not_in_streaming_state"})
        if method == "chat.appendStream" and not text:
            return web.json_response({"ok": False, "error": "invalid_arguments"})
        if method not in ("chat.appendStream", "chat.stopStream"):
            return web.json_response({"ok": False, "error": "unknown_method"}, status=404)
        self.texts[ts] += str(text or "")
        if method == "chat.stopStream":
            self.streaming.discard(ts)
        return web.json_response({"ok": True, "channel": channel, "ts": ts})

    @property
    def files_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/files-pri/"

    async def _file(self, request: web.Request) -> web.Response:
        path = request.match_info["path"]
        async with self._changed:
            self.calls.append(
                Call("download", {"path": path}, {k.lower(): v for k, v in request.headers.items()})
            )
            self._changed.notify_all()
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=302, headers={"Location": "https://slack.com/signin"})
        if path not in self.files:
            return web.Response(status=404)
        return web.Response(body=self.files[path], content_type="application/octet-stream")

    async def _upload(self, request: web.Request) -> web.Response:
        data = await request.read()
        async with self._changed:
            status = self.upload_failures.pop(0) if self.upload_failures else None
            self.calls.append(
                Call("upload", {"file_id": request.match_info["file_id"]}, {}, ok=status is None)
            )
            self._changed.notify_all()
        if status is not None:
            return web.Response(status=status, text="upload failed")
        self.uploads[request.match_info["file_id"]] = data
        return web.Response(text=f"OK - {len(data)}")

    async def __aenter__(self) -> FakeSlack:
        app = web.Application()
        app.router.add_post("/upload/{file_id}", self._upload)
        app.router.add_get("/files-pri/{path:.+}", self._file)
        app.router.add_post("/api/{method}", self._handle)
        app.router.add_get("/api/{method}", self._handle)  # slack_sdk reads users.info with GET
        app.router.add_get("/link/", self._socket)
        self._port = await self._serve(app, "/api/", shutdown_timeout=0.5)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await super().__aexit__(*exc)


# --- Events API payloads, signed as Slack signs them --------------------------------------

_event_ids = itertools.count(1)
_ts = itertools.count(1)


def new_ts() -> str:
    return f"{int(time.time())}.{next(_ts):06d}"


def signed_headers(
    body: bytes, *, secret: str = SIGNING_SECRET, timestamp: int | None = None
) -> dict[str, str]:
    """`v0=` + hex HMAC-SHA256(signing secret, "v0:{timestamp}:{body}") — Slack's published rule."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(secret.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Slack-Request-Timestamp": ts,
        "X-Slack-Signature": f"v0={mac}",
    }


def event_callback(event: dict[str, Any], event_id: str | None = None) -> dict[str, Any]:
    return {
        "token": "verification-token-unused",
        "team_id": TEAM_ID,
        "api_app_id": "A0001",
        "event": event,
        "type": "event_callback",
        "event_id": event_id or f"Ev{next(_event_ids):08d}",
        "event_time": int(time.time()),
        "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
    }


def dm(text: str, *, user: str = "UALICE", channel: str = "D0ALICE", **extra: Any) -> dict[str, Any]:
    event = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": new_ts(),
        "channel_type": "im",
        "event_ts": "",
    }
    event["event_ts"] = event["ts"]
    event.update(extra)
    return event


def mention(text: str, *, user: str = "UALICE", channel: str = "C0GENERAL", **extra: Any) -> dict[str, Any]:
    ts = new_ts()
    event = {
        "type": "app_mention",
        "channel": channel,
        "user": user,
        "text": f"<@{BOT_USER_ID}> {text}",
        "ts": ts,
        "event_ts": ts,
    }
    event.update(extra)
    return event


def channel_message(
    text: str, *, user: str = "UALICE", channel: str = "C0GENERAL", **extra: Any
) -> dict[str, Any]:
    ts = new_ts()
    event = {
        "type": "message",
        "channel": channel,
        "user": user,
        "text": text,
        "ts": ts,
        "event_ts": ts,
        "channel_type": "channel",
    }
    event.update(extra)
    return event


def body_of(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def reaction(
    reaction: str, *, on_ts: str, channel: str, user: str = "UALICE", removed: bool = False
) -> dict[str, Any]:
    """`reaction_added` (or `reaction_removed`) of `user` on the message `on_ts`."""
    return {
        "type": "reaction_removed" if removed else "reaction_added",
        "user": user,
        "reaction": reaction,
        "item": {"type": "message", "channel": channel, "ts": on_ts},
        "item_user": BOT_USER_ID,
        "event_ts": new_ts(),
    }


def block_action(
    action_id: str, value: str, *, on_ts: str, channel: str, user: str = "UALICE"
) -> dict[str, Any]:
    """A `block_actions` interaction: `user` pressed the button `action_id` on the message `on_ts`."""
    return {
        "type": "block_actions",
        "team": {"id": TEAM_ID, "domain": "test"},
        "user": {"id": user, "username": user.lower(), "team_id": TEAM_ID},
        "api_app_id": "A0001",
        "trigger_id": f"trig{next(_ts)}",
        "container": {"type": "message", "message_ts": on_ts, "channel_id": channel, "is_ephemeral": False},
        "channel": {"id": channel, "name": "general"},
        "message": {"type": "message", "ts": on_ts, "user": BOT_USER_ID, "text": "prompt"},
        "actions": [
            {
                "type": "button",
                "action_id": action_id,
                "block_id": "b1",
                "value": value,
                "action_ts": new_ts(),
                "text": {"type": "plain_text", "text": action_id},
            }
        ],
    }


def interaction_body(payload: dict[str, Any]) -> bytes:
    """How Slack posts an interaction: form-encoded, one field `payload` holding the JSON."""
    return urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
