"""Update payloads as Telegram sends them (Bot API object shapes), for `tests.fakes.telegram`."""

from __future__ import annotations

import itertools
import time
from typing import Any

BOT_ID = 777000111
BOT_USERNAME = "gate_bot"
TOKEN = "777000111:TEST-token_abc"


# --- update payloads ------------------------------------------------------------------

_message_ids = itertools.count(1)


def user(user_id: int = 4242, username: str | None = "alice") -> dict[str, Any]:
    data: dict[str, Any] = {"id": user_id, "is_bot": False, "first_name": "Alice"}
    if username:
        data["username"] = username
    return data


def bot_user() -> dict[str, Any]:
    return {"id": BOT_ID, "is_bot": True, "first_name": "Gate", "username": BOT_USERNAME}


def private_chat(chat_id: int = 4242) -> dict[str, Any]:
    return {"id": chat_id, "type": "private", "first_name": "Alice"}


def group_chat(chat_id: int = -1001234, forum: bool = False) -> dict[str, Any]:
    data: dict[str, Any] = {"id": chat_id, "type": "supergroup", "title": "Team"}
    if forum:
        data["is_forum"] = True
    return data


def message(
    text: str | None,
    *,
    chat: dict[str, Any] | None = None,
    sender: dict[str, Any] | None = None,
    entities: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "message_id": next(_message_ids),
        "date": int(time.time()),
        "chat": chat or private_chat(),
        "from": sender or user(),
    }
    if text is not None:
        data["text"] = text
    if entities:
        data["entities"] = entities
    data.update(extra)
    return data


def mention_entity(text: str, handle: str = f"@{BOT_USERNAME}") -> dict[str, Any]:
    """A `mention` entity for `handle` inside `text` (offsets in UTF-16 units, as Telegram sends)."""
    offset = len(text[: text.index(handle)].encode("utf-16-le")) // 2
    return {"type": "mention", "offset": offset, "length": len(handle.encode("utf-16-le")) // 2}


def update(update_id: int, msg: dict[str, Any]) -> dict[str, Any]:
    return {"update_id": update_id, "message": msg}


def edited_update(update_id: int, msg: dict[str, Any], text: str) -> dict[str, Any]:
    """`msg` edited to read `text` (same message_id, with an edit_date)."""
    return {"update_id": update_id, "edited_message": {**msg, "text": text, "edit_date": int(time.time())}}


def callback_update(
    update_id: int, data: str, *, sender: dict[str, Any] | None = None, on: dict[str, Any]
) -> dict[str, Any]:
    """A press on an inline keyboard button with `data`, on the bot's message `on`."""
    return {
        "update_id": update_id,
        "callback_query": {
            "id": f"cq{update_id}",
            "from": sender or user(),
            "chat_instance": "ci1",
            "data": data,
            "message": on,
        },
    }


def reaction_update(
    update_id: int,
    message_id: int,
    emoji: str,
    *,
    chat: dict[str, Any] | None = None,
    sender: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `message_reaction` update: `sender` now reacts with `emoji` (and nothing else) to the message."""
    return {
        "update_id": update_id,
        "message_reaction": {
            "chat": chat or private_chat(),
            "message_id": message_id,
            "user": sender or user(),
            "date": int(time.time()),
            "old_reaction": [],
            "new_reaction": [{"type": "emoji", "emoji": emoji}],
        },
    }


def chat_member_update(
    update_id: int,
    member: dict[str, Any],
    old: str,
    new: str,
    *,
    chat: dict[str, Any] | None = None,
    by: dict[str, Any] | None = None,
    date: int | None = None,
    my: bool = False,
) -> dict[str, Any]:
    """A `chat_member` update (or, `my`, `my_chat_member`): `member`'s status went from
    `old` to `new` (member, administrator, left, kicked …), changed by `by` (the member)."""

    def status(name: str) -> dict[str, Any]:
        data: dict[str, Any] = {"status": name, "user": member}
        if name == "kicked":
            data["until_date"] = 0
        if name == "administrator":
            rights = (
                "can_be_edited can_manage_chat can_delete_messages can_manage_video_chats "
                "can_restrict_members can_promote_members can_change_info can_invite_users "
                "can_post_stories can_edit_stories can_delete_stories is_anonymous"
            )
            data.update(dict.fromkeys(rights.split(), False))
        return data

    return {
        "update_id": update_id,
        "my_chat_member" if my else "chat_member": {
            "chat": chat or group_chat(),
            "from": by or member,
            "date": date if date is not None else int(time.time()),
            "old_chat_member": status(old),
            "new_chat_member": status(new),
        },
    }


def members_message(
    update_id: int,
    *,
    joined: list[dict[str, Any]] | None = None,
    left: dict[str, Any] | None = None,
    chat: dict[str, Any] | None = None,
    by: dict[str, Any] | None = None,
    date: int | None = None,
) -> dict[str, Any]:
    """A `new_chat_members` (or `left_chat_member`) service message in a group."""
    members = joined or ([left] if left is not None else [])
    extra: dict[str, Any] = {"new_chat_members": joined} if joined else {"left_chat_member": left}
    msg = message(None, chat=chat or group_chat(), sender=by or members[0], **extra)
    if date is not None:
        msg["date"] = date
    return update(update_id, msg)
