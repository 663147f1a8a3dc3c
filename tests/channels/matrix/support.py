"""Helpers of the Matrix tests: settings pointing at the test homeserver, waiting on rooms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from app.db.models import connection_leases
from channels.matrix import MatrixSettings
from tests.support.synapse import MatrixUser, Synapse, final_texts
from tests.support.timing import eventually


@dataclass
class MatrixAccounts:
    synapse: Synapse
    bot_id: str
    bot_token: str
    human: MatrixUser

    def settings(self, **overrides: Any) -> MatrixSettings:
        values: dict[str, Any] = dict(
            homeserver_url=self.synapse.url,
            access_token=self.bot_token,
            sync_timeout_seconds=5.0,
            sync_retry_seconds=0.2,
            stream_edit_seconds=0.3,
        )
        values.update(overrides)
        return MatrixSettings(_env_file=None, **values)  # type: ignore[call-arg]

    async def room_with_bot(self, *, encrypted: bool = False) -> str:
        """A room the human created and the bot joined (its invitation accepted)."""
        room = await self.human.create_room([self.bot_id], encrypted=encrypted)
        await eventually(
            lambda: self._joined(room), timeout=20, message="the bot did not accept the invitation"
        )
        return room

    async def _joined(self, room: str) -> bool:
        return self.bot_id in await self.human.members(room)

    async def answers(self, room: str) -> list[str]:
        """The bot's messages in the room, as their last edit shows them."""
        return [m["content"].get("body", "") for m in final_texts(await self.human.events(room), self.bot_id)]

    async def wait_answers(self, room: str, count: int, timeout: float = 30) -> list[str]:
        async def enough() -> bool:
            return len(await self.answers(room)) >= count

        await eventually(enough, timeout=timeout, message=f"fewer than {count} answers")
        return await self.answers(room)


async def saved_next_batch(engine: Any) -> str | None:
    """The `next_batch` the sync's holder saved in its lease row."""
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(connection_leases.c.state).where(connection_leases.c.name.like("matrix:%"))
            )
        ).all()
    for (state,) in rows:
        if isinstance(state, dict) and state.get("next_batch"):
            return str(state["next_batch"])
    return None


async def wait_synced(engine: Any) -> str:
    """Wait until the bot's first sync saved its token (it then sees what happens next)."""
    found: list[str] = []

    async def saved() -> bool:
        token = await saved_next_batch(engine)
        if token:
            found.append(token)
        return bool(token)

    await eventually(saved, timeout=20, message="the bot never synced")
    return found[-1]
