"""Discord's outbound seam: every call that sends, edits or types, for replies and previews.

`DiscordOutbound` is what the adapter's `send` and the streamer (`stream.py`) both use:
one HTTP client, one error mapping (429 → `ChannelRateLimited`, 404 → `UnknownMessage`,
…) and the reply's steps (`channels.common.steps`), so a retried reply does not send a
chunk twice, whoever sent it first.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
from typing import TYPE_CHECKING, Any

import httpx

from app.errors import ChannelRateLimited, ChannelRejected, ChannelSendAuthError, ChannelUnavailable
from app.events import APPROVAL_KEY, FilePart, ImagePart, OutboundMessage
from channels.common.chunks import split_text
from channels.common.steps import StepSender
from channels.discord.native import approval_components

if TYPE_CHECKING:
    from channels.discord.settings import DiscordSettings


class UnknownMessage(ChannelRejected):
    """404: the channel or message is gone (a deleted preview is replaced by a new message)."""


def attachment_name(part: ImagePart | FilePart) -> str:
    name = getattr(part, "name", None)
    if name:
        return str(name)
    subtype = (part.mime_type or "").partition("/")[2].split("+")[0]
    return f"image.{subtype or 'png'}" if isinstance(part, ImagePart) else "file"


class DiscordOutbound(StepSender):
    def __init__(self, http: httpx.AsyncClient, settings: DiscordSettings) -> None:
        super().__init__()
        self._http = http
        self.settings = settings

    async def post(self, channel_id: str, text: str) -> str:
        """A plain new message in a channel; its id."""
        return await self.call("POST", f"/channels/{channel_id}/messages", {"content": text})

    async def typing(self, channel_id: str) -> None:
        """The typing state (about 10 s)."""
        await self.call("POST", f"/channels/{channel_id}/typing", None)

    def chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(message.text, self.settings.max_message_chars)

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str:
        """One step of a reply: text chunk `index`, or (after the text) one upload."""
        meta = message.metadata
        token, app_id = meta.get("reply_interaction_token"), meta.get("reply_application_id")
        channel_id = meta.get("reply_channel_id") or message.thread_id or message.chat_id
        part = media[index - len(chunks)] if index >= len(chunks) else None
        body: dict[str, Any] = {} if part is not None else {"content": chunks[index]}
        if APPROVAL_KEY in meta and part is None and index == len(chunks) - 1:
            # An approval prompt: its last text carries the approve / deny buttons.
            body["components"] = approval_components(meta[APPROVAL_KEY], self.settings.locale)
        if token and app_id:
            if index == 0 and part is None:  # the deferred answer ("thinking…") becomes the reply
                path = f"/webhooks/{app_id}/{token}/messages/@original"
                return await self.call("PATCH", path, body, auth=False)
            return await self.call("POST", f"/webhooks/{app_id}/{token}", body, auth=False, upload=part)
        # A nonce Discord enforces: a retry after a lost answer (or by another replica
        # after a crash) returns the message already created instead of a second one.
        body.update(nonce=_nonce(message.message_id, index), enforce_nonce=True)
        return await self.call("POST", f"/channels/{channel_id}/messages", body, upload=part)

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        auth: bool = True,
        upload: ImagePart | FilePart | None = None,
    ) -> str:
        headers = {"Authorization": f"Bot {self.settings.bot_token}"} if auth else {}
        try:
            if upload is not None:  # an attachment: multipart, the JSON body as payload_json
                name = attachment_name(upload)
                payload = {**(body or {}), "attachments": [{"id": 0, "filename": name}]}
                assert upload.data_base64 is not None
                files = {
                    "files[0]": (
                        name,
                        base64.b64decode(upload.data_base64),
                        upload.mime_type or "application/octet-stream",
                    )
                }
                resp = await self._http.request(
                    method, path, data={"payload_json": json.dumps(payload)}, files=files, headers=headers
                )
            else:
                resp = await self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"Discord unreachable: {exc!r}") from exc
        if resp.status_code == 429:
            raise ChannelRateLimited(_retry_after(resp), "Discord rate limit (429)")
        if resp.status_code in (401, 403) and auth:
            raise ChannelSendAuthError(f"Discord refused the bot token: {resp.status_code}")
        if resp.status_code >= 500:
            raise ChannelUnavailable(f"Discord answered {resp.status_code}")
        if resp.status_code == 404:
            raise UnknownMessage(f"Discord: not found (404) {resp.text[:200]}")
        if resp.status_code >= 400:
            raise ChannelRejected(f"Discord rejected the message: {resp.status_code} {resp.text[:200]}")
        data = resp.json() if resp.content else {}
        return str(data.get("id") or "") if isinstance(data, dict) else ""


def _nonce(message_id: str, index: int) -> str:
    """At most 25 characters (Discord's limit), stable per outbox message and chunk."""
    return hashlib.sha256(f"{message_id}:{index}".encode()).hexdigest()[:25]


def _retry_after(resp: httpx.Response) -> float:
    """Seconds from the 429 body's `retry_after` (Discord), else the Retry-After header."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return max(0.0, float(resp.json()["retry_after"]))
    with contextlib.suppress(ValueError, TypeError):
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    return 1.0
