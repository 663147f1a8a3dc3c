"""Discord payloads → events: scopes, threads, mention gating, bots ignored."""

from __future__ import annotations

from app.events import ChatType, SessionScope
from channels.discord.parse import parse_command, parse_message
from tests.channels.discord.support import command
from tests.fakes import discord as dc


def _settings(**overrides: object):  # type: ignore[no-untyped-def]
    from channels.discord import DiscordSettings

    return DiscordSettings(_env_file=None, **overrides)  # type: ignore[arg-type]


def test_thread_message_uses_the_thread_scope_and_strips_the_mention() -> None:
    data = dc.message(f"<@{dc.BOT_ID}> hi", channel_id="7001", guild_id="9000", mentions=[dc.BOT_ID])
    parsed = parse_message(data, _settings(session_scope="thread"), dc.BOT_ID, parent_id="2000")
    assert parsed.event is not None
    assert parsed.event.session_key == "discord:2000:7001"
    assert parsed.event.text == "hi"
    assert parsed.event.chat_type is ChatType.GROUP
    assert parsed.event.metadata["reply_channel_id"] == "7001"  # the reply goes into the thread


def test_bots_and_unmentioned_guild_messages_are_ignored() -> None:
    bot = dc.message("loop", author_id=dc.BOT_ID)
    assert parse_message(bot, _settings(), dc.BOT_ID).ignored == "message from a bot"
    chatter = dc.message("chatter", guild_id="9000")
    assert parse_message(chatter, _settings(), dc.BOT_ID).event is None
    relaxed = parse_message(chatter, _settings(require_mention_in_groups=False), dc.BOT_ID)
    assert relaxed.event is not None and relaxed.event.external_id == f"message:{chatter['id']}"


def test_a_command_in_a_thread_and_in_a_dm() -> None:
    in_thread = command("reset", channel_id="7001")
    in_thread["channel"] = {"id": "7001", "type": 11, "parent_id": "2000"}
    event = parse_command(in_thread, _settings(session_scope=SessionScope.THREAD))
    assert (event.session_key, event.text, event.sender_id) == ("discord:2000:7001", "/reset", "3000")
    dm = parse_command(command("stop", guild_id=None), _settings())
    assert dm.chat_type is ChatType.DIRECT and dm.metadata["reply_interaction_token"] == "itoken-5000"
