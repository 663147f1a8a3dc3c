"""Settings of the personal WeChat channel (`WEIXIN_…`), Tencent's iLink bot API."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings

# The defaults of Tencent's own client (`@tencent-weixin/openclaw-weixin`, auth/accounts.ts).
DEFAULT_API_BASE = "https://ilinkai.weixin.qq.com"
DEFAULT_CDN_BASE = "https://novac2c.cdn.weixin.qq.com/c2c"


class WeixinSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="WEIXIN_", env_file=".env", extra="ignore")
    # Bot messages cannot be edited; `native` is iLink's typing status while a turn runs.
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset({StreamingMode.OFF, StreamingMode.NATIVE})
    streaming: StreamingMode = Field(
        StreamingMode.NATIVE,
        description="native (the typing status while a turn runs, then the answer) or off (no typing). "
        "iLink messages cannot be edited, so there is no edit mode.",
    )

    bot_token: str | None = Field(
        None,
        description="iLink bot token; unset: the one `chatgate channels weixin login` stored in the "
        "database (the usual way: scan a QR code with WeChat).",
    )
    account: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Name of the logged-in account (the login record and the connection lease).",
    )
    api_base_url: str = Field(
        DEFAULT_API_BASE, description="iLink API base URL (a login may move an account to another)."
    )
    cdn_base_url: str = Field(
        DEFAULT_CDN_BASE,
        description="WeChat CDN base URL for media (operator-set: never taken from a message).",
    )
    bot_type: str = Field("3", description="bot_type of get_bot_qrcode (Tencent's client sends 3).")
    app_id: str = Field("bot", description="iLink-App-Id header (Tencent's client: `bot`).")
    client_version: str = Field(
        "2.4.9", description="Version sent as iLink-App-ClientVersion (0x00MMNNPP) and channel_version."
    )
    bot_agent: str = Field("chatgate/1.0", description="base_info.bot_agent (observability only).")
    max_message_chars: int = Field(
        4000, ge=16, le=4000, description="Longer replies are split (Tencent's client: 4000)."
    )
    poll_timeout_seconds: float = Field(
        35.0, gt=0, description="Client timeout of the getupdates long poll (the server may ask for another)."
    )
    poll_retry_seconds: float = Field(2.0, ge=0, description="Wait after a failed getupdates.")
    poll_backoff_seconds: float = Field(30.0, ge=0, description="Wait after three failures in a row.")
    expired_check_seconds: float = Field(
        30.0,
        gt=0,
        description="While the session is expired (errcode -14), how often the stored login is "
        "checked for a new token (polling is paused until a new QR login).",
    )
    request_timeout_seconds: float = Field(15.0, gt=0, description="Timeout of other API calls.")
    login_timeout_seconds: float = Field(480.0, gt=0, description="How long a QR login waits for a scan.")
    # iLink carries no mention data: a group message it delivers is already one for the bot.
    require_mention_in_groups: bool = Field(
        False, description="iLink has no mention field; messages it delivers are for the bot."
    )
