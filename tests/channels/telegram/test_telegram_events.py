"""Telegram's platform-native events end to end (docs/events.md): an edit of a queued
message, and approval buttons (a press by an approver approves, anyone else is refused
with a private alert). The real app and PTB Bot, a fake Bot API, the fake OpenAI server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import session_messages, settled_outbox, wait_inbox_done
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.fakes.telegram import FakeTelegram
from tests.support.timing import eventually


def echo(body: dict[str, Any]) -> Reply:
    """The model answers `echo <the last user message>`."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


def user_texts(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


async def test_an_edit_of_a_queued_message_replaces_it(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI(default=echo) as model, FakeTelegram() as fake:
        model.enqueue(text("echo first", hold=hold))  # the first turn runs until released
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(1, tg.message("first")))
            await model.wait_requests(1)
            draft = tg.message("what is 2+2")
            await post_update(client, srv.url, tg.update(2, draft))  # queued behind "first"
            resp = await post_update(client, srv.url, tg.edited_update(3, draft, "what is 3+3"))
            assert resp.status_code == 200, resp.text
            hold.set()
            await wait_inbox_done(srv.runtime)
            sent = await fake.wait_for("sendMessage", 2)
            history = await session_messages(client, srv.url, "telegram:4242")
    # One answer, to the edited text; the model never saw the first version.
    assert [c.params["text"] for c in sent] == ["echo first", "echo what is 3+3"]
    assert len(fake.calls_of("sendMessage")) == 2
    assert [user_texts(r)[-1] for r in model.requests] == ["first", "what is 3+3"]
    assert all("2+2" not in str(r.messages) for r in model.requests)
    assert [(m["role"], m["content"]) for m in history] == [
        ("user", "first"),
        ("assistant", "echo first"),
        ("user", "what is 3+3"),
        ("assistant", "echo what is 3+3"),
    ]


async def test_an_edit_of_an_answered_message_is_a_note_on_the_next_turn(serve: ServeApp) -> None:
    async with FakeOpenAI(default=echo) as model, FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            original = tg.message("meet at 5")
            await post_update(client, srv.url, tg.update(1, original))
            await fake.wait_for("sendMessage", 1)
            await post_update(client, srv.url, tg.edited_update(2, original, "meet at 6"))
            await wait_inbox_done(srv.runtime)
            await post_update(client, srv.url, tg.update(3, tg.message("ok?")))
            await fake.wait_for("sendMessage", 2)
    assert len(fake.calls_of("sendMessage")) == 2  # the edit itself is not answered (annotate)
    last = user_texts(model.requests[-1])
    assert last[-1] == "ok?"
    assert any('edited an earlier message: "meet at 5" now reads "meet at 6"' in t for t in last[:-1])


def _prompt_message(fake: FakeTelegram, chat: dict[str, Any]) -> dict[str, Any]:
    """The bot's approval prompt as Telegram would put it in a callback query."""
    [(message_id, prompt)] = [(i, t) for i, t in fake.texts.items() if "/approve" in t]
    return {"message_id": message_id, "date": 0, "chat": chat, "from": tg.bot_user(), "text": prompt}


async def test_an_approval_button_approves_and_a_press_by_someone_else_is_refused(
    serve: ServeApp, tmp_path: Path
) -> None:
    boss, intruder = tg.user(7001, "boss"), tg.user(7002, "mallory")
    async with FakeOpenAI() as model, FakeTelegram() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        settings = tg_settings(fake, approvers=["7001"])
        async with (
            serve(
                channel_settings={"telegram": settings},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(1, tg.message("write out.txt")))
            [markup] = await fake.wait_for("editMessageReplyMarkup", 1)
            buttons = markup.params["reply_markup"]["inline_keyboard"][0]
            approve = buttons[0]["callback_data"]
            assert approve.startswith("approve:") and buttons[1]["callback_data"].startswith("deny:")
            prompt = _prompt_message(fake, tg.private_chat())
            assert markup.params["message_id"] == str(prompt["message_id"])

            # Someone who may not approve: a private alert, nothing in the chat, nothing run.
            await post_update(client, srv.url, tg.callback_update(2, approve, sender=intruder, on=prompt))
            [refused] = await fake.wait_for("answerCallbackQuery", 1)
            await wait_inbox_done(srv.runtime)
            assert refused.params["callback_query_id"] == "cq2"
            assert refused.params["show_alert"] in (True, "true")
            assert "not allowed" in refused.params["text"]
            assert not (tmp_path / "out.txt").exists()
            assert len(fake.calls_of("sendMessage")) == 1  # only the prompt

            await post_update(client, srv.url, tg.callback_update(3, approve, sender=boss, on=prompt))
            await eventually(lambda: any("Written." == t for t in fake.sent_texts()))
            await fake.wait_for("answerCallbackQuery", 2)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (decided["status"], decided["decided_by"]) == ("approved", "7001")
    assert (tmp_path / "out.txt").read_text() == "hi"
    answered = fake.calls_of("answerCallbackQuery")[1]
    assert answered.params["callback_query_id"] == "cq3"
    assert answered.params.get("show_alert") in (None, False, "false")  # no alert: the chat shows it


async def test_a_check_mark_reaction_approves_and_other_reactions_are_notes_for_the_model(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model, FakeTelegram() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = tg_settings(fake, approvers=["4242"])
        async with (
            serve(
                channel_settings={"telegram": settings},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(1, tg.message("write r.txt")))
            await fake.wait_for("editMessageReplyMarkup", 1)
            # The prompt's Telegram message id is ours once its delivery is stored, a moment
            # after the buttons were put on it: a reaction before that finds no reply of ours
            # (see the stop note of 2026-12-08) and would be dropped.
            await settled_outbox(srv.runtime)
            prompt = _prompt_message(fake, tg.private_chat())
            await post_update(client, srv.url, tg.reaction_update(2, prompt["message_id"], "👍"))
            await eventually(lambda: "Written." in fake.sent_texts())
            await wait_inbox_done(srv.runtime)
            [written] = [i for i, t in fake.texts.items() if t == "Written."]
            await post_update(client, srv.url, tg.reaction_update(3, written, "🔥"))
            await post_update(client, srv.url, tg.update(4, tg.message("thanks")))
            await eventually(lambda: "echo thanks" in fake.sent_texts())
    assert (tmp_path / "r.txt").read_text() == "ok"
    seen = user_texts(model.requests[-1])
    assert seen[-1] == "thanks"
    assert any('reacted with 🔥 to your answer "Written."' in t for t in seen)


async def test_an_approval_prompt_that_ends_a_streamed_preview_gets_its_buttons(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeTelegram() as fake:
        said = "Sure, I will write that file for you right now, give me a moment please."
        model.enqueue(
            calls(ToolCall("write_file", {"path": "s.txt", "content": "s"}), content=said, chunk_delay=0.15),
            text("Written."),
        )
        settings = tg_settings(fake, approvers=["4242"], streaming="edit", stream_edit_seconds=0.1)
        async with (
            serve(
                channel_settings={"telegram": settings},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(1, tg.message("write s.txt")))
            [markup] = await fake.wait_for("editMessageReplyMarkup", 1)
            prompt = _prompt_message(fake, tg.private_chat())
    # The preview became the prompt (its last edit), and the prompt got the buttons.
    assert len(fake.calls_of("sendMessage")) == 1
    assert fake.calls_of("editMessageText")
    assert markup.params["message_id"] == str(prompt["message_id"])


async def test_with_the_rerun_policy_an_edit_of_an_answered_message_is_answered_again(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=echo) as model, FakeTelegram() as fake:
        settings = tg_settings(fake, edit_policy="rerun")
        async with (
            serve(channel_settings={"telegram": settings}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            original = tg.message("translate: cat")
            await post_update(client, srv.url, tg.update(1, original))
            await fake.wait_for("sendMessage", 1)
            await post_update(client, srv.url, tg.edited_update(2, original, "translate: dog"))
            await fake.wait_for("sendMessage", 2)
            await wait_inbox_done(srv.runtime)
            await post_update(client, srv.url, tg.update(3, tg.message("and?")))
            await fake.wait_for("sendMessage", 3)
    assert fake.sent_texts()[:2] == ["echo translate: cat", "echo translate: dog"]
    # The superseded exchange is no longer shown to the model.
    assert user_texts(model.requests[-1]) == ["translate: dog", "and?"]
