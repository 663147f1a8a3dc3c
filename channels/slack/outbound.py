"""Slack's outbound seam: the Web API calls that send, edit and upload, for replies and previews.

`SlackOutbound` is what the adapter's `send` and both streamers (`SlackStreamer`,
`SlackNativeStreamer`) use: one Web API client, one error mapping (`delivery_error`,
unreachable → `ChannelUnavailable`) and one record of the chunks already posted per
outbox message (`channels.common.steps`), so a retried reply never posts a chunk twice, whoever
posted it first.
"""

from __future__ import annotations

import base64
from typing import Any

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.web.async_client import AsyncWebClient

from app.errors import ChannelUnavailable
from app.events import FilePart, ImagePart
from channels.common.steps import Steps
from channels.slack.errors import delivery_error


class SlackOutbound(Steps):
    def __init__(self, client: AsyncWebClient) -> None:
        super().__init__()
        self.client = client

    async def call(self, method: str, **args: Any) -> Any:
        """One Web API method by its SDK name (e.g. `chat_startStream`), errors mapped."""
        try:
            return await getattr(self.client, method)(**args)
        except SlackApiError as exc:
            raise delivery_error(exc) from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise ChannelUnavailable(f"Slack unreachable: {exc!r}") from exc

    async def post(self, channel: str, text: str, thread_ts: str | None) -> str | None:
        """`chat.postMessage`; the new message's ts."""
        resp = await self.call("chat_postMessage", channel=channel, text=text, thread_ts=thread_ts)
        ts = resp.get("ts")
        return str(ts) if ts else None

    async def edit(self, channel: str, ts: str, text: str) -> None:
        """`chat.update`: replace a message's text."""
        await self.call("chat_update", channel=channel, ts=ts, text=text)

    async def upload(self, channel: str, part: ImagePart | FilePart, thread_ts: str | None) -> None:
        """Slack's external upload: files.getUploadURLExternal, the bytes, files.completeUploadExternal."""
        assert part.data_base64
        name = getattr(part, "name", None) or ("image" if isinstance(part, ImagePart) else "file")
        try:
            await self.client.files_upload_v2(
                channel=channel,
                thread_ts=thread_ts,
                content=base64.b64decode(part.data_base64),
                filename=name,
            )
        except SlackApiError as exc:
            raise delivery_error(exc) from exc
        except (SlackClientError, aiohttp.ClientError, TimeoutError) as exc:
            raise ChannelUnavailable(f"Slack upload failed: {exc!r}") from exc
