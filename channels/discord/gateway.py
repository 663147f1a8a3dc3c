"""The Gateway connection through discord.py, run while this replica holds it.

discord.py keeps the socket: HELLO, IDENTIFY with the MESSAGE_CONTENT intent,
heartbeats, RESUME after a drop. We read the raw MESSAGE_CREATE dispatches
(`on_socket_raw_receive`) and parse them ourselves, the same way on every path.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Protocol

import discord
import structlog
import yarl
from discord.gateway import DiscordWebSocket
from discord.http import Route

if TYPE_CHECKING:
    from channels.discord.settings import DiscordSettings


class DiscordChannel(Protocol):
    """What the Gateway needs from the channel (`channels.discord.adapter.DiscordChannel`)."""

    settings: DiscordSettings
    bot_id: str | None

    async def on_message_create(self, data: dict[str, Any], parent_id: str | None) -> None: ...


log = structlog.get_logger(__name__)


def _point_at(api_base: str, gateway_url: str | None) -> None:
    # discord.py takes its REST base and Gateway URL from class attributes, not from the
    # client: one Discord bot per process, so setting them here is safe.
    Route.BASE = api_base.rstrip("/")
    if gateway_url:
        DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(gateway_url)


async def run_gateway(channel: DiscordChannel) -> None:
    settings = channel.settings
    assert settings.bot_token is not None
    _point_at(settings.api_base, settings.gateway_url)
    intents = discord.Intents.none()
    intents.guilds = True
    intents.guild_messages = True
    intents.dm_messages = True
    intents.message_content = True
    client = discord.Client(intents=intents, enable_debug_events=True)

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
        if not isinstance(frame, dict) or not isinstance(frame.get("d"), dict):
            return
        if frame.get("t") == "READY":  # our own id, for mention gating, before any message
            channel.bot_id = str((frame["d"].get("user") or {}).get("id") or "") or channel.bot_id
            return
        if frame.get("t") != "MESSAGE_CREATE":
            return
        data: dict[str, Any] = frame["d"]
        parent = None
        with_cache = client.get_channel(int(data.get("channel_id") or 0))
        if isinstance(with_cache, discord.Thread):
            parent = str(with_cache.parent_id)
        elif data.get("thread_parent_id"):
            parent = str(data["thread_parent_id"])
        await channel.on_message_create(data, parent)

    try:
        await client.start(settings.bot_token, reconnect=True)
    finally:
        if not client.is_closed():
            await asyncio.shield(client.close())
