"""The Matrix tests' homeserver: one real Synapse per test session (start-up takes seconds),
fresh bot and human accounts per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from tests.channels.matrix.support import MatrixAccounts
from tests.support.synapse import MatrixUser, Synapse


@pytest.fixture(scope="session")
def synapse() -> Iterator[Synapse]:
    server = Synapse().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def matrix(synapse: Synapse) -> AsyncIterator[MatrixAccounts]:
    bot_id, bot_token = synapse.register("bot")
    human_id, human_token = synapse.register("human")
    human = MatrixUser(synapse.url, human_id, human_token)
    try:
        yield MatrixAccounts(synapse, bot_id, bot_token, human)
    finally:
        await human.aclose()
