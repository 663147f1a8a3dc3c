"""The outbox sender paces Telegram replies (`app.pipeline.pacing`), on SQLite and PostgreSQL:
spaced by the group's budget, held by a 429's `retry_after`, none lost, none twice, in
order per session, and no delivery attempt counted for waiting."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict

import httpx

from app.db.models import outbox
from app.events import OutboundMessage, TextPart
from app.outbox_rows import outbox_values
from tests.channels.support import llm_settings, wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.telegram import FakeTelegram

GROUP = "-100777"
PRIVATE = "4242"
# A send reaches the fake a little after its slot: here one event loop runs the app, the
# model and the fakes on a shared machine, and the first send opens its connection.
JITTER = 0.15


def _reply(chat: str, i: int, key: str) -> OutboundMessage:
    return OutboundMessage(
        channel="telegram", chat_id=chat, parts=(TextPart(text=f"r{i:02d}"),), session_key=key
    )


async def test_replies_to_a_group_are_spaced_and_a_429_holds_the_group(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.fail("sendMessage", None, None, None, tg.TOO_MANY_REQUESTS)  # the 4th: retry_after=1
        async with serve(
            channel_settings={"telegram": tg_settings(fake)},
            pacing_enabled=True,
            pacing_limits="telegram.group=5/2,telegram.chat=1/0.1",  # 0.4 s apart in the group
            pacing_max_wait_seconds=0.5,
        ) as srv:
            replies = [_reply(GROUP, i, f"telegram:{GROUP}:user:{i % 3}") for i in range(12)]
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(),
                    [outbox_values(r, session_id=None, run_id=None, event_id=None) for r in replies],
                )
            srv.runtime.sender.notify()
            rows = await wait_outbox_final(srv.runtime, 12, timeout=30)
    assert {(r["status"], r["attempts"]) for r in rows} == {("sent", 1)}  # waiting counts no attempt
    sends = sorted(fake.calls_of("sendMessage"), key=lambda c: c.at)
    delivered = [c.params["text"] for c in sends if c.ok]
    assert Counter(delivered) == Counter(f"r{i:02d}" for i in range(12))
    by_key: dict[int, list[int]] = defaultdict(list)
    for text in delivered:
        by_key[int(text[1:]) % 3].append(int(text[1:]))
    assert all(got == sorted(got) for got in by_key.values())
    gaps = [b.at - a.at for a, b in itertools.pairwise(sends)]
    [refused] = [k for k, c in enumerate(sends) if not c.ok]
    assert gaps[refused] >= 1.0 - 0.001  # retry_after=1: nothing to the group before
    assert min(gaps) >= 0.4 - JITTER


async def test_a_private_chat_is_not_held_by_a_busy_group(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with serve(
            channel_settings={"telegram": tg_settings(fake)},
            pacing_enabled=True,
            pacing_limits="telegram.group=2/2,telegram.chat=1/0.05",  # one per second in the group
            pacing_max_wait_seconds=0.2,
        ) as srv:
            group = [_reply(GROUP, i, f"telegram:{GROUP}:user:{i}") for i in range(4)]
            private = [_reply(PRIVATE, 10 + i, f"telegram:{PRIVATE}") for i in range(3)]
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(),
                    [outbox_values(r, session_id=None, run_id=None, event_id=None) for r in group + private],
                )
            srv.runtime.sender.notify()
            await wait_outbox_final(srv.runtime, 7, timeout=30)
    sends = sorted(fake.calls_of("sendMessage"), key=lambda c: c.at)
    first = sends[0].at
    by_chat: dict[str, list[float]] = defaultdict(list)
    for call in sends:
        by_chat[str(call.params["chat_id"])].append(call.at - first)
    # The group's four take three seconds; the private chat's three are done long before.
    assert by_chat[GROUP][-1] >= 3.0 - JITTER
    assert len(by_chat[PRIVATE]) == 3 and by_chat[PRIVATE][-1] < 1.5


ANSWER = " ".join(f"word{i}" for i in range(60))  # streamed in 100 pieces over ~2 s


async def test_a_chat_over_budget_loses_its_previews_first_and_keeps_its_answers(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeTelegram() as fake:
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake, stream_edit_seconds=0.2)},
                stream_first_preview_seconds=0.2,
                pacing_enabled=True,
                pacing_limits="telegram.chat=2/1",  # one per 0.5 s to the chat
                pacing_max_wait_seconds=0.2,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Replies of other conversations in the same chat (a cron job's, say) fill its
            # budget for the next five seconds: final answers all.
            fillers = [_reply(PRIVATE, i, f"telegram:{PRIVATE}:job:{i}") for i in range(10)]
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(),
                    [outbox_values(r, session_id=None, run_id=None, event_id=None) for r in fillers],
                )
            srv.runtime.sender.notify()
            # The chat is over budget once its first filler went (on a slow machine the
            # sender may not have claimed them yet when the answer's first preview is due).
            await fake.wait_for("sendMessage", 1)
            await post_update(client, srv.url, tg.update(600, tg.message("tell me a story")))
            rows = await wait_outbox_final(srv.runtime, 11, timeout=30)
    assert {r["status"] for r in rows} == {"sent"}
    # No preview was opened or edited while the answers waited; the answer came as a
    # message of its own, once, and every filler too.
    assert not fake.calls_of("editMessageText")
    delivered = fake.sent_texts()
    assert Counter(delivered) == Counter([ANSWER, *(f"r{i:02d}" for i in range(10))])
    sends = sorted(fake.calls_of("sendMessage"), key=lambda c: c.at)
    assert min(b.at - a.at for a, b in itertools.pairwise(sends)) >= 0.5 - JITTER


async def test_a_429_on_a_preview_holds_the_answer_until_retry_after(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeTelegram() as fake:
        fake.fail("editMessageText", tg.Failure(429, "Too Many Requests: retry after 4", retry_after=4))
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake, stream_edit_seconds=0.2)},
                stream_first_preview_seconds=0.2,
                pacing_enabled=True,
                pacing_limits="telegram.chat=20/1",  # previews flow until the 429
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(601, tg.message("tell me a story")))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
    assert row["status"] == "sent"
    [refused] = [c for c in fake.calls if not c.ok]
    after = [c for c in fake.calls if c.method != "sendChatAction" and c.at > refused.at]
    assert after, "the answer came after the refused edit"
    # The answer (the preview's last edit), written ~2 s in, waited out the preview's 429.
    assert min(c.at for c in after) >= refused.at + 4 - 0.001
    assert list(fake.texts.values()) == [ANSWER]


async def test_a_send_waits_for_the_answer_to_the_one_before_it(serve: ServeApp) -> None:
    # Telegram takes 0.3 s to answer, six times the chat's interval: without one send in
    # flight per chat, five more would leave before the 429 to the third was known.
    async with FakeTelegram() as fake:
        fake.slow["sendMessage"] = 0.3
        fake.fail("sendMessage", None, None, tg.TOO_MANY_REQUESTS)  # the 3rd: retry_after=1
        async with serve(
            channel_settings={"telegram": tg_settings(fake)},
            pacing_enabled=True,
            pacing_limits="telegram.chat=1/0.05",
            pacing_max_wait_seconds=0.5,
        ) as srv:
            replies = [_reply(PRIVATE, i, f"telegram:{PRIVATE}:job:{i}") for i in range(6)]
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(),
                    [outbox_values(r, session_id=None, run_id=None, event_id=None) for r in replies],
                )
            srv.runtime.sender.notify()
            rows = await wait_outbox_final(srv.runtime, 6, timeout=30)
    assert {r["status"] for r in rows} == {"sent"}
    assert Counter(fake.sent_texts()) == Counter(f"r{i:02d}" for i in range(6))
    sends = sorted(fake.calls_of("sendMessage"), key=lambda c: c.at)
    gaps = [b.at - a.at for a, b in itertools.pairwise(sends)]
    assert min(gaps) >= 0.3 - 0.01  # each left after the answer to the one before
    [refused] = [k for k, c in enumerate(sends) if not c.ok]
    assert gaps[refused] >= 0.3 + 1.0 - 0.01  # and none before the 429's retry_after was over
