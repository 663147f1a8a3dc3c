"""A fake of the WhatsApp Cloud API (Graph API), written from Meta's published documentation.

* `GraphAPI` is a real HTTP server playing `POST /{version}/{phone-number-id}/messages`
  (bearer token checked, text bodies limited to 4,096 characters, free-form messages to a
  recipient in `closed` refused with error 131047 as outside the 24-hour window),
  `GET /{version}/{media-id}` (a media URL) and that URL (bytes, bearer token checked),
  and `GET /{version}/{phone-number-id}` (the number, for the doctor's probe).
* `signed_headers` signs a webhook as Meta does: `X-Hub-Signature-256: sha256=` + the hex
  HMAC-SHA256 of the raw body with the app secret.
* `text_message`, `image_message`, `status_update` build webhook payloads as documented.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer

VERSION = "v24.0"
_ids = itertools.count(1)


def signed_headers(app_secret: str, body: bytes) -> dict[str, str]:
    digest = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    return {"Content-Type": "application/json", "X-Hub-Signature-256": f"sha256={digest}"}


def _webhook(phone_number_id: str, value: dict[str, Any]) -> dict[str, Any]:
    return {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": "WABA-1",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "messaging_product": "whatsapp",
                            "metadata": {
                                "display_phone_number": "15550001111",
                                "phone_number_id": phone_number_id,
                            },
                            **value,
                        },
                    }
                ],
            }
        ],
    }


def _message_value(wa_id: str, message: dict[str, Any], name: str = "Ada") -> dict[str, Any]:
    return {"contacts": [{"profile": {"name": name}, "wa_id": wa_id}], "messages": [message]}


def text_message(
    phone_number_id: str,
    wa_id: str,
    text: str,
    *,
    message_id: str | None = None,
    timestamp: float | None = None,
    group_id: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "from": wa_id,
        "id": message_id or f"wamid.IN{next(_ids)}",
        "timestamp": str(int(time.time() if timestamp is None else timestamp)),
        "type": "text",
        "text": {"body": text},
    }
    if group_id:
        message["group_id"] = group_id
    return _webhook(phone_number_id, _message_value(wa_id, message))


def native_message(
    phone_number_id: str,
    wa_id: str,
    kind: str,
    body: dict[str, Any],
    *,
    context: str | None = None,
    group_id: str | None = None,
) -> dict[str, Any]:
    """A `reaction`, `interactive`, `edit` or `revoke` message, as the reference shows them."""
    message: dict[str, Any] = {
        "from": wa_id,
        "id": f"wamid.IN{next(_ids)}",
        "timestamp": str(int(time.time())),
        "type": kind,
        kind: body,
    }
    if context is not None:
        message["context"] = {"from": "15550001111", "id": context}
    if group_id:
        message["group_id"] = group_id
    return _webhook(phone_number_id, _message_value(wa_id, message))


def _interactive_error(body: dict[str, Any]) -> str | None:
    """Cloud API limits on reply-button messages (the only interactive type chatgate sends)."""
    interactive = body.get("interactive") or {}
    text = (interactive.get("body") or {}).get("text")
    buttons = (interactive.get("action") or {}).get("buttons")
    if interactive.get("type") != "button" or not isinstance(text, str) or not 1 <= len(text) <= 1024:
        return "Param interactive['body']['text'] must be between 1 and 1024 characters"
    if not isinstance(buttons, list) or not 1 <= len(buttons) <= 3:
        return "Param interactive['action']['buttons'] must have between 1 and 3 items"
    for button in buttons:
        reply = button.get("reply") or {}
        if button.get("type") != "reply" or not 1 <= len(str(reply.get("title", ""))) <= 20:
            return "Param interactive['action']['buttons'][]['reply']['title'] is invalid"
        if not 1 <= len(str(reply.get("id", ""))) <= 256:
            return "Param interactive['action']['buttons'][]['reply']['id'] is invalid"
    return None


def image_message(phone_number_id: str, wa_id: str, media_id: str, *, caption: str = "") -> dict[str, Any]:
    image = {"id": media_id, "mime_type": "image/png", "sha256": "x"}
    if caption:
        image["caption"] = caption
    message = {
        "from": wa_id,
        "id": f"wamid.IN{next(_ids)}",
        "timestamp": str(int(time.time())),
        "type": "image",
        "image": image,
    }
    return _webhook(phone_number_id, _message_value(wa_id, message))


def status_update(
    phone_number_id: str, wamid: str, status: str, recipient: str, *, error: dict[str, Any] | None = None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "id": wamid,
        "status": status,
        "timestamp": str(int(time.time())),
        "recipient_id": recipient,
    }
    if error is not None:
        entry["errors"] = [error]
    return _webhook(phone_number_id, {"statuses": [entry]})


@dataclass
class Sent:
    phone_number_id: str
    body: dict[str, Any]
    wamid: str


class GraphAPI(LocalServer):
    """`fail_first` answers that many message calls with 500 before accepting any."""

    def __init__(
        self,
        access_token: str,
        phone_number_id: str,
        *,
        fail_first: int = 0,
        throttle_first: int = 0,
        fail_at: frozenset[int] = frozenset(),
    ) -> None:
        self.access_token = access_token
        self.phone_number_id = phone_number_id
        self.fail_first = fail_first
        self.fail_at = fail_at  # message attempts (1-based) answered 500
        self.throttle_first = throttle_first  # message calls answered 429 (code 130429) first
        self.uploads: list[tuple[str, bytes, str]] = []  # (type field, bytes, file's content type)
        self.message_attempts = 0
        self.sent: list[Sent] = []
        self.media: dict[str, tuple[bytes, str]] = {}  # media id -> (bytes, MIME type)
        self.media_lookups: list[str] = []
        self.downloads: list[str] = []
        self.read_marks: list[dict[str, Any]] = []  # `status: read` calls (typing indicators)
        self.closed: set[str] = set()  # recipients whose customer-service window is closed
        self._changed = asyncio.Condition()

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.access_token}"

    @staticmethod
    def _error(status: int, code: int, message: str) -> web.Response:
        body = {"error": {"message": message, "type": "OAuthException", "code": code, "fbtrace_id": "T"}}
        return web.json_response(body, status=status)

    async def _messages(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token.")
        if request.match_info["phone"] != self.phone_number_id:
            return self._error(400, 100, "Unsupported post request.")
        body = await request.json()
        if body.get("status") == "read" and body.get("messaging_product") == "whatsapp":
            # Mark as read (with the typing indicator if asked): not counted as a message.
            async with self._changed:
                self.read_marks.append(body)
                self._changed.notify_all()
            return web.json_response({"success": True})
        self.message_attempts += 1
        if self.message_attempts <= self.throttle_first:
            return self._error(429, 130429, "Rate limit hit")
        if self.message_attempts <= self.fail_first or self.message_attempts in self.fail_at:
            return self._error(500, 1, "An unknown error occurred")
        if body.get("messaging_product") != "whatsapp" or not body.get("to"):
            return self._error(400, 100, "The parameter messaging_product is required.")
        if body.get("type") == "text" and len(body["text"]["body"]) > 4096:
            return self._error(400, 100, "Param text['body'] must be at most 4096 characters long.")
        if body.get("type") == "interactive" and (error := _interactive_error(body)) is not None:
            return self._error(400, 100, error)
        if body["to"] in self.closed and body.get("type") != "template":
            return self._error(400, 131047, "Re-engagement message")
        wamid = f"wamid.OUT{len(self.sent) + 1}"
        async with self._changed:
            self.sent.append(Sent(request.match_info["phone"], body, wamid))
            self._changed.notify_all()
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "contacts": [{"input": body["to"], "wa_id": body["to"]}],
                "messages": [{"id": wamid}],
            }
        )

    async def _upload(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token.")
        form = await request.post()
        upload = form.get("file")
        if form.get("messaging_product") != "whatsapp" or not isinstance(upload, web.FileField):
            return self._error(400, 100, "The parameter file is required.")
        self.uploads.append((str(form.get("type")), upload.file.read(), upload.content_type))
        return web.json_response({"id": f"UPLOADED-{len(self.uploads)}"})

    async def _node(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return self._error(401, 190, "Invalid OAuth access token.")
        node = request.match_info["node"]
        if node == self.phone_number_id:
            return web.json_response(
                {"display_phone_number": "+1 555-000-1111", "verified_name": "Chatgate Test", "id": node}
            )
        if node not in self.media:
            return self._error(400, 100, "Unsupported get request.")
        self.media_lookups.append(node)
        data, mime = self.media[node]
        return web.json_response(
            {
                "messaging_product": "whatsapp",
                "url": f"{self.url}/lookaside/{node}",
                "mime_type": mime,
                "sha256": hashlib.sha256(data).hexdigest(),
                "file_size": len(data),
                "id": node,
            }
        )

    async def _download(self, request: web.Request) -> web.Response:
        if not self._authorized(request):  # the media URL needs the token too
            return web.Response(status=401)
        node = request.match_info["node"]
        self.downloads.append(node)
        data, mime = self.media[node]
        return web.Response(body=data, content_type=mime)

    async def wait_for_read(self, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.read_marks) >= count), timeout)
        return list(self.read_marks)

    async def wait_for(self, count: int, timeout: float = 15) -> list[Sent]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.sent) >= count), timeout)
        return list(self.sent)

    async def __aenter__(self) -> GraphAPI:
        app = web.Application()
        app.router.add_post(f"/{VERSION}/{{phone}}/messages", self._messages)
        app.router.add_post(f"/{VERSION}/{{phone}}/media", self._upload)
        app.router.add_get(f"/{VERSION}/{{node}}", self._node)
        app.router.add_get("/lookaside/{node}", self._download)
        await self._serve(app)
        return self
