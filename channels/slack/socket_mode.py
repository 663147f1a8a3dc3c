"""Socket Mode (development): events arrive over a WebSocket the app opens to Slack.

No public URL is needed. Each envelope's payload goes through the same path as the
Events API (`SlackChannel.handle_payload`) and is acknowledged only after the inbox
commit; an envelope that could not be stored is left unacknowledged so Slack sends it
again. Requests are authenticated by the app-level token (`SLACK_APP_TOKEN`), not signed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from app.errors import ChannelNotConfigured, ChannelRequestError

if TYPE_CHECKING:
    from channels.slack.adapter import SlackChannel

log = structlog.get_logger(__name__)


class SlackSocket:
    """A running Socket Mode connection; `close()` ends it."""

    def __init__(self, client: SocketModeClient) -> None:
        self.client = client
        self._connecting: asyncio.Task[Any] = asyncio.create_task(client.connect(), name="slack-socket")

    async def close(self) -> None:
        self._connecting.cancel()
        await self.client.close()


async def start_socket_mode(channel: SlackChannel) -> SlackSocket:
    settings = channel.settings
    if not settings.app_token:
        raise ChannelNotConfigured("SLACK_MODE=socket needs SLACK_APP_TOKEN (an xapp-… app-level token)")
    web = AsyncWebClient(base_url=settings.api_base_url, timeout=settings.request_timeout_seconds)
    client = SocketModeClient(app_token=settings.app_token, web_client=web)

    async def on_request(socket: SocketModeClient, request: SocketModeRequest) -> None:
        if request.type == "events_api":
            try:
                await channel.handle_payload(request.payload)
            except ChannelRequestError as exc:  # malformed: acknowledged, a retry would not help
                log.warning("slack_socket_payload_refused", detail=exc.detail)
            except Exception:
                log.exception("slack_socket_accept_failed", envelope_id=request.envelope_id)
                return  # not acknowledged: Slack redelivers
        await socket.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    client.socket_mode_request_listeners.append(on_request)  # type: ignore[arg-type]
    # Connecting retries in the background, so an unreachable Slack does not block start-up.
    return SlackSocket(client)
