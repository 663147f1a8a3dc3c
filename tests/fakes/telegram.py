"""A fake Telegram Bot API: a real local HTTP server that python-telegram-bot talks to.

It serves `/bot{token}/{method}` like api.telegram.org (form or JSON parameters, answers
`{"ok": true, "result": …}` or `{"ok": false, "error_code", "description", "parameters"}`),
records every call, can be scripted to fail, and queues updates for `getUpdates`.
The update payloads Telegram sends (Bot API object shapes) are built in
`telegram_updates`; its names are re-exported here, so tests use one module
(`from tests.fakes import telegram as tg`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer
from tests.fakes.telegram_updates import (
    BOT_ID,
    BOT_USERNAME,
    TOKEN,
    bot_user,
    callback_update,
    chat_member_update,
    edited_update,
    group_chat,
    members_message,
    mention_entity,
    message,
    private_chat,
    reaction_update,
    update,
    user,
)
from tests.support.timing import scaled

# The update payloads' builders live in `telegram_updates`; tests reach them here too.
__all__ = [
    "BLOCKED",
    "BOT_ID",
    "BOT_USERNAME",
    "CONFLICT",
    "SERVER_ERROR",
    "TOKEN",
    "TOO_MANY_REQUESTS",
    "UNAUTHORIZED",
    "WEBHOOK_SET",
    "Call",
    "Failure",
    "FakeTelegram",
    "bot_user",
    "callback_update",
    "chat_member_update",
    "edited_update",
    "group_chat",
    "members_message",
    "mention_entity",
    "message",
    "private_chat",
    "reaction_update",
    "update",
    "user",
]


@dataclass
class Call:
    method: str
    params: dict[str, Any]
    ok: bool = True  # False when the fake answered with an error
    at: float = field(default_factory=time.time)  # when the fake received it (unix seconds)


@dataclass
class Failure:
    status: int
    description: str
    retry_after: int | None = None

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": False, "error_code": self.status, "description": self.description}
        if self.retry_after is not None:
            body["parameters"] = {"retry_after": self.retry_after}
        return body


TOO_MANY_REQUESTS = Failure(429, "Too Many Requests: retry after 1", retry_after=1)
SERVER_ERROR = Failure(500, "Internal Server Error")
BLOCKED = Failure(403, "Forbidden: bot was blocked by the user")
UNAUTHORIZED = Failure(401, "Unauthorized")
CONFLICT = Failure(409, "Conflict: terminated by other getUpdates request")
WEBHOOK_SET = Failure(
    409,
    "Conflict: can't use getUpdates method while webhook is active; "
    "use deleteWebhook to delete the webhook first",
)


@dataclass
class FakeTelegram(LocalServer):
    token: str = TOKEN
    bot_id: int = BOT_ID
    username: str = BOT_USERNAME
    calls: list[Call] = field(default_factory=list)
    # method -> answers of its next calls, in order: a failure, or None for a normal answer
    script: dict[str, list[Failure | None]] = field(default_factory=dict)
    # method -> failure answered every time
    always: dict[str, Failure] = field(default_factory=dict)
    # method -> (n, failure): every n-th call of the method is answered with the failure
    every: dict[str, tuple[int, Failure]] = field(default_factory=dict)
    # method -> seconds every answer of it takes (a slow round trip)
    slow: dict[str, float] = field(default_factory=dict)
    updates: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    file_url: str = ""
    polls_in_flight: int = 0  # getUpdates calls being answered now
    most_polls_in_flight: int = 0  # the most at any one time (Telegram allows one poller per token)
    # message id -> its current text, as the chat shows it (sent, then edited)
    texts: dict[int, str] = field(default_factory=dict)
    # (chat id, draft id) -> the draft's current text (sendMessageDraft; never a message)
    drafts: dict[tuple[int, int], str] = field(default_factory=dict)
    # file_id -> the file's bytes, served by getFile and the file download URL
    files: dict[str, bytes] = field(default_factory=dict)
    # chat id -> {user id: "creator" | "administrator"}, served by getChatAdministrators
    admins: dict[int, dict[int, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1000)

    # --- test API -------------------------------------------------------------------

    def fail(self, method: str, *failures: Failure | None) -> None:
        self.script.setdefault(method, []).extend(failures)

    def calls_of(self, method: str) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def sent_texts(self) -> list[str]:
        """Texts Telegram accepted (failed attempts excluded)."""
        return [c.params["text"] for c in self.calls_of("sendMessage") if c.ok]

    async def wait_for(self, method: str, count: int, timeout: float = 15) -> list[Call]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.calls_of(method)) >= count), scaled(timeout)
            )
        return self.calls_of(method)

    async def push_update(self, update: dict[str, Any]) -> None:
        async with self._changed:
            self.updates.append(update)
            self._changed.notify_all()

    # --- the server -----------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        token, method = request.match_info["token"], request.match_info["method"]
        if token != self.token:
            return web.json_response(
                {"ok": False, "error_code": 401, "description": "Unauthorized"}, status=401
            )
        params = await _params(request)
        async with self._changed:
            scripted = self.script.get(method)
            failure = scripted.pop(0) if scripted else self.always.get(method)
            if failure is None and method in self.every:
                n, periodic = self.every[method]
                if (len(self.calls_of(method)) + 1) % n == 0:
                    failure = periodic
            call = Call(method, params, ok=failure is None)
            self.calls.append(call)
            self._changed.notify_all()
        if method in self.slow:
            await asyncio.sleep(self.slow[method])
        if failure is not None:
            return web.json_response(failure.body(), status=failure.status)
        handler = getattr(self, f"_m_{method}", None)
        if handler is None:
            return web.json_response(
                {"ok": False, "error_code": 404, "description": "Not Found: method not found"}, status=404
            )
        result = await handler(params)
        if isinstance(result, web.Response):
            call.ok = False
            return result
        return web.json_response({"ok": True, "result": result})

    async def _m_getMe(self, _params: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.bot_id,
            "is_bot": True,
            "first_name": "Gate",
            "username": self.username,
            "can_join_groups": True,
            "can_read_all_group_messages": False,
            "supports_inline_queries": False,
        }

    async def _m_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        chat_id = int(params["chat_id"])
        message: dict[str, Any] = {
            "message_id": next(self._ids),
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": {"id": self.bot_id, "is_bot": True, "first_name": "Gate", "username": self.username},
            "text": params["text"],
        }
        self.texts[message["message_id"]] = params["text"]
        if "message_thread_id" in params:
            message["message_thread_id"] = int(params["message_thread_id"])
        return message

    async def _m_editMessageText(self, params: dict[str, Any]) -> dict[str, Any] | web.Response:
        message_id = int(params["message_id"])
        if message_id not in self.texts:
            return _bad_request("Bad Request: message to edit not found")
        if self.texts[message_id] == params["text"]:
            return _bad_request(
                "Bad Request: message is not modified: specified new message content and reply markup "
                "are exactly the same as a current content and reply markup of the message"
            )
        self.texts[message_id] = params["text"]
        chat_id = int(params["chat_id"])
        return {
            "message_id": message_id,
            "date": int(time.time()),
            "edit_date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": {"id": self.bot_id, "is_bot": True, "first_name": "Gate", "username": self.username},
            "text": params["text"],
        }

    async def _m_editMessageReplyMarkup(self, params: dict[str, Any]) -> dict[str, Any] | web.Response:
        message_id = int(params["message_id"])
        if message_id not in self.texts:
            return _bad_request("Bad Request: message to edit not found")
        chat_id = int(params["chat_id"])
        return {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": {"id": self.bot_id, "is_bot": True, "first_name": "Gate", "username": self.username},
            "text": self.texts[message_id],
            "reply_markup": params.get("reply_markup"),
        }

    async def _m_answerCallbackQuery(self, params: dict[str, Any]) -> bool | web.Response:
        if not params.get("callback_query_id"):
            return _bad_request(
                "Bad Request: query is too old and response timeout expired or query ID is invalid"
            )
        return True

    async def _m_deleteMessage(self, params: dict[str, Any]) -> bool | web.Response:
        message_id = int(params["message_id"])
        if self.texts.pop(message_id, None) is None:
            return _bad_request("Bad Request: message to delete not found")
        return True

    async def _m_sendMessageDraft(self, params: dict[str, Any]) -> bool | web.Response:
        """Bot API 9.3: a private chat's draft, replaced by each call with the same draft_id."""
        chat_id, draft_id = int(params["chat_id"]), int(params.get("draft_id") or 0)
        if chat_id <= 0:
            return _bad_request("Bad Request: message drafts can be sent only to private chats")
        if draft_id == 0:
            return _bad_request("Bad Request: draft_id must be non-zero")
        self.drafts[(chat_id, draft_id)] = str(params.get("text") or "")
        return True

    async def _m_sendChatAction(self, params: dict[str, Any]) -> bool | web.Response:
        if params.get("action") not in {"typing", "upload_photo", "upload_document", "record_voice"}:
            return _bad_request("Bad Request: wrong parameter action in request")
        return True

    async def _m_sendPhoto(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._media_message(params, "photo")

    async def _m_sendDocument(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._media_message(params, "document")

    def _media_message(self, params: dict[str, Any], field_name: str) -> dict[str, Any]:
        chat_id = int(params["chat_id"])
        message_id = next(self._ids)
        file_id = f"sent-{message_id}"
        value = params.get(field_name)
        if isinstance(value, dict):  # uploaded: keep the bytes, as the chat would show them
            self.files[file_id] = value["bytes"]
        message: dict[str, Any] = {
            "message_id": message_id,
            "date": int(time.time()),
            "chat": {"id": chat_id, "type": "private" if chat_id > 0 else "supergroup"},
            "from": {"id": self.bot_id, "is_bot": True, "first_name": "Gate", "username": self.username},
        }
        if field_name == "photo":
            message["photo"] = [
                {"file_id": file_id, "file_unique_id": "u" + file_id, "width": 1, "height": 1}
            ]
        else:
            message["document"] = {"file_id": file_id, "file_unique_id": "u" + file_id}
        return message

    async def _m_getFile(self, params: dict[str, Any]) -> dict[str, Any] | web.Response:
        file_id = str(params.get("file_id"))
        if file_id not in self.files:
            return _bad_request("Bad Request: invalid file_id")
        return {
            "file_id": file_id,
            "file_unique_id": "u" + file_id,
            "file_size": len(self.files[file_id]),
            "file_path": f"photos/{file_id}.jpg",
        }

    async def _download(self, request: web.Request) -> web.Response:
        if request.match_info["token"] != self.token:
            return web.Response(status=401)
        file_id = request.match_info["path"].rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if file_id not in self.files:
            return web.Response(status=404)
        async with self._changed:
            self.calls.append(Call("download", {"path": request.match_info["path"]}))
            self._changed.notify_all()
        return web.Response(body=self.files[file_id], content_type="application/octet-stream")

    async def _m_getChatAdministrators(self, params: dict[str, Any]) -> list[dict[str, Any]] | web.Response:
        chat_id = int(params["chat_id"])
        if chat_id > 0:
            return _bad_request("Bad Request: there are no administrators in the private chat")
        members = []
        for user_id, status in self.admins.get(chat_id, {}).items():
            member: dict[str, Any] = {"status": status, "user": user(user_id, None), "is_anonymous": False}
            if status == "administrator":
                member.update(
                    can_be_edited=False,
                    can_manage_chat=True,
                    can_delete_messages=True,
                    can_manage_video_chats=True,
                    can_restrict_members=True,
                    can_promote_members=False,
                    can_change_info=True,
                    can_invite_users=True,
                    can_post_stories=False,
                    can_edit_stories=False,
                    can_delete_stories=False,
                )
            members.append(member)
        return members

    async def _m_setWebhook(self, _params: dict[str, Any]) -> bool:
        return True

    async def _m_deleteWebhook(self, _params: dict[str, Any]) -> bool:
        return True

    async def _m_getUpdates(self, params: dict[str, Any]) -> list[dict[str, Any]]:
        offset = int(params.get("offset", 0))
        timeout = float(params.get("timeout", 0))

        def pending() -> list[dict[str, Any]]:
            return [u for u in self.updates if u["update_id"] >= offset]

        async with self._changed:
            self.polls_in_flight += 1
            self.most_polls_in_flight = max(self.most_polls_in_flight, self.polls_in_flight)
            try:
                # The platform's long poll: held for the `timeout` the client asked, not a test's
                # deadline (not scaled: scaled, a hand-over's poll in flight lasted 2.5x its 2 s).
                await asyncio.wait_for(self._changed.wait_for(lambda: bool(pending())), timeout)
            except TimeoutError:
                pass
            finally:
                self.polls_in_flight -= 1
            return pending()

    async def __aenter__(self) -> FakeTelegram:
        app = web.Application()
        app.router.add_route("*", "/bot{token}/{method}", self._handle)
        app.router.add_get("/file/bot{token}/{path:.+}", self._download)
        port = await self._serve(app, "/bot", shutdown_timeout=0.5)
        self.file_url = f"http://127.0.0.1:{port}/file/bot"
        return self


def _bad_request(description: str) -> web.Response:
    return web.json_response({"ok": False, "error_code": 400, "description": description}, status=400)


# Parameters whose values are JSON-serialized objects in the Bot API's form encoding.
_JSON_PARAMS = {"reply_parameters", "allowed_updates", "reply_markup", "entities"}


async def _params(request: web.Request) -> dict[str, Any]:
    if request.content_type == "application/json":
        data = await request.json()
        return dict(data) if isinstance(data, dict) else {}
    form = await request.post() if request.can_read_body else {}
    out: dict[str, Any] = {**dict(request.query)}
    for key, value in form.items():
        if isinstance(value, web.FileField):  # an upload (multipart/form-data)
            out[key] = {"filename": value.filename, "bytes": value.file.read()}
        else:
            out[key] = json.loads(value) if key in _JSON_PARAMS and isinstance(value, str) else value
    return out
