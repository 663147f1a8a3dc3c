"""300 replies to one Telegram group from two replicas on one PostgreSQL, the fake Bot API
answering every fifth sendMessage with 429 `retry_after=3` (issue 34, "Pacing", names
exactly this test).

The limits are Telegram's shape scaled down twenty times so the test takes minutes, not
a quarter of an hour: 20 per 3 s to a group (Telegram: 20 per minute) and one per 50 ms
per chat (one per second). `retry_after` is not scaled: it is the platform's word, three
whole seconds, and the 75 pauses are most of the test's time (about four minutes).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, defaultdict

import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import outbox
from app.events import OutboundMessage, TextPart
from app.outbox_rows import outbox_values
from tests.conftest import ADMIN_TOKEN
from tests.fakes import telegram as tg
from tests.fakes.telegram import Call, FakeTelegram
from tests.support.servers import ServerProcess, stop_all
from tests.support.timing import eventually

from .support import SECRET

# Not serial: the assertions are lower bounds on the timing of two processes sending (no two
# sends closer than the limits, none within `retry_after` of a 429), which a loaded machine
# cannot break unless the pacing is wrong: load delays a send, never brings it forward, and a
# send that leaves late pushes the next one back (`Pacer.leaving`). Four minutes of mostly
# waiting: `long` starts it first in the parallel phase.
pytestmark = [pytest.mark.slow, pytest.mark.long]

REPLIES = 300
GROUP = "-1001234567890"
KEYS = 10  # sessions in the group (user_in_chat scope): replies of different keys go in parallel
RETRY_AFTER = 3  # seconds, as issue 34 names it
GROUP_RATE = (20, 3.0)  # at most 20 in any 3 s
CHAT_GAP = 0.05  # at most one per 50 ms
JITTER = 0.05  # a send reaches the fake some ms after its slot (more on a new connection)


def _env(db_url: str, fake: FakeTelegram, worker: str) -> dict[str, str]:
    count, seconds = GROUP_RATE
    return {
        "DATABASE_URL": db_url,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "telegram",
        "WORKER_ID": worker,
        "TELEGRAM_BOT_TOKEN": fake.token,
        "TELEGRAM_WEBHOOK_SECRET": SECRET,
        "TELEGRAM_API_BASE_URL": fake.url,
        "TELEGRAM_FILE_BASE_URL": fake.file_url,
        "TELEGRAM_BOT_ID": str(fake.bot_id),
        "TELEGRAM_BOT_USERNAME": fake.username,
        "PACING_ENABLED": "true",
        "PACING_LIMITS": f"telegram.group={count}/{seconds:g},telegram.chat=1/{CHAT_GAP:g}",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


def _reply(i: int) -> OutboundMessage:
    return OutboundMessage(
        channel="telegram",
        chat_id=GROUP,
        parts=(TextPart(text=f"reply {i:03d}"),),
        session_key=f"telegram:{GROUP}:user:{i % KEYS}",
    )


async def test_300_replies_from_two_replicas_keep_telegrams_limits_and_retry_after(pg_url: str) -> None:
    async with FakeTelegram() as fake:
        fake.every["sendMessage"] = (
            5,
            tg.Failure(429, f"Too Many Requests: retry after {RETRY_AFTER}", RETRY_AFTER),
        )
        servers = [
            await asyncio.to_thread(ServerProcess(_env(pg_url, fake, name)).start)
            for name in ("replica-a", "replica-b")
        ]
        engine = create_async_engine(pg_url)
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    outbox.insert(),
                    [
                        outbox_values(_reply(i), session_id=None, run_id=None, event_id=None)
                        for i in range(REPLIES)
                    ],
                )
            started = time.monotonic()
            # The limits and the pauses take ~4.5 minutes at least; load only delays sends
            # (each pushes the next one back), and in a full parallel run this took 290 to
            # over 330 s. The bound is for a pacer that is stuck, so it is generous.
            least = REPLIES / GROUP_RATE[0] * GROUP_RATE[1] + REPLIES / 4 * RETRY_AFTER
            await eventually(lambda: len(fake.sent_texts()) >= REPLIES, timeout=least * 2, interval=0.5)
            took = time.monotonic() - started
            await asyncio.sleep(1)  # a duplicate would come now
        finally:
            await stop_all(*servers)
            await engine.dispose()

    sends = sorted(fake.calls_of("sendMessage"), key=lambda c: c.at)
    delivered = [c.params["text"] for c in sends if c.ok]
    # None lost, none twice.
    assert Counter(delivered) == Counter(f"reply {i:03d}" for i in range(REPLIES))
    # Order per conversation: each session's replies arrive in the order they were written.
    by_key: dict[int, list[int]] = defaultdict(list)
    for text in delivered:
        i = int(text.split()[1])
        by_key[i % KEYS].append(i)
    assert all(got == sorted(got) for got in by_key.values())
    # The fake really refused every fifth send, and every refusal paused the group.
    refused = [c for c in sends if not c.ok]
    assert len(refused) == len(sends) // 5 and len(sends) == REPLIES + len(refused)
    _assert_retry_after_kept(sends)
    # Within the limits, counting every call the platform saw (refused ones count there too).
    times = [c.at for c in sends]
    count, seconds = GROUP_RATE
    windows = [times[k + count] - times[k] for k in range(len(times) - count)]
    assert min(windows) >= seconds - JITTER, f"{count + 1} sends within {min(windows):.3f} s"
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= CHAT_GAP - JITTER
    # The pauses dominate: one per four sends, each a whole `retry_after`.
    assert took >= len(refused) * RETRY_AFTER * 0.9


def _assert_retry_after_kept(sends: list[Call]) -> None:
    for k, call in enumerate(sends):
        if call.ok or k + 1 == len(sends):
            continue
        following = sends[k + 1]
        waited = following.at - call.at
        assert waited >= RETRY_AFTER - 0.001, f"sent {waited:.3f} s after a 429 asking for {RETRY_AFTER} s"
