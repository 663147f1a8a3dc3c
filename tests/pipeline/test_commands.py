"""Chat commands come from one registry: /help lists it, texts follow the channel's language,
and a command nobody registered is just a message."""

from __future__ import annotations

from app.events import InboundEvent
from app.pipeline.commands import Command, CommandCall, command_word
from tests.conftest import ServeApp, webhook_settings


async def _ask(srv: object, text: str, chat: str = "c") -> list[str]:
    runtime = srv.runtime  # type: ignore[attr-defined]
    event = InboundEvent.from_text("webhook", chat, "u", text)
    await runtime.ingest.submit([event])
    done = await runtime.waiters.wait_for_replies(event.event_id, 20)
    assert done.done
    return [r.text for r in done.replies]


def test_a_command_word_is_its_name_without_the_bot_and_case() -> None:
    assert command_word("/STOP@my_bot  now") == ("/stop", "now")
    assert command_word("  hello /stop") == ("", "hello /stop")


async def test_help_lists_every_registered_command_in_the_channels_language(serve: ServeApp) -> None:
    async with serve() as srv:
        [english] = await _ask(srv, "/help")
        names = [c.name for c in srv.runtime.commands]
    assert {"/help", "/new", "/reset", "/end", "/stop", "/approve", "/deny"} <= set(names)
    assert all(name in english for name in names) and "Start a new conversation" in english
    async with serve(channel_settings={"webhook": webhook_settings(locale="zh")}) as srv:
        [chinese] = await _ask(srv, "/help")
        [started] = await _ask(srv, "/new")
    assert "开始新的对话" in chinese and started == "已开始新的对话。"


async def test_an_unknown_command_is_a_message_for_the_model(serve: ServeApp) -> None:
    async with serve() as srv:
        [answer] = await _ask(srv, "/frobnicate now")
    assert answer and answer != "Nothing is running."


async def test_a_registered_command_runs_once_with_its_arguments_and_others_are_refused(
    serve: ServeApp,
) -> None:
    calls: list[tuple[str, str]] = []

    async def ping(call: CommandCall) -> None:
        calls.append((call.event.sender_id, call.args))
        await srv.runtime.replies.answer(call.lease, call.row, f"you are {call.event.sender_id}")

    async with serve() as srv:
        srv.runtime.commands.add(
            Command(
                "/ping",
                {"en": "Who you are to the bot."},
                ping,
                allowed=lambda event: event.sender_id == "u",
            )
        )
        assert await _ask(srv, "/ping please") == ["you are u"]
        refused = InboundEvent.from_text("webhook", "c", "stranger", "/ping")
        await srv.runtime.ingest.submit([refused])
        done = await srv.runtime.waiters.wait_for_replies(refused.event_id, 20)
        [help_text] = await _ask(srv, "/help")
    assert calls == [("u", "please")]
    assert [r.text for r in done.replies] == ["You are not allowed to use /ping here."]
    assert "/ping — Who you are to the bot." in help_text
