"""Images and files in a reply are uploaded (sendPhoto / sendDocument) through the outbox, with retries."""

from __future__ import annotations

import base64

from app.db.models import outbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.pipeline.replies import outbox_values
from tests.channels.support import wait_outbox_final
from tests.channels.telegram.support import tg_settings
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram

REPORT = b"%PDF-1.4\n% a tiny report\n"


async def test_outbound_image_and_file_are_uploaded_and_an_outage_is_retried(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.fail("sendPhoto", tg.SERVER_ERROR)  # the upload fails once, after the text went out
        async with serve(
            channel_settings={"telegram": tg_settings(fake)}, outbox_backoff_base_seconds=0.05
        ) as srv:
            message = OutboundMessage(
                channel="telegram",
                chat_id="4242",
                session_key="telegram:4242",
                parts=(
                    TextPart(text="Here is the chart and the report."),
                    ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
                    FilePart(
                        data_base64=base64.b64encode(REPORT).decode(),
                        name="report.pdf",
                        mime_type="application/pdf",
                    ),
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
    assert fake.sent_texts() == ["Here is the chart and the report."]  # not repeated by the retry
    photos = fake.calls_of("sendPhoto")
    assert [c.ok for c in photos] == [False, True]
    assert photos[-1].params["photo"]["bytes"] == PIXEL
    [document] = [c for c in fake.calls_of("sendDocument") if c.ok]
    assert document.params["document"] == {"filename": "report.pdf", "bytes": REPORT}
