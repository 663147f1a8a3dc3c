"""`chatgate doctor`'s live check of the LINE channel access token (`GET /v2/bot/info`)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.probe import CredentialsRejected
from channels.line.probe import probe
from channels.line.settings import LineSettings
from tests.app.test_doctor_live import _doctor
from tests.fakes.line import ACCESS_TOKEN, SECRET, FakeLine


def _settings(fake: FakeLine, token: str | None) -> LineSettings:
    return LineSettings(  # type: ignore[call-arg]
        _env_file=None, channel_secret=SECRET, channel_access_token=token, api_base_url=fake.url
    )


async def test_the_probe_names_the_bot_and_refuses_a_wrong_token() -> None:
    async with FakeLine() as fake, httpx.AsyncClient(timeout=10) as client:
        assert await probe(_settings(fake, ACCESS_TOKEN), client) == "bot gate (@123abcde)"
        with pytest.raises(CredentialsRejected, match="refused the channel access token") as wrong:
            await probe(_settings(fake, "wrong-token"), client)
        assert "wrong-token" not in str(wrong.value)  # a secret is never part of the message
        with pytest.raises(CredentialsRejected, match="LINE_CHANNEL_ACCESS_TOKEN unset"):
            await probe(_settings(fake, None), client)
    assert fake.refused == [("/v2/bot/info", 401)]


@pytest.mark.slow
async def test_chatgate_doctor_checks_the_line_token_live(tmp_path: Path) -> None:
    async with FakeLine() as fake:
        env = {"CHANNELS": "line", "LINE_API_BASE_URL": fake.url, "LINE_CHANNEL_SECRET": SECRET}
        code, lines = await _doctor(tmp_path, LINE_CHANNEL_ACCESS_TOKEN="wrong-token", **env)
        assert code == 1
        assert "FAIL  channel line: GET /v2/bot/info refused the channel access token (401)" in lines
        assert not any("wrong-token" in line for line in lines)
        code, lines = await _doctor(tmp_path, LINE_CHANNEL_ACCESS_TOKEN=ACCESS_TOKEN, **env)
        assert code == 0, lines
        assert "ok    channel line: credentials accepted (bot gate (@123abcde))" in lines
