"""Identity links through the admin API, on the real app (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx
from sqlalchemy import select

from app.db.models import identity_links, memories
from app.memory import identity_of
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.memory.support import RecordingProvider, request_text, say

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LINKS = "/admin/api/identity-links"


def path(identity: str) -> str:
    return f"{LINKS}/{quote(identity, safe='')}"


async def test_linking_through_the_api_shares_user_memory_across_identities(serve: ServeApp) -> None:
    provider = RecordingProvider()
    async with serve(provider=provider) as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        await say(client, srv.url, "dm-a", "alice-a", "remember: Alice is vegetarian")

        async def seen_by(chat: str, sender: str) -> str:
            mark = len(provider.calls)
            await say(client, srv.url, chat, sender, "what do I eat?")
            return request_text(provider.since(mark)[0])

        assert "vegetarian" not in await seen_by("dm-b", "alice-b")  # two people until linked

        first = await client.post(
            LINKS, json={"identity": "webhook:alice-a", "person_id": "alice"}, headers=AUTH
        )
        assert first.status_code == 200, first.text
        body = first.json()
        assert body["identity"] == identity_of("webhook", "alice-a")
        assert (body["channel"], body["sender_id"], body["person_id"]) == ("webhook", "alice-a", "alice")
        assert body["created_by"] == "admin-api" and body["previous_person_id"] is None
        linked = await client.post(
            LINKS, json={"identity": "webhook:alice-b", "person_id": "alice"}, headers=AUTH
        )
        assert linked.status_code == 200

        # The fact stored for one identity is recalled in the other identity's run.
        assert "Alice is vegetarian" in await seen_by("dm-b", "alice-b")
        assert "Alice is vegetarian" in await seen_by("dm-a", "alice-a")
        assert "vegetarian" not in await seen_by("dm-m", "mallory")

        listing = (await client.get(LINKS, params={"person_id": "alice"}, headers=AUTH)).json()["links"]
        assert [(x["channel"], x["sender_id"], x["person_id"]) for x in listing] == [
            ("webhook", "alice-a", "alice"),
            ("webhook", "alice-b", "alice"),
        ]
        assert (await client.get(LINKS, params={"person_id": "bob"}, headers=AUTH)).json() == {"links": []}
        one = await client.get(path("webhook:alice-b"), headers=AUTH)
        assert one.status_code == 200 and one.json()["person_id"] == "alice"

        # Unlinking stops the sharing for that identity; the person keeps the memory.
        gone = await client.delete(path("webhook:alice-b"), headers=AUTH)
        assert gone.status_code == 200 and gone.json()["unlinked"] is True
        assert "vegetarian" not in await seen_by("dm-b", "alice-b")
        assert "Alice is vegetarian" in await seen_by("dm-a", "alice-a")
        assert (await client.delete(path("webhook:alice-b"), headers=AUTH)).status_code == 404
        assert (await client.get(path("webhook:alice-b"), headers=AUTH)).status_code == 404

        # Re-linking to another person reports where the identity was before.
        moved = await client.post(
            LINKS, json={"identity": "webhook:alice-a", "person_id": "al"}, headers=AUTH
        )
        assert moved.json()["previous_person_id"] == "alice"
        everyone = (await client.get(LINKS, headers=AUTH)).json()["links"]
        assert [(x["sender_id"], x["person_id"]) for x in everyone] == [("alice-a", "al")]


async def test_sender_ids_with_colons_and_percent_signs_round_trip(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        raw = "slack:T1:U%2F9"  # sender id "T1:U%2F9", as the platform sent it
        resp = await client.post(LINKS, json={"identity": raw, "person_id": "a.b@example.com"}, headers=AUTH)
        assert resp.status_code == 200, resp.text
        assert resp.json()["identity"] == identity_of("slack", "T1:U%2F9") == "slack:T1%3AU%252F9"
        [link] = (await client.get(LINKS, headers=AUTH)).json()["links"]
        assert (link["channel"], link["sender_id"]) == ("slack", "T1:U%2F9")
        assert (await client.get(path(raw), headers=AUTH)).json()["person_id"] == "a.b@example.com"
        assert (await client.delete(path(raw), headers=AUTH)).status_code == 200


BAD: list[tuple[dict[str, Any], str]] = [
    ({"identity": "no-colon", "person_id": "alice"}, "channel:sender_id"),
    ({"identity": ":42", "person_id": "alice"}, "channel:sender_id"),
    ({"identity": "telegram:", "person_id": "alice"}, "channel:sender_id"),
    ({"identity": "tele gram:42", "person_id": "alice"}, "channel name"),
    ({"identity": "person:alice", "person_id": "alice"}, "cannot be linked"),
    ({"identity": "cron:scheduler", "person_id": "alice"}, "cannot be linked"),
    ({"identity": "telegram:4\x002", "person_id": "alice"}, "control characters"),
    ({"identity": "telegram: 42", "person_id": "alice"}, "spaces"),
    ({"identity": "telegram:" + ":" * 300, "person_id": "alice"}, "at most"),
    ({"identity": "telegram:42", "person_id": "not a valid id!"}, "person id"),
    ({"identity": "telegram:42", "person_id": ""}, "person id"),
    ({"identity": "telegram:42", "person_id": "x" * 201}, "person id"),
    ({"identity": "telegram:42", "person_id": "person:alice"}, "person id"),
    ({"identity": "telegram:42"}, "person_id"),
    ({"identity": 42, "person_id": "alice"}, "identity"),
    ({"identity": "telegram:42", "person_id": "alice", "owner": "x"}, "owner"),
]


async def test_bad_input_is_a_clear_422_and_stores_nothing(serve: ServeApp) -> None:
    async with (
        serve(provider=RecordingProvider()) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
    ):
        await say(client, srv.url, "dm", "42", "remember: I like tea")
        for body, says in BAD:
            resp = await client.post(LINKS, json=body, headers=AUTH)
            assert resp.status_code == 422, (body, resp.text)
            assert says in resp.text, (body, resp.text)
        not_json = await client.post(LINKS, content=b"identity=telegram:42", headers=AUTH)
        assert not_json.status_code == 422
        assert (await client.get(LINKS, params={"person_id": "bad id"}, headers=AUTH)).status_code == 422
        assert (await client.delete(path("no-colon"), headers=AUTH)).status_code == 422
        assert (await client.get(path("cron:x"), headers=AUTH)).status_code == 422

        async with srv.runtime.engine.connect() as conn:
            assert (await conn.execute(select(identity_links))).all() == []
            owners = (
                await conn.execute(select(memories.c.owner).where(memories.c.scope == "user"))
            ).scalars()
            assert list(owners) == [identity_of("webhook", "42")]  # nothing moved


async def test_identity_endpoints_require_the_admin_token(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        body = {"identity": "telegram:42", "person_id": "alice"}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}):
            assert (await client.get(LINKS, headers=headers)).status_code == 401
            assert (await client.post(LINKS, json=body, headers=headers)).status_code == 401
            assert (await client.get(path("telegram:42"), headers=headers)).status_code == 401
            assert (await client.delete(path("telegram:42"), headers=headers)).status_code == 401
        async with srv.runtime.engine.connect() as conn:
            assert (await conn.execute(select(identity_links))).all() == []
        assert (await client.post(LINKS, json=body, headers=AUTH)).status_code == 200
        assert (await client.delete(path("telegram:42"))).status_code == 401
        assert len((await client.get(LINKS, headers=AUTH)).json()["links"]) == 1
