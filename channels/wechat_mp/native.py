"""The Official Account's platform-native events (docs/events.md): follows and unfollows.

`subscribe` (a user follows the account; from a parameterised QR code `EventKey` is
`qrscene_<scene>`) becomes `joined`, `unsubscribe` becomes `left`, each in the user's
one-to-one session (an Official Account has no groups: the chat is the follower).
WeChat gives no display name (user/info stopped returning nicknames), so `{name}` is the
OpenID. A follow opens the 48-hour customer-service window, so `WECHAT_MP_WELCOME_TEXT`
is delivered by `message/custom/send`; a user who unfollowed cannot be sent anything
(errcode 43004), so `WECHAT_MP_FAREWELL_TEXT` is refused by the settings.
"""

from __future__ import annotations

from typing import Any

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope
from channels.common.wechat_xml import WeChatMessage

CHANNEL = "wechat-mp"
_KINDS = {"subscribe": NativeKind.JOINED, "unsubscribe": NativeKind.LEFT}


def follow_event(message: WeChatMessage, *, scope: SessionScope, account: str) -> InboundEvent | None:
    """The `joined` / `left` of a `subscribe` / `unsubscribe` event; None for anything else."""
    kind = _KINDS.get((message.event or "").lower())
    if kind is None:
        return None
    metadata: dict[str, Any] = {**message.metadata(), "account": account}
    scene = message.fields.get("EventKey", "")
    if kind is NativeKind.JOINED and scene.startswith("qrscene_"):
        metadata["qr_scene"] = scene[len("qrscene_") :]
    return InboundEvent.native(
        NativeEvent(kind=kind, name=message.from_user),
        channel=CHANNEL,
        chat_id=message.from_user,
        sender_id=message.from_user,
        chat_type=ChatType.DIRECT,
        external_id=message.dedup_id(),  # WeChat's retries: OpenID + CreateTime + event
        session_scope=scope,
        metadata=metadata,
    )
