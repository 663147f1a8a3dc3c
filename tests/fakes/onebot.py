"""Fakes of OneBot v11 bridges (NapCat, Lagrange …), written from the v11 spec.

* `FakeBridge` is a real WebSocket client that connects to chatgate's reverse WebSocket
  the way a bridge does (`Authorization: Bearer`, `X-Self-ID`, `X-Client-Role`), pushes
  events and answers the actions it receives, recording them.
* `FakeHttpApi` is a real HTTP server playing a bridge's HTTP API (`POST /<action>`).
* `sign_post` signs an HTTP POST report: `sha1=` + hex HMAC-SHA1(secret, body).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

_message_ids = itertools.count(1000)


def sign_post(secret: str, body: bytes) -> str:
    return "sha1=" + hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()


def private_message(self_id: int, user_id: int, message: Any, *, message_id: int | None = None) -> dict:
    return {
        "time": int(time.time()),
        "self_id": self_id,
        "post_type": "message",
        "message_type": "private",
        "sub_type": "friend",
        "message_id": next(_message_ids) if message_id is None else message_id,
        "user_id": user_id,
        "message": message,
        "raw_message": message if isinstance(message, str) else "",
        "font": 0,
        "sender": {"user_id": user_id, "nickname": f"user{user_id}"},
    }


def group_message(
    self_id: int,
    group_id: int,
    user_id: int,
    message: Any,
    *,
    message_id: int | None = None,
    role: str = "member",
) -> dict:
    return {
        "time": int(time.time()),
        "self_id": self_id,
        "post_type": "message",
        "message_type": "group",
        "sub_type": "normal",
        "message_id": next(_message_ids) if message_id is None else message_id,
        "group_id": group_id,
        "user_id": user_id,
        "anonymous": None,
        "message": message,
        "raw_message": message if isinstance(message, str) else "",
        "font": 0,
        "sender": {"user_id": user_id, "nickname": f"user{user_id}", "card": "", "role": role},
    }


def heartbeat(self_id: int) -> dict:
    return {
        "time": int(time.time()),
        "self_id": self_id,
        "post_type": "meta_event",
        "meta_event_type": "heartbeat",
        "status": {"online": True, "good": True},
        "interval": 5000,
    }


@dataclass
class Action:
    action: str
    params: dict[str, Any]
    echo: Any


@dataclass
class FakeBridge:
    """A bot account's bridge on the reverse WebSocket.

    `mode`: "ok" answers every action with a new message id; "fail" answers
    `{"status": "failed", "retcode": 200}`; "silent" never answers.
    """

    ws_url: str
    self_id: int
    token: str | None
    mode: str = "ok"
    role: str = "Universal"
    token_in_query: bool = False
    fail_at: frozenset[int] = frozenset()  # 1-based action numbers answered as failed
    actions: list[Action] = field(default_factory=list)
    sent_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        self._ids = itertools.count(self.self_id * 10 + 1)

    def _connect_args(self) -> tuple[str, dict[str, str]]:
        headers = {"X-Self-ID": str(self.self_id), "X-Client-Role": self.role}
        url = self.ws_url
        if self.token is not None:
            if self.token_in_query:
                url += f"?access_token={self.token}"
            else:
                headers["Authorization"] = f"Bearer {self.token}"
        return url, headers

    async def __aenter__(self) -> FakeBridge:
        url, headers = self._connect_args()
        self._ws = await connect(url, additional_headers=headers)
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await self._reader

    @property
    def close_code(self) -> int | None:
        return self._ws.close_code if self._ws is not None else None

    async def wait_closed(self, timeout: float = 10) -> int | None:
        assert self._ws is not None
        await asyncio.wait_for(self._ws.wait_closed(), scaled(timeout))
        return self._ws.close_code

    async def send_raw(self, data: str | bytes) -> None:
        assert self._ws is not None
        await self._ws.send(data)

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self._read_frames()

    async def _read_frames(self) -> None:
        assert self._ws is not None
        async for raw in self._ws:
            frame = json.loads(raw)
            action = Action(frame["action"], frame.get("params") or {}, frame.get("echo"))
            async with self._changed:
                self.actions.append(action)
                self._changed.notify_all()
            if self.mode == "ok" and len(self.actions) not in self.fail_at:
                message_id = next(self._ids)
                self.sent_ids.append(message_id)
                answer = {"status": "ok", "retcode": 0, "data": {"message_id": message_id}}
            elif self.mode in ("ok", "fail"):
                answer = {"status": "failed", "retcode": 200, "data": None, "wording": "send failed"}
            else:
                continue
            await self._ws.send(json.dumps({**answer, "echo": action.echo}))

    async def send_event(self, event: dict[str, Any]) -> None:
        assert self._ws is not None
        await self._ws.send(json.dumps(event))

    async def wait_for_actions(self, count: int, timeout: float = 15) -> list[Action]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.actions) >= count), scaled(timeout)
            )
        return list(self.actions)


async def refused_with(ws_url: str, headers: dict[str, str], timeout: float = 5) -> tuple[int | None, str]:
    """Connect like a bridge and return the close code and reason the server answered with."""
    async with connect(ws_url, additional_headers=headers) as ws:
        try:
            await asyncio.wait_for(ws.recv(), scaled(timeout))
        except ConnectionClosed as exc:
            return (exc.rcvd.code if exc.rcvd else None), (exc.rcvd.reason if exc.rcvd else "")
    return None, ""


@dataclass
class ApiCall:
    action: str
    headers: dict[str, str]
    params: dict[str, Any]


class FakeHttpApi(LocalServer):
    """A bridge's HTTP API: `POST /<action>` with JSON params, `Authorization: Bearer`.

    Answers 500 to the first `fail_first` calls (all of them with `fail_first=-1`), 401
    when the token is wrong, and otherwise `{"status": "ok", "retcode": 0, "data": …}`.
    """

    def __init__(self, token: str | None, *, fail_first: int = 0) -> None:
        self.token = token
        self.fail_first = fail_first
        self.attempts = 0
        self.calls: list[ApiCall] = []
        self._ids = itertools.count(5000)
        self._changed = asyncio.Condition()

    async def _handle(self, request: web.Request) -> web.Response:
        self.attempts += 1
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.Response(status=401)
        if self.fail_first < 0 or self.attempts <= self.fail_first:
            return web.Response(status=500, text="bridge is down")
        params = await request.json()
        async with self._changed:
            self.calls.append(ApiCall(request.match_info["action"], dict(request.headers), params))
            self._changed.notify_all()
        return web.json_response({"status": "ok", "retcode": 0, "data": {"message_id": next(self._ids)}})

    async def wait_for(self, count: int, timeout: float = 15) -> list[ApiCall]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.calls) >= count), scaled(timeout))
        return list(self.calls)

    async def __aenter__(self) -> FakeHttpApi:
        app = web.Application()
        app.router.add_post("/{action}", self._handle)
        await self._serve(app)
        return self


def recall_notice(self_id: int, user_id: int, message_id: int, *, group_id: int | None = None) -> dict:
    """`group_recall` (with `group_id`) or `friend_recall`: the author recalled `message_id`."""
    data: dict[str, Any] = {
        "time": int(time.time()),
        "self_id": self_id,
        "post_type": "notice",
        "user_id": user_id,
        "message_id": message_id,
    }
    if group_id is None:
        return {**data, "notice_type": "friend_recall"}
    return {**data, "notice_type": "group_recall", "group_id": group_id, "operator_id": user_id}


def member_notice(self_id: int, group_id: int, user_id: int, *, joined: bool) -> dict:
    """`group_increase` (joined) or `group_decrease` (left)."""
    return {
        "time": int(time.time()),
        "self_id": self_id,
        "post_type": "notice",
        "notice_type": "group_increase" if joined else "group_decrease",
        "sub_type": "approve" if joined else "leave",
        "group_id": group_id,
        "operator_id": user_id,
        "user_id": user_id,
    }
