"""`<CHANNEL>_STREAMING`: each channel accepts the modes it implements and refuses the others clearly."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.streaming.protocol import StreamingMode
from channels.discord import DiscordSettings
from channels.feishu import FeishuSettings
from channels.slack import SlackSettings
from channels.telegram import TelegramSettings


@pytest.mark.parametrize("settings_class", [SlackSettings, TelegramSettings, FeishuSettings])
def test_slack_telegram_and_feishu_stream_natively(settings_class: type) -> None:
    for mode in StreamingMode:
        assert settings_class(_env_file=None, streaming=mode.value).streaming is mode


def test_native_is_refused_where_it_is_not_implemented() -> None:
    with pytest.raises(ValidationError, match="'native' is not implemented for this channel; use edit, off"):
        DiscordSettings(_env_file=None, streaming="native")


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValidationError, match="streaming"):
        SlackSettings(_env_file=None, streaming="stream")  # type: ignore[call-arg]
