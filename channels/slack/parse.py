"""Slack Events API payloads → `InboundEvent`s: DMs, mentions, threads, files; bots ignored."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidPayload
from app.events import (
    MESSAGE_REF_KEY,
    ChatType,
    FilePart,
    ImagePart,
    InboundEvent,
    MentionPart,
    Part,
    TextPart,
)
from channels.slack.native import parse_native
from channels.slack.settings import SlackSettings

CHANNEL = "slack"
# Message subtypes that are a person saying something; everything else (edits, deletes,
# joins, bot_message …) is not a turn.
_USER_SUBTYPES = {None, "file_share", "thread_broadcast"}


@dataclass(frozen=True)
class Parsed:
    event: InboundEvent | None = None
    ignored: str | None = None


def parse_event_callback(payload: dict[str, Any], settings: SlackSettings, bot_user_id: str | None) -> Parsed:
    event = payload.get("event")
    event_id = payload.get("event_id")
    if not isinstance(event, dict) or not isinstance(event_id, str):
        raise InvalidPayload("event_callback needs an event object and an event_id")
    kind = event.get("type")
    native = parse_native(payload, event, settings.session_scope, bot_user_id)
    if native is not None:  # reactions, edits, deletions (docs/events.md)
        return Parsed(event=native)
    if kind not in ("message", "app_mention"):
        return Parsed(ignored=f"event type {kind}")
    if event.get("bot_id") or event.get("subtype") not in _USER_SUBTYPES:
        return Parsed(ignored="bot message or not a new user message")
    sender = event.get("user")
    channel = event.get("channel")
    ts = event.get("ts")
    if not isinstance(sender, str) or not isinstance(channel, str) or not isinstance(ts, str):
        return Parsed(ignored="no user, channel or ts")
    if bot_user_id is not None and sender == bot_user_id:
        return Parsed(ignored="our own message")

    channel_type = event.get("channel_type")
    direct = channel_type == "im" or (channel_type is None and channel.startswith("D"))
    chat_type = ChatType.DIRECT if direct else ChatType.GROUP
    text = str(event.get("text") or "")
    self_tag = f"<@{bot_user_id}>" if bot_user_id else None
    mentioned = kind == "app_mention" or bool(self_tag and self_tag in text)
    if chat_type is ChatType.GROUP and settings.require_mention_in_groups and not mentioned:
        return Parsed(ignored="channel message without a mention of the bot")

    parts: list[Part] = []
    clean = _strip_mention(text, self_tag) if self_tag else text
    if clean:
        parts.append(TextPart(text=clean))
    if mentioned and bot_user_id:
        parts.append(MentionPart(user_id=bot_user_id, is_self=True))
    parts += _file_parts(event.get("files"))
    if not parts:
        return Parsed(ignored="no text or files")

    thread_ts = event.get("thread_ts")
    if isinstance(thread_ts, str) and thread_ts:
        thread_id: str | None = thread_ts
    elif chat_type is ChatType.GROUP and settings.reply_in_thread:
        thread_id = ts  # the answer opens a thread under this message
    else:
        thread_id = None
    return Parsed(
        event=InboundEvent(
            channel=CHANNEL,
            chat_id=channel,
            sender_id=sender,
            thread_id=thread_id,
            chat_type=chat_type,
            parts=tuple(parts),
            # One Slack message, whichever events announce it: a retry repeats the
            # event_id, and a mention arrives as both `app_mention` and `message` with
            # different event_ids but the same channel and ts.
            external_id=f"{channel}:{ts}",
            session_scope=settings.session_scope,
            metadata={
                "slack_event_id": event_id,
                "slack_ts": ts,
                MESSAGE_REF_KEY: ts,  # an edit, deletion or reaction of it finds its event
                "team_id": payload.get("team_id"),
                # Copied onto the reply (`reply_*`): native streaming names its recipient and
                # answers under the user's message (`channels.slack.native_stream`).
                "reply_slack_ts": ts,
                "reply_slack_user": sender,
                "reply_slack_team": payload.get("team_id"),
            },
        )
    )


def _strip_mention(text: str, tag: str) -> str:
    return re.sub(r"\s{2,}", " ", text.replace(tag, "")).strip()


def _file_parts(files: Any) -> list[Part]:
    parts: list[Part] = []
    if not isinstance(files, list):
        return parts
    for item in files:
        if not isinstance(item, dict):
            continue
        mime = _audio_clip_mime(item) or item.get("mimetype")
        url = item.get("url_private")
        if isinstance(mime, str) and mime.startswith("image/"):
            parts.append(ImagePart(url=url, mime_type=mime))
        else:
            size = item.get("size")
            parts.append(
                FilePart(
                    url=url,
                    name=item.get("name"),
                    mime_type=mime,
                    size=size if isinstance(size, int) else None,
                )
            )
    return parts


def _audio_clip_mime(item: dict[str, Any]) -> str | None:
    """An audio clip recorded in Slack (`subtype` `slack_audio`, shown as audio) may carry a
    video mimetype (`video/mp4`); it is audio, so speech to text applies."""
    mime = item.get("mimetype")
    if item.get("subtype") != "slack_audio" and item.get("media_display_type") != "audio":
        return None
    if not isinstance(mime, str) or mime.startswith("audio/"):
        return None
    container = mime.partition("/")[2]
    return f"audio/{container or 'mp4'}"
