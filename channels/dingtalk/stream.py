"""Stream mode: robot messages over the WebSocket the app opens to DingTalk (no public URL).

The official `dingtalk-stream` SDK parses the frames, routes them by type and topic,
answers the system `ping` and `disconnect` frames and builds the ACK frames. Its own
`start()` loop is not used: it retries for ever, swallows cancellation and opens the
connection with blocking `requests` at a fixed endpoint. Instead one `run_connection()`
is one connection, run by `ChannelContext.hold_connection` (exactly one holder across
replicas; it cancels the run when the hold is lost and starts a new one after a drop).

A CALLBACK frame's message goes through the inbox (`DingTalkChannel.accept_payload`)
and the frame is acknowledged only after that commit returned. A message that could not
be stored is left unacknowledged, so DingTalk sends it again; a malformed one is
acknowledged (a redelivery would not help) and logged. The same holds for card callbacks
(presses on approval cards, subscribed with `DINGTALK_APPROVAL_CARD_TEMPLATE_ID`,
`channels.dingtalk.approval`) and for EVENT frames (group members joining and leaving,
subscribed with a welcome or farewell text, `channels.dingtalk.events`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote_plus

import structlog
import websockets
from dingtalk_stream import (
    AckMessage,
    CallbackHandler,
    CallbackMessage,
    ChatbotMessage,
    Credential,
    DingTalkStreamClient,
    EventHandler,
    EventMessage,
)
from dingtalk_stream.version import VERSION_STRING

from app.errors import ChannelRequestError
from channels.dingtalk.approval import CARD_CALLBACK_TOPIC

if TYPE_CHECKING:
    from app.channel import ChannelContext
    from channels.dingtalk.settings import DingTalkSettings


class DingTalkChannel(Protocol):
    """What Stream mode needs from the channel (`channels.dingtalk.adapter.DingTalkChannel`)."""

    settings: DingTalkSettings
    context: ChannelContext

    async def accept_payload(self, payload: Any) -> dict[str, Any]: ...

    async def accept_card_callback(self, payload: Any) -> dict[str, Any]: ...

    async def accept_event(
        self, event_type: str | None, event_id: str | None, data: Any
    ) -> dict[str, Any]: ...


log = structlog.get_logger(__name__)
# The SDK logs every system `ping` frame as an "unknown message topic" warning; only its
# errors (a frame it could not handle, an ACK it could not send) are worth a line.
_sdk_log = logging.getLogger("channels.dingtalk.sdk")
_sdk_log.setLevel(logging.ERROR)

OPEN_CONNECTION_PATH = "/v1.0/gateway/connections/open"
ROBOT_TOPIC: str = ChatbotMessage.TOPIC  # "/v1.0/im/bot/messages/get"


class StreamConnectionError(Exception):
    """DingTalk refused or could not open a Stream connection (the holder retries)."""


class _RobotMessageHandler(CallbackHandler):  # type: ignore[misc]
    """The SDK's callback handler for robot messages: accept, then let the SDK ACK."""

    def __init__(self, channel: DingTalkChannel) -> None:
        super().__init__()
        self.channel = channel

    async def process(self, message: CallbackMessage) -> tuple[int, str]:
        try:
            outcome = await self.channel.accept_payload(message.data)
        except ChannelRequestError as exc:
            log.warning("dingtalk_stream_message_refused", detail=exc.detail)
            return AckMessage.STATUS_OK, f"refused: {exc.detail}"
        # Any other exception propagates: the SDK then sends no ACK and DingTalk redelivers.
        return AckMessage.STATUS_OK, json.dumps(outcome)


class _CardCallbackHandler(CallbackHandler):  # type: ignore[misc]
    """Card callbacks (a press on an approval card's button, `channels.dingtalk.approval`):
    stored, then acknowledged. The answer updates no card (`{}`): the decision is a reply
    in the chat, a refusal a message to the presser alone."""

    def __init__(self, channel: DingTalkChannel) -> None:
        super().__init__()
        self.channel = channel

    async def process(self, message: CallbackMessage) -> tuple[int, str]:
        try:
            outcome = await self.channel.accept_card_callback(message.data)
        except ChannelRequestError as exc:
            log.warning("dingtalk_card_callback_refused", detail=exc.detail)
            return AckMessage.STATUS_OK, "{}"
        log.info("dingtalk_card_callback", **{k: v for k, v in outcome.items() if k != "ok"})
        return AckMessage.STATUS_OK, "{}"


class _EventHandler(EventHandler):  # type: ignore[misc]
    """Events of the app's event subscription (EVENT frames): a group's members joining or
    leaving (`channels.dingtalk.events`) stored, then acknowledged; others acknowledged."""

    def __init__(self, channel: DingTalkChannel) -> None:
        super().__init__()
        self.channel = channel

    async def process(self, event: EventMessage) -> tuple[int, str]:
        headers = event.headers
        try:
            outcome = await self.channel.accept_event(headers.event_type, headers.event_id, event.data)
        except ChannelRequestError as exc:
            log.warning("dingtalk_stream_event_refused", detail=exc.detail)
            return AckMessage.STATUS_OK, "refused"
        # Any other exception propagates: the SDK then sends no ACK and DingTalk redelivers.
        log.info(
            "dingtalk_stream_event",
            event_type=headers.event_type,
            **{k: v for k, v in outcome.items() if k != "ok"},
        )
        return AckMessage.STATUS_OK, "OK"


def _wants_events(settings: DingTalkSettings) -> bool:
    """Membership events do something only with a welcome or a farewell (docs/events.md)."""
    return bool(settings.welcome_text or settings.farewell_text)


async def run_connection(channel: DingTalkChannel) -> None:
    """Open one Stream connection and serve it until it ends (returns) or fails (raises)."""
    settings = channel.settings
    assert settings.client_id and settings.client_secret
    client = DingTalkStreamClient(
        Credential(settings.client_id, settings.client_secret),
        logger=_sdk_log,
    )
    client.register_callback_handler(ROBOT_TOPIC, _RobotMessageHandler(channel))
    if settings.approval_card_template_id:  # presses on approval cards (docs/events.md)
        client.register_callback_handler(CARD_CALLBACK_TOPIC, _CardCallbackHandler(channel))
    events = _wants_events(settings)
    if events:
        client.register_all_event_handler(_EventHandler(channel))
    client.pre_start()
    endpoint = await _open_connection(channel, topics=list(client.callback_handler_map), events=events)
    in_flight: set[asyncio.Task[Any]] = set()
    try:
        async with websockets.connect(endpoint, open_timeout=settings.request_timeout_seconds) as ws:
            client.websocket = ws
            log.info("dingtalk_stream_connected")
            async for raw in ws:
                try:
                    frame = json.loads(raw)
                except ValueError:
                    log.warning("dingtalk_stream_bad_frame")
                    continue
                # Frames are handled concurrently (one slow commit must not hold the pings
                # up); the SDK routes each, calls the handler and sends its ACK.
                task = asyncio.create_task(client.background_task(frame))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
    finally:
        for task in in_flight:  # not acknowledged: DingTalk redelivers, the inbox dedups
            task.cancel()
    log.info("dingtalk_stream_closed")


async def _open_connection(channel: DingTalkChannel, *, topics: list[str], events: bool = False) -> str:
    """`POST /v1.0/gateway/connections/open` as the SDK does; the WebSocket URL with its ticket."""
    settings = channel.settings
    body = {
        "clientId": settings.client_id,
        "clientSecret": settings.client_secret,
        # Every event the app subscribed to in the console, as the SDK asks for them.
        "subscriptions": [
            *([{"type": "EVENT", "topic": "*"}] if events else []),
            *({"type": "CALLBACK", "topic": t} for t in topics),
        ],
        "ua": f"dingtalk-sdk-python/v{VERSION_STRING}-union chatgate",
        "localIp": "",
    }
    url = settings.api_base.rstrip("/") + OPEN_CONNECTION_PATH
    resp = await channel.context.http.post(url, json=body, timeout=settings.request_timeout_seconds)
    if resp.status_code != 200:
        raise StreamConnectionError(f"connections/open answered {resp.status_code}: {resp.text[:200]}")
    data = resp.json()
    endpoint, ticket = data.get("endpoint"), data.get("ticket")
    if not isinstance(endpoint, str) or not isinstance(ticket, str):
        raise StreamConnectionError("connections/open answered without endpoint and ticket")
    return f"{endpoint}?ticket={quote_plus(ticket)}"
