"""Usage and cost of every model call, through the real server and a fake model that
reports usage; budgets checked before the model is called, with notices on the way."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import outbox
from tests.channels.support import llm_settings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.fakes.openai_server import FakeOpenAI, text
from tests.support.webhook import post_webhook

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PRICES = {"fake-model": {"input": 1.0, "output": 2.0, "cached": 0.5}}  # per million tokens


async def _ask(client: httpx.AsyncClient, url: str, said: str, sender: str = "ann") -> str:
    resp = await post_webhook(
        client, url, WEBHOOK_SECRET, {"chat_id": sender, "sender_id": sender, "text": said}, wait=True
    )
    assert resp.status_code == 200, resp.text
    return str(resp.json()["replies"][0]["text"])


async def test_every_call_is_recorded_with_its_cost(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("one", prompt_tokens=100, completion_tokens=10),
            text("two", prompt_tokens=50, completion_tokens=5),
        )
        async with (
            serve(**llm_settings(fake), usage_prices=PRICES) as srv,
            httpx.AsyncClient(timeout=60) as client,
        ):
            assert await _ask(client, srv.url, "hi") == "one"
            assert await _ask(client, srv.url, "again", sender="bob") == "two"
            await srv.runtime.usage.flush()  # written in the background otherwise
            by_model = (
                await client.get(f"{srv.url}/admin/api/usage", params={"group": "model"}, headers=ADMIN)
            ).json()
            by_sender = (
                await client.get(f"{srv.url}/admin/api/usage", params={"group": "sender"}, headers=ADMIN)
            ).json()
            metrics = (await client.get(f"{srv.url}/metrics")).text
    [model] = by_model["rows"]
    assert (model["model"], model["calls"], model["input_tokens"], model["output_tokens"]) == (
        "fake-model",
        2,
        150,
        15,
    )
    assert model["cost"] == pytest.approx((150 * 1.0 + 15 * 2.0) / 1_000_000)
    assert by_model["currency"] == "USD"
    assert [(r["sender"], r["input_tokens"]) for r in by_sender["rows"]] == [
        ("webhook:ann", 100),
        ("webhook:bob", 50),
    ]
    assert 'chatgate_model_tokens_total{kind="input",model="fake-model"} 150.0' in metrics


async def test_a_spent_budget_refuses_before_the_model_is_called(serve: ServeApp) -> None:
    budgets = [{"scope": "sender", "period": "day", "tokens": 30}]
    async with FakeOpenAI() as fake:
        fake.enqueue(*(text(f"answer {n}", prompt_tokens=11, completion_tokens=7) for n in range(3)))
        async with (
            serve(**llm_settings(fake), usage_budgets=budgets) as srv,
            httpx.AsyncClient(timeout=60) as client,
        ):
            assert await _ask(client, srv.url, "first") == "answer 0"  # 18 of 30
            assert await _ask(client, srv.url, "second") == "answer 1"  # 36: over 80 % and 95 %
            refused = await _ask(client, srv.url, "third")
            assert refused.startswith(
                "Your daily usage budget is spent, so this message was not sent to the model."
            )
            assert len(fake.requests) == 2  # the third was never sent
            assert (
                await _ask(client, srv.url, "hi", sender="bob") == "answer 2"
            )  # another sender's own budget
            own = await _ask(client, srv.url, "/usage")
            async with srv.runtime.engine.connect() as conn:
                payloads = (await conn.execute(select(outbox.c.payload))).scalars().all()
    notices = [p["parts"][0]["text"] for p in payloads if p["parts"][0]["text"].startswith("Note:")]
    assert notices == ["Note: your daily usage budget is 95% used."]  # once, at the call that crossed it
    assert own.splitlines()[:2] == ["Your usage", "today: 36 tokens"]
    assert (
        "daily budget: 0 of 30 tokens left" in own.replace("today budget", "daily budget") or "0 of 30" in own
    )


async def test_speech_to_text_seconds_are_the_senders_usage(serve: ServeApp) -> None:
    """A voice note through a real fake Telegram: the endpoint's reported seconds become a
    usage row of the sender (priced per minute), seen by the admin API, /usage and /metrics."""
    from tests.channels.support import wait_outbox_final
    from tests.channels.telegram.support import post_update, tg_settings
    from tests.fakes import telegram as tg
    from tests.fakes.telegram import FakeTelegram

    prices = {**PRICES, "whisper-1": {"audio_minute": 0.006}}
    async with FakeOpenAI() as llm, FakeTelegram() as fake:
        llm.enqueue(text("Noted.", prompt_tokens=40, completion_tokens=4))
        llm.transcript, llm.transcript_seconds = "remind me to buy milk", 7.5
        fake.files["VOICE1"] = b"OggS\x00fake-opus-voice-note"
        async with (
            serve(
                **llm_settings(llm),
                channel_settings={"telegram": tg_settings(fake, streaming="off")},
                stt_model="whisper-1",
                usage_prices=prices,
            ) as srv,
            httpx.AsyncClient(timeout=60) as client,
        ):
            voice = {"file_id": "VOICE1", "file_unique_id": "uv", "duration": 8, "mime_type": "audio/ogg"}
            said = tg.update(701, tg.message(None, voice=voice))
            assert (await post_update(client, srv.url, said)).is_success
            await wait_outbox_final(srv.runtime)
            await srv.runtime.usage.flush()  # written in the background otherwise (within 1 s)
            assert (await post_update(client, srv.url, tg.update(702, tg.message("/usage")))).is_success
            await wait_outbox_final(srv.runtime, count=2)
            await srv.runtime.usage.flush()
            by_model = (
                await client.get(f"{srv.url}/admin/api/usage", params={"group": "model"}, headers=ADMIN)
            ).json()
            by_sender = (
                await client.get(f"{srv.url}/admin/api/usage", params={"group": "sender"}, headers=ADMIN)
            ).json()
            metrics = (await client.get(f"{srv.url}/metrics")).text
    rows = {r["model"]: r for r in by_model["rows"]}
    assert set(rows) == {"fake-model", "whisper-1"}
    speech = rows["whisper-1"]
    assert (speech["calls"], speech["audio_seconds"], speech["input_tokens"]) == (1, 7.5, 0)
    assert speech["cost"] == pytest.approx(7.5 / 60 * 0.006)
    assert rows["fake-model"]["audio_seconds"] == 0
    [sender] = by_sender["rows"]  # the voice note's sender pays for both
    assert (sender["calls"], sender["audio_seconds"], sender["input_tokens"]) == (2, 7.5, 40)
    noted, usage = fake.sent_texts()
    assert noted == "Noted."
    assert "today: 44 tokens, 7.5 s of speech transcribed" in usage, usage
    assert 'chatgate_speech_seconds_total{model="whisper-1"} 7.5' in metrics


async def test_usage_by_session_of_one_channel_and_the_budgets_use(serve: ServeApp) -> None:
    """What the dashboard's usage page reads, on both stores."""
    budgets = [
        {"scope": "sender", "period": "day", "tokens": 1000},
        {"scope": "deployment", "period": "month", "cost": 1.0},
    ]
    async with FakeOpenAI() as fake:
        fake.enqueue(
            text("one", prompt_tokens=300, completion_tokens=20),
            text("two", prompt_tokens=100, completion_tokens=10),
        )
        async with (
            serve(**llm_settings(fake), usage_prices=PRICES, usage_budgets=budgets) as srv,
            httpx.AsyncClient(timeout=60) as client,
        ):
            await _ask(client, srv.url, "hi")
            await _ask(client, srv.url, "hello", sender="bob")
            get = lambda **params: client.get(f"{srv.url}/admin/api/usage", params=params, headers=ADMIN)  # noqa: E731
            by_session = (await get(group="session", channel="webhook", days=7)).json()
            elsewhere = (await get(group="session", channel="telegram")).json()
            use = (await client.get(f"{srv.url}/admin/api/usage/budgets", headers=ADMIN)).json()
    assert [(r["session"], r["input_tokens"]) for r in by_session["rows"]] == [
        ("webhook:ann", 300),
        ("webhook:bob", 100),
    ]
    assert by_session["channel"] == "webhook" and elsewhere["rows"] == []
    sender, deployment = use["budgets"]
    assert (sender["scope"], sender["unit"], sender["limit"]) == ("sender", "tokens", 1000)
    assert [(s["subject"], s["used"], s["share"]) for s in sender["subjects"]] == [
        ("webhook:ann", 320, 0.32),
        ("webhook:bob", 110, 0.11),
    ]
    cost = (400 * 1.0 + 30 * 2.0) / 1_000_000
    [whole] = deployment["subjects"]
    assert whole["subject"] == "deployment" and whole["used"] == pytest.approx(cost)
    assert use["currency"] == "USD"


async def test_chatgate_usage_by_session_of_one_channel(tmp_path: Path) -> None:
    """`chatgate usage` reads the rows a server wrote: by session, one channel, JSON and table."""
    from app.db.models import usage_records, utcnow
    from app.migrate import upgrade
    from tests.app.test_cli import _cli

    db = tmp_path / "usage.db"
    await upgrade(f"sqlite+aiosqlite:///{db}")
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}")
    now = utcnow()
    row = dict(identity="x", chat="x", agent="default", model="fake-model", cached_tokens=0, currency="USD")
    async with engine.begin() as conn:
        await conn.execute(
            insert(usage_records),
            [
                {
                    **row,
                    "day": now.strftime("%Y-%m-%d"),
                    "session_key": "telegram:1",
                    "channel": "telegram",
                    "input_tokens": 10,
                    "output_tokens": 1,
                    "audio_seconds": 0.0,
                    "cost": None,
                    "created_at": now,
                },
                {
                    **row,
                    "day": now.strftime("%Y-%m-%d"),
                    "session_key": "telegram:1",
                    "channel": "telegram",
                    "model": "whisper-1",
                    "input_tokens": 0,
                    "output_tokens": 0,
                    "audio_seconds": 4.5,
                    "cost": None,
                    "created_at": now,
                },
                {
                    **row,
                    "day": now.strftime("%Y-%m-%d"),
                    "session_key": "webhook:2",
                    "channel": "webhook",
                    "input_tokens": 99,
                    "output_tokens": 9,
                    "audio_seconds": 0.0,
                    "cost": None,
                    "created_at": now,
                },
            ],
        )
    await engine.dispose()
    env = {"DATABASE_URL": f"sqlite:///{db}"}
    done = _cli(["usage", "--by", "session", "--channel", "telegram", "--json"], tmp_path, **env)
    assert done.returncode == 0, done.stderr
    [only] = json.loads(done.stdout)
    assert (only["session"], only["calls"], only["input_tokens"], only["audio_seconds"]) == (
        "telegram:1",
        2,
        10,
        4.5,
    )
    table = _cli(["usage", "--by", "channel"], tmp_path, **env)
    assert table.returncode == 0, table.stderr
    assert "AUDIO_SECONDS" in table.stdout and "webhook" in table.stdout
