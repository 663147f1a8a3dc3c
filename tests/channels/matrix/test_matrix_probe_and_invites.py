"""`chatgate doctor`'s live check of the bot's token (`whoami`), and the invitation policy,
against the real homeserver."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.probe import CredentialsRejected
from channels.matrix import MatrixChannel
from channels.matrix.probe import probe
from tests.app.test_doctor_live import _doctor
from tests.channels.matrix.support import MatrixAccounts
from tests.channels.support import send_only_context
from tests.support.timing import eventually

# One Synapse per test worker: keep these tests on one worker (scripts/test.sh, loadgroup).
pytestmark = pytest.mark.xdist_group("synapse")


async def test_the_probe_names_the_bot_and_refuses_a_wrong_token(matrix: MatrixAccounts) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        found = await probe(matrix.settings(), client)
        assert found.startswith(f"bot {matrix.bot_id} (device ")
        with pytest.raises(
            CredentialsRejected, match="refused the access token \\(401 M_UNKNOWN_TOKEN\\)"
        ) as wrong:
            await probe(matrix.settings(access_token="syt_wrong"), client)
        assert "syt_wrong" not in str(wrong.value)  # a secret is never part of the message
        with pytest.raises(CredentialsRejected, match="MATRIX_ACCESS_TOKEN unset"):
            await probe(matrix.settings(access_token=None), client)


@pytest.mark.slow
async def test_chatgate_doctor_checks_the_matrix_token_live(tmp_path: Path, matrix: MatrixAccounts) -> None:
    env = {"CHANNELS": "matrix", "MATRIX_HOMESERVER_URL": matrix.synapse.url}
    # (A refused token: the probe test above; one doctor run here keeps the suite fast.)
    code, lines = await _doctor(tmp_path, MATRIX_ACCESS_TOKEN=matrix.bot_token, **env)
    assert code == 0, lines
    assert any(
        line.startswith(f"ok    channel matrix: credentials accepted (bot {matrix.bot_id}") for line in lines
    )


async def _membership(matrix: MatrixAccounts, room: str) -> str | None:
    for event in reversed(await matrix.human.events(room)):
        if event["type"] == "m.room.member" and event.get("state_key") == matrix.bot_id:
            return str(event["content"]["membership"])
    return None


@pytest.mark.parametrize(
    ("policy", "allowed", "membership"),
    [("none", "", "leave"), ("allowed", "@someone:localhost", "leave"), ("allowed", "human", "join")],
)
async def test_invitations_follow_the_policy(
    matrix: MatrixAccounts, policy: str, allowed: str, membership: str
) -> None:
    senders = [matrix.human.user_id] if allowed == "human" else [allowed] if allowed else []
    settings = matrix.settings(invites=policy, allowed_senders=senders)
    async with httpx.AsyncClient(timeout=30) as http:
        channel = MatrixChannel(settings, send_only_context(http))
        await channel.start()
        try:
            await eventually(lambda: channel.user_id is not None, timeout=10)
            room = await matrix.human.create_room([matrix.bot_id])

            async def decided() -> bool:
                return await _membership(matrix, room) == membership

            await eventually(
                decided, timeout=20, message=f"the invitation was not answered with {membership}"
            )
        finally:
            await channel.stop()


async def test_a_refused_token_is_the_channels_problem(matrix: MatrixAccounts) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        channel = MatrixChannel(matrix.settings(access_token="syt_wrong"), send_only_context(http))
        await channel.start()
        try:

            async def said() -> bool:
                return "M_UNKNOWN_TOKEN" in (await channel.problem() or "")

            await eventually(said, timeout=10, message="the refused token was not reported")
            assert "syt_wrong" not in (await channel.problem() or "")
        finally:
            await channel.stop()
