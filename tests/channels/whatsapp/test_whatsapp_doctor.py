"""`chatgate doctor` asks the Graph API about the configured number, against the fake."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.test_doctor_live import _doctor
from tests.fakes.whatsapp import GraphAPI

pytestmark = pytest.mark.slow

TOKEN = "EAAG-doctor-token"
PHONE = "106540352242922"


async def test_doctor_checks_the_whatsapp_token_live(tmp_path: Path) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        env = {
            "CHANNELS": "whatsapp",
            "WHATSAPP_GRAPH_BASE_URL": graph.url,
            "WHATSAPP_APP_SECRET": "s" * 32,
            "WHATSAPP_VERIFY_TOKEN": "v" * 20,
            "WHATSAPP_PHONE_NUMBER_ID": PHONE,
        }
        code, lines = await _doctor(tmp_path, WHATSAPP_ACCESS_TOKEN="EAAG-wrong", **env)
        assert code == 1
        assert any(line.startswith("FAIL  channel whatsapp: Graph API refused: 401") for line in lines), lines
        assert not any("EAAG-wrong" in line for line in lines)  # the token is never echoed

        code, lines = await _doctor(tmp_path, WHATSAPP_ACCESS_TOKEN=TOKEN, **env)
        assert code == 0, lines
        assert (
            "ok    channel whatsapp: credentials accepted (number +1 555-000-1111 (Chatgate Test))" in lines
        )

        code, lines = await _doctor(tmp_path, WHATSAPP_ACCESS_TOKEN="", **env)
        assert code == 1
        assert "FAIL  channel whatsapp: unset: WHATSAPP_ACCESS_TOKEN" in lines
