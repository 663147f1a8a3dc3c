"""Socket Mode (development): events arrive over a WebSocket the app opens to Slack.

No public URL is needed. Each `events_api` envelope's payload goes through the same path
as the Events API (`SlackChannel.handle_payload`), each `interactive` envelope's (a press
on an approval prompt's buttons, `block_actions`) the same path as the interactivity
Request URL (`SlackChannel.handle_interaction`); either is acknowledged only after the
inbox commit, and an envelope that could not be stored is left unacknowledged so Slack
sends it again. Requests are authenticated by the app-level token (`SLACK_APP_TOKEN`),
not signed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from slack_sdk.socket_mode.aiohttp import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.web.async_client import AsyncWebClient

from app.connections import HeldConnection, fingerprint
from app.errors import ChannelNotConfigured, ChannelRequestError

if TYPE_CHECKING:
    from app.channel import ChannelContext
    from channels.slack.settings import SlackSettings


class SlackChannel(Protocol):
    """What Socket Mode needs from the channel (`channels.slack.adapter.SlackChannel`)."""

    settings: SlackSettings
    context: ChannelContext

    async def handle_payload(self, payload: Any) -> dict[str, Any]: ...
    async def handle_interaction(self, payload: Any) -> None: ...


log = structlog.get_logger(__name__)


class SlackSocket:
    """Socket Mode held through `ChannelContext.hold_connection`: one replica at a time.

    Slack spreads events over every open connection of an app, so two replicas would each
    see some; holding it in one place keeps the connection count and the logs simple.
    `close()` ends it.
    """

    def __init__(self, channel: SlackChannel, app_token: str) -> None:
        self.channel = channel
        self.app_token = app_token
        name = f"slack:{fingerprint(app_token)}"
        self._holder = HeldConnection(channel.context.hold_connection, name, self._run)

    async def _run(self) -> None:
        client = _client(self.channel, self.app_token)
        try:
            await client.connect()  # retries in the background while Slack is unreachable
            await asyncio.Event().wait()  # held until cancelled
        finally:
            await client.close()

    async def close(self) -> None:
        await self._holder.release()


async def start_socket_mode(channel: SlackChannel) -> SlackSocket:
    if not channel.settings.app_token:
        raise ChannelNotConfigured("SLACK_MODE=socket needs SLACK_APP_TOKEN (an xapp-… app-level token)")
    # Connecting happens in the background, so an unreachable Slack does not block start-up.
    return SlackSocket(channel, channel.settings.app_token)


def _client(channel: SlackChannel, app_token: str) -> SocketModeClient:
    settings = channel.settings
    web = AsyncWebClient(base_url=settings.api_base_url, timeout=settings.request_timeout_seconds)
    client = SocketModeClient(app_token=app_token, web_client=web)

    async def on_request(socket: SocketModeClient, request: SocketModeRequest) -> None:
        if request.type in ("events_api", "interactive"):
            try:
                if request.type == "events_api":
                    await channel.handle_payload(request.payload)
                else:  # a button press (docs/events.md), as at the interactivity Request URL
                    await channel.handle_interaction(request.payload)
            except ChannelRequestError as exc:  # malformed: acknowledged, a retry would not help
                log.warning("slack_socket_payload_refused", detail=exc.detail)
            except Exception:
                log.exception("slack_socket_accept_failed", envelope_id=request.envelope_id)
                return  # not acknowledged: Slack redelivers
        await socket.send_socket_mode_response(SocketModeResponse(envelope_id=request.envelope_id))

    client.socket_mode_request_listeners.append(on_request)  # type: ignore[arg-type]
    return client
