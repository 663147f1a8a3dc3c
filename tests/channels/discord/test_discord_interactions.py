"""Slash commands at `POST /channels/discord/interactions`: Ed25519, PING, deferred answers."""

from __future__ import annotations

import time

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.db.models import inbox
from tests.channels.discord.support import command, discord_settings, post_interaction
from tests.channels.support import count, inbox_keys, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord


async def test_ping_is_answered_and_forged_or_stale_requests_are_refused(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        settings = discord_settings(fake, gateway=False)
        async with (
            serve(channel_settings={"discord": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_interaction(
                client, srv.url, {"id": "1", "type": 1, "application_id": dc.APP_ID}
            )
            assert (resp.status_code, resp.json()) == (200, {"type": 1})
            forged = await post_interaction(client, srv.url, command("new"), key=Ed25519PrivateKey.generate())
            assert forged.status_code == 401
            stale = await post_interaction(client, srv.url, command("new"), timestamp=int(time.time()) - 3600)
            assert stale.status_code == 401
            unsigned = await client.post(
                f"{srv.url}/channels/discord/interactions",
                content=b'{"type": 1}',
                headers={"Content-Type": "application/json"},
            )
            assert unsigned.status_code == 401
            assert "X-Signature" in unsigned.json()["detail"]
            assert await count(srv.runtime, inbox) == 0
            # The service keeps serving after the refusals.
            again = await post_interaction(client, srv.url, {"id": "2", "type": 1})
            assert again.json() == {"type": 1}


async def test_a_slash_command_is_deferred_then_answered_through_the_interaction_webhook(
    serve: ServeApp,
) -> None:
    async with FakeDiscord() as fake:
        settings = discord_settings(fake, gateway=False)
        async with (
            serve(channel_settings={"discord": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_interaction(client, srv.url, command("new", interaction_id="5001"))
            assert (resp.status_code, resp.json()) == (200, {"type": 5})
            redelivered = await post_interaction(client, srv.url, command("new", interaction_id="5001"))
            assert redelivered.json() == {"type": 5}
            [edit] = await fake.wait_for_messages(1)
            await wait_outbox_final(srv.runtime)
            assert edit.method == "PATCH"
            assert edit.path == f"/webhooks/{dc.APP_ID}/itoken-5001/messages/@original"
            assert edit.body["content"]
            assert await count(srv.runtime, inbox) == 1
            assert await inbox_keys(srv.runtime) == ["discord:2000"]


async def test_rate_limited_reply_is_retried_and_an_outage_ends_failed(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        fake.script = [dc.RATE_LIMITED, None]
        settings = discord_settings(fake, gateway=False)
        async with serve(channel_settings={"discord": settings}, outbox_max_attempts=3) as srv:
            async with httpx.AsyncClient(timeout=30) as client:
                await post_interaction(client, srv.url, command("new", interaction_id="5002"))
            [row] = await wait_outbox_final(srv.runtime)
            assert (row["status"], row["attempts"]) == ("sent", 2)
            attempts = [c for c in fake.calls if c.path.endswith("/itoken-5002/messages/@original")]
            assert [c.ok for c in attempts] == [False, True]

            fake.script = [dc.SERVER_ERROR] * 3
            async with httpx.AsyncClient(timeout=30) as client:
                await post_interaction(
                    client, srv.url, command("new", interaction_id="5003", channel_id="2009")
                )
            rows = await wait_outbox_final(srv.runtime, 2)
            failed = [r for r in rows if r["status"] == "failed"]
            assert len(failed) == 1 and failed[0]["attempts"] == 3
            assert "500" in failed[0]["last_error"]
