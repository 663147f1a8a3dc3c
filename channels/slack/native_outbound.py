"""What Slack sends for platform-native events (docs/events.md), beside plain replies.

- a deletion (`DELETE_KEY`, our answer to a deleted message): `chat.delete`;
- a private notice (`PRIVATE_NOTICE_KEY`, e.g. a refused approval): `chat.postEphemeral`
  to the member who pressed or reacted, nothing anyone else sees;
- an approval prompt (`APPROVAL_KEY`): posted with approve/deny buttons (blocks).
"""

from __future__ import annotations

import structlog

from app.channel import SendResult
from app.errors import ChannelRejected
from app.events import APPROVAL_KEY, DELETE_KEY, PRIVATE_NOTICE_KEY, OutboundMessage
from channels.slack.native import approval_blocks
from channels.slack.outbound import SlackOutbound

log = structlog.get_logger(__name__)


async def send_native(outbound: SlackOutbound, message: OutboundMessage, locale: str) -> SendResult | None:
    """Send what is no plain reply; None when `message` is a plain reply."""
    metadata = message.metadata
    if DELETE_KEY in metadata:
        try:
            await outbound.call("chat_delete", channel=message.chat_id, ts=str(metadata[DELETE_KEY]))
        except ChannelRejected as exc:  # already deleted: nothing to retry
            log.info("slack_delete_refused", detail=str(exc))
        return SendResult()
    user = metadata.get("reply_slack_user")
    if metadata.get(PRIVATE_NOTICE_KEY) and user:
        await outbound.call(
            "chat_postEphemeral",
            channel=message.chat_id,
            user=str(user),
            text=message.text,
            thread_ts=message.thread_id,
        )
        return SendResult()
    if APPROVAL_KEY in metadata and message.text:

        async def post(_index: int, text: str) -> str | None:
            blocks = approval_blocks(text, metadata[APPROVAL_KEY], locale)
            resp = await outbound.call(
                "chat_postMessage",
                channel=message.chat_id,
                text=text,
                thread_ts=message.thread_id,
                blocks=blocks,
            )
            ts = resp.get("ts")
            return str(ts) if ts else None

        [ts] = await outbound.steps(message.message_id, [message.text], post)
        return SendResult(platform_message_id=ts)
    return None


async def add_approval_buttons(
    outbound: SlackOutbound, message: OutboundMessage, result: SendResult, locale: str
) -> None:
    """Put approve/deny buttons on an approval prompt delivered as a preview's last edit."""
    ts = result.platform_message_id
    if APPROVAL_KEY not in message.metadata or not ts:
        return
    blocks = approval_blocks(message.text, message.metadata[APPROVAL_KEY], locale)
    try:
        await outbound.call("chat_update", channel=message.chat_id, ts=ts, text=message.text, blocks=blocks)
    except Exception as exc:  # the prompt is there; `/approve <id>` works without buttons
        log.warning("slack_approval_buttons_failed", error=repr(exc))
