"""Helpers of the Discord tests: settings pointing at the fake, signed interactions."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from channels.discord import DiscordSettings
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI
from tests.support.servers import RunningApp

# The application's key pair; Discord signs with the private half, we get the public one.
SIGNING_KEY = Ed25519PrivateKey.generate()
PUBLIC_KEY = SIGNING_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def discord_settings(fake: FakeDiscord, **overrides: Any) -> DiscordSettings:
    values: dict[str, Any] = dict(
        bot_token=dc.TOKEN,
        public_key=PUBLIC_KEY,
        api_base=fake.url,
        gateway_url=fake.gateway_url,
    )
    values.update(overrides)
    return DiscordSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def connected(fake: FakeDiscord, srv: RunningApp) -> None:
    """The Gateway session is up: identified, and the adapter knows its bot's id."""
    await fake.wait_ready()
    await fake.wait_until(lambda: srv.runtime.adapters["discord"].bot_id == dc.BOT_ID)


@asynccontextmanager
async def served_with_tools(
    serve: ServeApp, fake: FakeDiscord, model: FakeOpenAI, workspace: Path, **settings: Any
) -> AsyncIterator[tuple[RunningApp, httpx.AsyncClient]]:
    """The app serving Discord (`fake`, with `settings`) and the model, whose file tools write
    in `workspace`, once connected; a client to post interactions with."""
    async with (
        serve(
            channel_settings={"discord": discord_settings(fake, **settings)},
            **openai_settings(model, workspace_root=str(workspace)),
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await connected(fake, srv)
        yield srv, client


async def post_interaction(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    *,
    key: Ed25519PrivateKey = SIGNING_KEY,
    timestamp: int | None = None,
) -> httpx.Response:
    """POST as Discord does: Ed25519 over `timestamp + raw body`, hex in X-Signature-Ed25519."""
    body = json.dumps(payload).encode()
    ts = str(timestamp if timestamp is not None else int(time.time()))
    signature = key.sign(ts.encode() + body).hex()
    headers = {
        "Content-Type": "application/json",
        "X-Signature-Ed25519": signature,
        "X-Signature-Timestamp": ts,
    }
    return await client.post(f"{base_url}/channels/discord/interactions", content=body, headers=headers)


def command(
    name: str,
    *,
    interaction_id: str = "5000",
    channel_id: str = "2000",
    guild_id: str | None = "9000",
    permissions: str | None = None,
    user_id: str = "3000",
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "id": interaction_id,
        "application_id": dc.APP_ID,
        "type": 2,
        "token": f"itoken-{interaction_id}",
        "version": 1,
        "channel_id": channel_id,
        "channel": {"id": channel_id, "type": 0},
        "data": {"id": "6000", "name": name, "type": 1},
    }
    user = {"id": user_id, "username": "alice", "discriminator": "0"}
    if guild_id:
        data["guild_id"] = guild_id
        data["member"] = {"user": user, "roles": []}
        if permissions is not None:  # the member's permissions in the channel (a bit set)
            data["member"]["permissions"] = permissions
    else:
        data["user"] = user
    return data


def component_press(
    custom_id: str,
    *,
    message_id: str,
    interaction_id: str,
    channel_id: str = "2000",
    guild_id: str | None = None,
    user_id: str = "3000",
    username: str = "alice",
) -> dict[str, Any]:
    """A MESSAGE_COMPONENT interaction (type 3): `user_id` pressed the button `custom_id`
    on the message `message_id` (Discord's interaction object, abridged)."""
    data: dict[str, Any] = {
        "id": interaction_id,
        "application_id": dc.APP_ID,
        "type": 3,
        "token": f"itoken-{interaction_id}",
        "version": 1,
        "channel_id": channel_id,
        "channel": {"id": channel_id, "type": 0},
        "message": {"id": message_id, "channel_id": channel_id, "content": "", "components": []},
        "data": {"custom_id": custom_id, "component_type": 2},
    }
    user = {"id": user_id, "username": username, "discriminator": "0"}
    if guild_id:
        data["guild_id"] = guild_id
        data["member"] = {"user": user, "roles": [], "permissions": "0"}
    else:
        data["user"] = user
    return data
