"""People's data on request, through the real server on both stores: export one person,
erase them with a receipt; other people's messages stay and the history keeps its shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert

from app.data_rights import TOMBSTONE
from app.db.models import memories, utcnow
from app.memory.identity import identity_of
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.support.webhook import post_webhook

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _say(
    client: httpx.AsyncClient, url: str, chat: str, sender: str, text: str, group: bool = False
) -> None:
    body: dict[str, Any] = {"chat_id": chat, "sender_id": sender, "text": text}
    if group:
        body["chat_type"] = "group"
    resp = await post_webhook(client, url, WEBHOOK_SECRET, body, wait=True)
    assert resp.status_code == 200, resp.text


async def _messages(client: httpx.AsyncClient, url: str, key: str) -> list[dict[str, Any]]:
    resp = await client.get(f"{url}/admin/api/sessions/{key.replace(':', '%3A')}/messages", headers=ADMIN)
    assert resp.status_code == 200, resp.text
    messages: list[dict[str, Any]] = resp.json()["messages"]
    return messages


async def test_export_then_erase_one_person(serve: ServeApp, tmp_path: Path) -> None:
    async with (
        serve(workspace_root=str(tmp_path / "ws"), workspace_per_session=True) as srv,
        httpx.AsyncClient(timeout=60) as client,
    ):
        await _say(client, srv.url, "alice-dm", "alice", "my locker code is 4711")
        await _say(client, srv.url, "alice-dm", "alice", "what time is it?")  # a tool call in her history
        await _say(client, srv.url, "team", "alice", "alice says hunter2", group=True)
        await _say(client, srv.url, "team", "bob", "bob says hello", group=True)
        now = utcnow()
        async with srv.runtime.engine.begin() as conn:
            for owner, text in (
                (identity_of("webhook", "alice"), "alice likes tea"),
                ("webhook:bob", "bob likes jazz"),
            ):
                await conn.execute(
                    insert(memories).values(
                        scope="user",
                        owner=owner,
                        key=text,
                        content=text,
                        created_at=now,
                        updated_at=now,
                        metadata={},
                    )
                )

        exported = await client.get(
            f"{srv.url}/admin/api/people/export", params={"identity": "webhook:alice"}, headers=ADMIN
        )
        assert exported.status_code == 200, exported.text
        data = exported.json()
        [dm] = data["direct_conversations"]
        assert dm["key"] == "webhook:alice-dm"
        assert [m["content"] for m in dm["messages"] if m["role"] == "user"] == [
            "my locker code is 4711",
            "what time is it?",
        ]
        assert [m["content"] for m in data["messages_in_groups"] if m["role"] == "user"] == [
            "alice says hunter2"
        ]
        assert "bob says hello" not in exported.text and "bob likes jazz" not in exported.text
        assert [m["content"] for m in data["memory"]] == ["alice likes tea"]

        refused = await client.post(
            f"{srv.url}/admin/api/people/erase",
            json={"identity": "webhook:alice", "confirm": 1},
            headers=ADMIN,
        )
        assert refused.status_code == 422  # strict: true only
        erased = await client.post(
            f"{srv.url}/admin/api/people/erase",
            json={"identity": "webhook:alice", "confirm": True},
            headers=ADMIN,
        )
        assert erased.status_code == 200, erased.text
        receipt = erased.json()["receipt"]
        assert receipt["events"] == 3 and receipt["memory"] == 1
        assert receipt["messages"] >= len(dm["messages"]) + 2  # her group message and the answer to it

        after_dm = await _messages(client, srv.url, "webhook:alice-dm")
        assert [m["role"] for m in after_dm] == [m["role"] for m in dm["messages"]]  # same shape
        assert {m["content"] for m in after_dm} == {TOMBSTONE}
        calls = [c for m in after_dm for c in (m["tool_calls"] or [])]
        assert calls and all(c["function"]["arguments"] == "{}" and c["function"]["name"] for c in calls)
        team = await _messages(client, srv.url, "webhook:team")
        texts = [m["content"] for m in team]
        assert "bob says hello" in texts and "You said: bob says hello" in texts  # others stay
        assert not any("hunter2" in (t or "") for t in texts)
        everything = (
            await client.get(
                f"{srv.url}/admin/api/people/export", params={"identity": "webhook:alice"}, headers=ADMIN
            )
        ).text
        for secret in ("4711", "hunter2", "alice likes tea"):
            assert secret not in everything
        bob = (
            await client.get(
                f"{srv.url}/admin/api/people/export", params={"identity": "webhook:bob"}, headers=ADMIN
            )
        ).json()
        assert [m["content"] for m in bob["memory"]] == ["bob likes jazz"]

        # The conversation goes on after the erasure: the window over tombstones is legal.
        await _say(client, srv.url, "alice-dm", "alice", "hello again")
        assert (await _messages(client, srv.url, "webhook:alice-dm"))[-1][
            "content"
        ] == "You said: hello again"


def test_the_cli_asks_for_yes_and_names_an_unknown_person(tmp_path: Path) -> None:
    from tests.app.test_cli import _cli

    db = f"sqlite:///{tmp_path / 'd.db'}"
    assert _cli(["migrate"], tmp_path, DATABASE_URL=db).returncode == 0
    unsure = _cli(["data", "erase", "--identity", "webhook:alice"], tmp_path, DATABASE_URL=db)
    assert unsure.returncode == 2 and "add --yes" in unsure.stderr
    nobody = _cli(["data", "export", "--person", "nobody"], tmp_path, DATABASE_URL=db)
    assert nobody.returncode == 1
    assert nobody.stderr.strip() == "chatgate: data export: no identity is linked to person 'nobody'"
    empty = _cli(["data", "erase", "--identity", "webhook:alice", "--yes"], tmp_path, DATABASE_URL=db)
    assert empty.returncode == 0, empty.stderr
    assert '"events": 0' in empty.stdout
