"""Files in a reply go to Slack by external upload (getUploadURLExternal, then completeUploadExternal)."""

from __future__ import annotations

import base64

from app.db.models import outbox
from app.events import FilePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.slack.support import slack_settings
from tests.channels.support import wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.slack import FakeSlack

REPORT = b"%PDF-1.4\n% a tiny report\n"


async def test_outbound_file_is_uploaded_externally_and_an_outage_is_retried(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        fake.upload_failures = [503]  # the first POST of the bytes fails
        async with serve(
            channel_settings={"slack": slack_settings(fake)}, outbox_backoff_base_seconds=0.05
        ) as srv:
            message = OutboundMessage(
                channel="slack",
                chat_id="C01",
                thread_id="1700000000.000100",
                session_key="slack:C01:1700000000.000100",
                parts=(
                    TextPart(text="The report:"),
                    FilePart(data_base64=base64.b64encode(REPORT).decode(), name="report.pdf"),
                ),
            )
            async with srv.runtime.engine.begin() as conn:
                await conn.execute(
                    outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
                )
            srv.runtime.sender.notify()
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "sent"
    assert row["attempts"] == 2
    assert [p["text"] for p in fake.posted()] == ["The report:"]  # the retry did not repeat the text
    assert [c.ok for c in fake.calls_of("upload")] == [False, True]
    [shared] = fake.completed
    assert shared["bytes"] == REPORT
    assert (shared["channel"], shared["thread_ts"], shared["title"]) == (
        "C01",
        "1700000000.000100",
        "report.pdf",
    )
