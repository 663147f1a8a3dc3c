"""The Gateway connection through discord.py, run while this replica holds it.

discord.py keeps the socket: HELLO, IDENTIFY with the MESSAGE_CONTENT intent,
heartbeats, RESUME after a drop. We read the raw MESSAGE_CREATE dispatches
(`on_socket_raw_receive`) and parse them ourselves, the same way on every path.

Across replicas: the holder saves the Gateway session (`session_id`,
`resume_gateway_url`, the last sequence whose dispatch is in the inbox, our bot id)
with its connection lease (`ChannelContext.connection_state`). A replica that takes the
connection over RESUMEs that session instead of identifying afresh, so Discord replays
what was dispatched while nobody held it; the inbox drops what is replayed twice. If
Discord refuses the session (INVALID_SESSION), discord.py identifies anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import TYPE_CHECKING, Any, Protocol

import discord
import structlog
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

from channels.discord.native import NATIVE_DISPATCHES

if TYPE_CHECKING:
    from channels.discord.settings import DiscordSettings


class DiscordChannel(Protocol):
    """What the Gateway needs from the channel (`channels.discord.adapter.DiscordChannel`)."""

    settings: DiscordSettings
    bot_id: str | None

    async def on_message_create(self, data: dict[str, Any], parent_id: str | None) -> None: ...
    async def on_native(self, kind: str, data: dict[str, Any], parent_id: str | None) -> None: ...
    async def load_session(self) -> dict[str, Any] | None: ...
    async def save_session(self, session: dict[str, Any]) -> None: ...


log = structlog.get_logger(__name__)

# A client whose first connection should RESUME carries the saved session here.
_RESUME = "chatgate_resume"


class _ResumingWebSocket(DiscordWebSocket):
    """discord.py's Gateway socket, but a client's first connection may RESUME a session
    another replica saved (discord.py itself resumes only sessions it opened)."""

    @classmethod
    async def from_client(cls, client: Any, *, initial: bool = False, **params: Any) -> Any:
        saved = getattr(client, _RESUME, None)
        if not initial or not saved:
            return await super().from_client(client, initial=initial, **params)
        setattr(client, _RESUME, None)  # once: a refused session makes discord.py identify
        log.info("discord_gateway_resuming", session_id=saved["session_id"], seq=saved["seq"])
        params.update(
            gateway=yarl.URL(saved["resume_gateway_url"]),
            session=saved["session_id"],
            sequence=saved["seq"],
            resume=True,
        )
        return await super().from_client(client, initial=False, **params)


class _SessionKeeper:
    """Saves the session with the sequence up to which every dispatch is handled.

    discord.py starts the handlers of dispatches in order, each as a task: a dispatch whose
    handler started is `started`; a MESSAGE_CREATE is `in_flight` until the inbox has it.
    The saved sequence never passes one still in flight, so a RESUME replays it.
    """

    def __init__(self, channel: DiscordChannel, client: discord.Client) -> None:
        self.channel = channel
        self.client = client
        self.started = 0
        self.in_flight: set[int] = set()
        self.saved_at = 0.0

    def start(self, seq: int) -> None:
        self.started = max(self.started, seq)

    async def save(self, *, now: bool) -> None:
        """Save the session: `now`, or when the last save is a second old (other dispatches)."""
        if not now and time.monotonic() - self.saved_at < 1.0:
            return
        self.saved_at = time.monotonic()
        ws = self.client.ws
        session_id = getattr(ws, "session_id", None)
        if not session_id:
            return
        seq = min(self.in_flight) - 1 if self.in_flight else self.started
        session = {
            "session_id": session_id,
            "resume_gateway_url": str(ws.gateway),
            "seq": seq,
            "bot_id": self.channel.bot_id,
        }
        try:
            await self.channel.save_session(session)
        except Exception as exc:  # a later save catches up; a RESUME then replays more
            log.warning("discord_session_not_saved", error=repr(exc))


def _point_at(api_base: str, gateway_url: str | None) -> None:
    # discord.py takes its REST base and Gateway URL from class attributes, not from the
    # client: one Discord bot per process, so setting them here is safe.
    Route.BASE = api_base.rstrip("/")
    if gateway_url:
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)
    discord.client.DiscordWebSocket = _ResumingWebSocket  # type: ignore[attr-defined,misc]


async def run_gateway(channel: DiscordChannel) -> None:
    settings = channel.settings
    assert settings.bot_token is not None
    _point_at(settings.api_base, settings.gateway_url)
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    intents.guild_reactions = True  # reactions (docs/events.md)
    intents.dm_reactions = True
    client = discord.Client(intents=intents, enable_debug_events=True)
    saved = await channel.load_session()
    if saved and saved.get("session_id") and saved.get("resume_gateway_url"):
        setattr(client, _RESUME, saved)
        channel.bot_id = saved.get("bot_id") or channel.bot_id  # no READY after a RESUME
    keeper = _SessionKeeper(channel, client)

    @client.event
    async def on_ready() -> None:
        if client.user is not None:
            channel.bot_id = str(client.user.id)
        log.info("discord_gateway_ready", bot_id=channel.bot_id)

    @client.event
    async def on_socket_raw_receive(raw: str) -> None:
        try:
            frame = json.loads(raw)
        except ValueError:
            return
        if not isinstance(frame, dict) or frame.get("op") != 0 or not isinstance(frame.get("s"), int):
            return
        seq: int = frame["s"]
        keeper.start(seq)
        kind = frame.get("t")
        if kind == "MESSAGE_CREATE" and isinstance(frame.get("d"), dict):
            keeper.in_flight.add(seq)
            try:
                await _message(frame["d"])
            finally:
                keeper.in_flight.discard(seq)
        elif kind in NATIVE_DISPATCHES and isinstance(frame.get("d"), dict):
            keeper.in_flight.add(seq)  # edits, deletions, reactions (docs/events.md)
            try:
                await channel.on_native(kind, frame["d"], _parent(frame["d"]))
            finally:
                keeper.in_flight.discard(seq)
        elif kind == "READY" and isinstance(frame.get("d"), dict):
            # our own id, for mention gating, before any message
            channel.bot_id = str((frame["d"].get("user") or {}).get("id") or "") or channel.bot_id
        await keeper.save(now=kind in ("READY", "RESUMED", "MESSAGE_CREATE", *NATIVE_DISPATCHES))

    def _parent(data: dict[str, Any]) -> str | None:
        """The thread's parent channel when the dispatch is about a thread."""
        with_cache = client.get_channel(int(data.get("channel_id") or 0))
        if isinstance(with_cache, discord.Thread):
            return str(with_cache.parent_id)
        return str(data["thread_parent_id"]) if data.get("thread_parent_id") else None

    async def _message(data: dict[str, Any]) -> None:
        await channel.on_message_create(data, _parent(data))

    try:
        await client.start(settings.bot_token, reconnect=True)
    finally:
        if not client.is_closed():
            await asyncio.shield(_hand_over(client, keeper))


async def _hand_over(client: discord.Client, keeper: _SessionKeeper) -> None:
    """Close so that the next holder can RESUME: the session saved as it is now, and the
    socket closed with 4000, not 1000 (Discord ends a session closed with 1000 or 1001,
    and the events of the gap would be lost to an IDENTIFY)."""
    await keeper.save(now=True)
    ws = client.ws
    if ws is not None and ws.open:
        with contextlib.suppress(Exception):
            await ws.close(code=4000)
    await client.close()
