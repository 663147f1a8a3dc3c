"""Media in answers: `send_file` attachments and the model's own images reach the final
answer however the run ends (answer, approval pause and resume, /stop, the step limit, a
model failure). Driven through the whole app: signed webhook with `?wait=true` (its
replies carry the parts), the real OpenAI SDK against the fake OpenAI server."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

from app.db.models import runs
from tests.app.agent.test_agent_e2e import ask, openai_settings
from tests.channels.telegram.test_telegram_media import PIXEL
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, error, text
from tests.pipeline.test_approvals import approval_id, history_is_legal, rows, write_call
from tests.pipeline.test_steer import send

PIXEL64 = base64.b64encode(PIXEL).decode()
NOTES = b"line one\nline two\n"


def send_file(path: str, call_id: str = "s1") -> ToolCall:
    return ToolCall("send_file", {"path": path}, id=call_id)


def reply_media(body: dict[str, Any]) -> list[tuple[str, bytes]]:
    """(type, bytes) of the non-text parts of the single reply."""
    [reply] = body["replies"]
    return [(p["type"], base64.b64decode(p["data_base64"])) for p in reply["parts"] if p["type"] != "text"]


def only_reply_text(body: dict[str, Any]) -> str:
    [reply] = body["replies"]
    return str(reply["text"])


def workspace(tmp_path: Path) -> Path:
    (tmp_path / "pixel.png").write_bytes(PIXEL)
    (tmp_path / "notes.txt").write_bytes(NOTES)
    return tmp_path


async def test_attachments_before_an_approval_pause_reach_the_resumed_answer(
    serve: ServeApp, tmp_path: Path
) -> None:
    root = workspace(tmp_path)
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(send_file("pixel.png")), calls(write_call()), calls(send_file("notes.txt", "s2")),
                     text("Done."))  # fmt: skip
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        async with serve(channel_settings=channel, **openai_settings(fake, workspace_root=str(root))) as srv:
            asked = await ask(srv, "draw and write")
            assert reply_media(asked) == []  # the question carries no attachment
            [paused] = await rows(srv, runs)
            done = await ask(srv, f"/approve {approval_id(only_reply_text(asked))}", sender="boss")
            [run] = await rows(srv, runs)
            await history_is_legal(srv)
    assert paused["details"]["attachments"] == [
        {"type": "image", "mime_type": "image/png", "workspace_path": "pixel.png"}
    ]
    assert only_reply_text(done) == "Done."
    # The image attached before the pause (read again from the workspace), then the file.
    assert reply_media(done) == [("image", PIXEL), ("file", NOTES)]
    assert [a["workspace_path"] for a in run["details"]["attachments"]] == ["pixel.png", "notes.txt"]


async def test_stop_delivers_what_was_attached_with_the_stopped_answer(
    serve: ServeApp, tmp_path: Path
) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(send_file("pixel.png")), Reply(content="too late", hold=hold))
        async with serve(**openai_settings(fake, workspace_root=str(workspace(tmp_path)))) as srv:
            await send(srv, "draw slowly")
            await fake.wait_requests(2)
            stopped = await send(srv, "/stop", wait=True)
            hold.set()
            await history_is_legal(srv, "webhook:c1")
    assert only_reply_text(stopped) == "Stopped."
    assert reply_media(stopped) == [("image", PIXEL)]


async def test_stop_while_waiting_for_an_approval_delivers_what_was_attached(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(send_file("pixel.png")), calls(write_call()))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        settings = openai_settings(fake, workspace_root=str(workspace(tmp_path)))
        async with serve(channel_settings=channel, **settings) as srv:
            asked = await ask(srv, "draw, then write")
            assert "/approve" in only_reply_text(asked)
            stopped = await ask(srv, "/stop")
            history = await history_is_legal(srv)
    assert only_reply_text(stopped) == "Stopped."
    assert reply_media(stopped) == [("image", PIXEL)]
    assert history[-1].parts == ({"type": "image", "mime_type": "image/png", "workspace_path": "pixel.png"},)


async def test_step_limit_and_model_failure_still_deliver_the_attachments(
    serve: ServeApp, tmp_path: Path
) -> None:
    root = workspace(tmp_path)
    async with FakeOpenAI(default=error(500)) as fake:  # the model is down after the script
        fake.enqueue(calls(send_file("pixel.png")), calls(send_file("notes.txt")))
        settings = openai_settings(fake, workspace_root=str(root), agent_max_iterations=1)
        async with serve(**settings) as srv:
            limited = await ask(srv, "draw")  # one step allowed: the send_file call
        async with serve(**openai_settings(fake, workspace_root=str(root), llm_max_retries=0)) as srv:
            failed = await ask(srv, "write", chat="c2")
            [_, run] = await rows(srv, runs)
    assert only_reply_text(limited).startswith("I stopped after 1 steps")
    assert reply_media(limited) == [("image", PIXEL)]
    assert reply_media(failed) == [("file", NOTES)]
    assert "not reachable" in only_reply_text(failed)
    assert run["outcome"] == "provider_error"


async def test_send_file_refuses_what_it_must_not_send(serve: ServeApp, tmp_path: Path) -> None:
    root = workspace(tmp_path)
    (tmp_path / "big.bin").write_bytes(b"x" * 100)
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(*(send_file(path, call) for path, call in
                    (("big.bin", "a"), ("../../etc/passwd", "b"), ("nothing.png", "c"), (".", "d")))),
            text("Nothing to send."),
        )  # fmt: skip
        settings = openai_settings(fake, workspace_root=str(root), send_file_max_bytes=50)
        async with serve(**settings) as srv:
            body = await ask(srv, "send them")
    results = {
        m["tool_call_id"]: json.loads(m["content"]) for m in fake.requests[1].messages if m["role"] == "tool"
    }
    assert "the limit is 50" in results["a"]["error"]
    assert "outside the workspace" in results["b"]["error"]
    assert "no file" in results["c"]["error"] and "no file" in results["d"]["error"]
    assert reply_media(body) == []


async def test_images_in_the_models_answer_are_kept_as_image_parts(serve: ServeApp) -> None:
    data_url = "data:image/png;base64," + PIXEL64
    async with FakeOpenAI() as fake:
        fake.enqueue(
            Reply(content_items=[{"type": "text", "text": "A pixel:"},
                                 {"type": "image_url", "image_url": {"url": data_url}}]),
            Reply(content="And another.", images=[{"type": "image_url", "image_url": {"url": data_url}}]),
        )  # fmt: skip
        async with serve(**openai_settings(fake)) as srv:
            listed = await ask(srv, "draw a pixel")
            beside = await ask(srv, "again")
    assert only_reply_text(listed) == "A pixel:"
    assert reply_media(listed) == [("image", PIXEL)]
    assert only_reply_text(beside) == "And another."
    assert reply_media(beside) == [("image", PIXEL)]
