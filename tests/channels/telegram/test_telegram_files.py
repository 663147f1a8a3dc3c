"""Files both ways on Telegram: `send_file` answers with sendPhoto/sendDocument, and a
document the user sends is kept in the session's workspace for the file tools."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import messages, outbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.telegram import FakeTelegram

REPORT = b"%PDF-1.4\n% a tiny report\n"


def _document(file_id: str, name: str, data: bytes, mime: str = "application/pdf") -> dict[str, Any]:
    return {"file_id": file_id, "file_unique_id": "u" + file_id, "file_name": name, "mime_type": mime,
            "file_size": len(data)}  # fmt: skip


def _tool_result(request: Any, call_id: str) -> Any:
    return json.loads(next(m["content"] for m in request.messages if m.get("tool_call_id") == call_id))


async def test_send_file_answers_with_a_photo_and_a_document(serve: ServeApp, tmp_path: Path) -> None:
    (tmp_path / "chart.png").write_bytes(PIXEL)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.pdf").write_bytes(REPORT)
    async with FakeOpenAI() as llm, FakeTelegram() as fake:
        llm.enqueue(
            calls(ToolCall("send_file", {"path": "chart.png"}, id="c1")),
            calls(
                ToolCall("send_file", {"path": "out/report.pdf"}, id="c2"),
                ToolCall("send_file", {"path": "../secret.txt"}, id="c3"),
            ),
            text("Here are the chart and the report."),
        )
        async with (
            serve(
                channel_settings={"telegram": tg_settings(fake, streaming="off")},
                **openai_settings(llm, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_update(client, srv.url, tg.update(700, tg.message("send me the chart")))
            assert resp.status_code == 200
            [row] = await wait_outbox_final(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                last = select(messages.c.parts).where(messages.c.role == "assistant")
                answer = (await conn.execute(last.order_by(messages.c.id.desc()).limit(1))).scalar_one()
                payload = (await conn.execute(select(outbox.c.payload))).scalar_one()
    assert row["status"] == "sent"
    # The model was told what was attached, and why the third path was refused.
    assert _tool_result(llm.requests[1], "c1")["attached"] == "chart.png"
    assert _tool_result(llm.requests[2], "c2") | {"note": ""} == {
        "attached": "out/report.pdf", "as": "file", "bytes": len(REPORT), "note": ""}  # fmt: skip
    assert "outside the workspace" in _tool_result(llm.requests[2], "c3")["error"]
    # Text first, then the uploads in the order attached.
    order = [c.method for c in fake.calls if c.method in ("sendMessage", "sendPhoto", "sendDocument")]
    assert order == ["sendMessage", "sendPhoto", "sendDocument"]
    assert fake.sent_texts() == ["Here are the chart and the report."]
    [photo] = fake.calls_of("sendPhoto")
    assert photo.params["photo"]["bytes"] == PIXEL
    [document] = fake.calls_of("sendDocument")
    assert document.params["document"] == {"filename": "report.pdf", "bytes": REPORT}
    # The history keeps references (no bytes); the outbox row had the bytes.
    assert answer == [
        {"type": "image", "mime_type": "image/png", "workspace_path": "chart.png"},
        {"type": "file", "mime_type": "application/pdf", "workspace_path": "out/report.pdf",
         "name": "report.pdf", "size": len(REPORT)},
    ]  # fmt: skip
    media = [p for p in payload["parts"] if p["type"] != "text"]
    assert [base64.b64decode(p["data_base64"]) for p in media] == [PIXEL, REPORT]


async def test_a_document_is_kept_in_the_sessions_workspace(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as llm, FakeTelegram() as fake:
        fake.files["DOC1"] = REPORT
        fake.files["DOC2"] = b"not yours"
        llm.enqueue(
            text("Got your report."),
            text("Got it too."),
            # Another chat's model tries the first chat's file: another workspace.
            calls(ToolCall("read_file", {"path": "inbox/update_800-report_2026.pdf"}, id="r1")),
            text("No such file here."),
        )
        settings = openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True)
        async with (
            serve(channel_settings={"telegram": tg_settings(fake, streaming="off")}, **settings) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            doc = _document("DOC1", "report 2026.pdf", REPORT)
            msg = tg.message(None, document=doc, caption="please summarise")
            assert (await post_update(client, srv.url, tg.update(800, msg))).status_code == 200
            await wait_outbox_final(srv.runtime)
            # A name that tries to climb out of the inbox stays inside it.
            evil = _document("DOC2", "../../.bashrc", b"not yours", mime="text/plain")
            msg = tg.message(None, document=evil)
            assert (await post_update(client, srv.url, tg.update(801, msg))).status_code == 200
            await wait_outbox_final(srv.runtime, count=2)
            other = tg.message("read it", chat=tg.private_chat(5151), sender=tg.user(5151))
            assert (await post_update(client, srv.url, tg.update(802, other))).status_code == 200
            await wait_outbox_final(srv.runtime, count=3)
            async with srv.runtime.engine.connect() as conn:
                stored = [
                    r[0]
                    for r in await conn.execute(
                        select(messages.c.parts).where(messages.c.role == "user").order_by(messages.c.id)
                    )
                ]
    saved = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    assert len(saved) == 2
    first, second = saved
    assert first.endswith("/inbox/update_800-report_2026.pdf")
    assert second.endswith("/inbox/update_801-bashrc")
    assert first.split("/inbox/")[0] == second.split("/inbox/")[0]  # the same session's workspace
    assert (tmp_path / first).read_bytes() == REPORT
    # The history names the path, without the bytes; the model was told where it is.
    [part] = stored[0]
    assert part["workspace_path"] == "inbox/update_800-report_2026.pdf" and part["data_base64"] is None
    first_user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert "please summarise" in first_user
    assert "saved in your workspace as inbox/update_800-report_2026.pdf" in first_user
    # The other chat's session cannot read it.
    assert "no file" in _tool_result(llm.requests[3], "r1")["error"]
    assert fake.sent_texts() == ["Got your report.", "Got it too.", "No such file here."]
