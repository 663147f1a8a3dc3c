"""chatgate behind a real PgBouncer in transaction mode (`DATABASE_POOLER=pgbouncer`):
no named prepared statement on a pooled connection, the session bus on its own direct
connection (`BUS_DATABASE_URL`), and every event sent through a real server answered."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import text
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from app.api.app import create_app
from app.db.engine import autocommit, create_engine
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, make_settings, webhook_settings
from tests.support.pgbouncer import pgbouncer
from tests.support.servers import serve_in_loop
from tests.support.webhook import post_webhook


def _through(url: str, port: int) -> str:
    return make_url(url).set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


async def _statements(url: str, **settings: object) -> int:
    """Run 20 tasks of 20 one-statement autocommit reads; how many failed."""
    engine = create_engine(make_settings(url, db_pool_size=20, **settings))
    failed = 0

    async def reads(i: int) -> None:
        nonlocal failed
        for _ in range(20):
            try:
                async with autocommit(engine).connect() as conn:
                    await conn.execute(text("SELECT CAST(:i AS int) + 1"), {"i": i})
            except Exception:
                failed += 1

    try:
        await asyncio.gather(*(reads(i) for i in range(20)))
    finally:
        await engine.dispose()
    return failed


async def test_statements_through_pgbouncer_need_the_pooler_setting(pg_url: str) -> None:
    async with pgbouncer() as port:
        url = _through(pg_url, port)
        # The control: asyncpg's and SQLAlchemy's named statements break on shared servers.
        assert await _statements(url) > 0
        assert await _statements(url, database_pooler="pgbouncer") == 0


async def test_events_through_pgbouncer_are_all_answered(pg_url: str) -> None:
    async with pgbouncer() as port:
        settings = make_settings(
            _through(pg_url, port),
            database_pooler="pgbouncer",
            bus_database_url=pg_url,  # LISTEN/NOTIFY needs a session of its own: direct
            db_pool_size=10,
        )
        app = create_app(settings, channel_settings={"webhook": webhook_settings()})
        with capture_logs() as logs:
            async with serve_in_loop(app) as srv, httpx.AsyncClient(timeout=30) as client:
                chats = [f"p{i}" for i in range(15)]

                async def send(chat: str, n: int) -> None:
                    payload = {
                        "chat_id": chat,
                        "sender_id": "u",
                        "text": f"hi {n}",
                        "message_id": f"{chat}{n}",
                    }

                    r = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload)
                    assert r.status_code == 202, r.text

                await asyncio.gather(*(send(chat, n) for chat in chats for n in range(4)))
                headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

                async def answers(chat: str) -> list[str]:
                    path = f"/admin/api/sessions/webhook:{chat}/messages"
                    r = await client.get(srv.url + path, headers=headers)
                    r.raise_for_status()
                    return [m["content"] for m in r.json()["messages"] if m["role"] == "assistant"]

                for _ in range(300):
                    done = [len(await answers(chat)) for chat in chats]
                    if done == [4] * len(chats):
                        break
                    await asyncio.sleep(0.1)
                assert done == [4] * len(chats)
                # The bus is on its own direct connection: a LISTEN through the pooler
                # would land on any server connection and hear nothing.
                bus_conn = app.state.runtime.bus._listen_conn
                assert bus_conn is not None and bus_conn._addr[1] == 5432
        errors = [e for e in logs if e["log_level"] in ("error", "critical")]
        assert errors == []
