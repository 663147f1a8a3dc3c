"""`/link` and `/unlink`: people link their own identities on two platforms.

`/link` in a direct chat answers a one-time code (valid `CODE_SECONDS`; only its hash is
stored, table `link_codes`). Sending `/link CODE` from another identity, also in a direct
chat, links both to one person (`app.memory.identity.IdentityLinks`, the same links the
CLI and the admin API make and list): the person of whichever is linked already, else a
new one. The code works once. `/unlink` removes the sender's own identity from its
person. Codes are refused in groups, where someone else could read and claim them.
Tries with a code are limited per sender (`LINK_ATTEMPTS` per `LINK_ATTEMPT_WINDOW`
seconds, counted on every replica): a code cannot be guessed by trying many.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

import structlog
from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.attempts import Attempts
from app.db.models import link_codes, utcnow
from app.events import ChatType
from app.memory.identity import IdentityLinks, identity_of, is_person
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies
from app.pipeline.texts import say

log = structlog.get_logger(__name__)

CODE_SECONDS = 600
_ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"  # no 0/O, 1/I
CODE_LENGTH = 8
LINK_ATTEMPTS = 5
LINK_ATTEMPT_WINDOW = 900


def code_hash(code: str) -> str:
    return hashlib.sha256(code.strip().upper().encode()).hexdigest()


class LinkCommands:
    def __init__(self, replies: Replies, engine: AsyncEngine) -> None:
        self.replies = replies
        self.engine = engine
        self.links = IdentityLinks(engine)
        self.attempts = Attempts(
            engine, "link_attempts", limit=LINK_ATTEMPTS, window_seconds=LINK_ATTEMPT_WINDOW
        )

    def commands(self) -> list[Command]:
        return [
            Command(
                "/link",
                {
                    "en": "Link this account with your account on another platform.",
                    "zh": "将此账号与你在其他平台上的账号关联。",
                },
                self.link,
                usage="[CODE]",
            ),
            Command(
                "/unlink",
                {"en": "Undo the link of this account.", "zh": "取消此账号的关联。"},
                self.unlink,
            ),
        ]

    async def _reply(self, call: CommandCall, text: str) -> None:
        await self.replies.answer(call.lease, call.row, text)

    async def link(self, call: CommandCall) -> None:
        event = call.event
        if event.chat_type is not ChatType.DIRECT or not is_person(event.channel):
            await self._reply(call, say("link.direct_only", call.locale))
            return
        me = identity_of(event.channel, event.sender_id)
        code = call.args.strip()
        if not code:
            await self._reply(call, await self._new_code(me, call.locale))
            return
        if not await self.attempts.allow(me):
            log.info("link_attempts_exceeded", identity=me)
            await self._reply(call, say("link.too_many", call.locale, minutes=LINK_ATTEMPT_WINDOW // 60))
            return
        now = utcnow()
        async with self.engine.begin() as conn:
            # One statement claims the code: it works once, and only before it expires.
            claimed = await conn.execute(
                delete(link_codes)
                .where(link_codes.c.code_hash == code_hash(code), link_codes.c.expires_at > now)
                .returning(link_codes.c.identity)
            )
            other = claimed.scalar_one_or_none()
        if other is None:
            await self._reply(call, say("link.bad_code", call.locale))
            return
        if other == me:
            await self._reply(call, say("link.same", call.locale))
            return
        person = await self._person_of(other) or await self._person_of(me) or f"p-{secrets.token_hex(6)}"
        for identity in (other, me):
            await self.links.link(identity, person, created_by="link-code")
        log.info("identities_linked", person=person)
        await self._reply(call, say("link.done", call.locale))

    async def _new_code(self, identity: str, locale: str) -> str:
        code = "".join(secrets.choice(_ALPHABET) for _ in range(CODE_LENGTH))
        now = utcnow()
        async with self.engine.begin() as conn:
            await conn.execute(delete(link_codes).where(link_codes.c.expires_at <= now))
            await conn.execute(
                insert(link_codes).values(
                    code_hash=code_hash(code),
                    identity=identity,
                    created_at=now,
                    expires_at=now + timedelta(seconds=CODE_SECONDS),
                )
            )
        return say("link.code", locale, code=code, minutes=CODE_SECONDS // 60)

    async def _person_of(self, identity: str) -> str | None:
        found = await self.links.links(identity=identity)
        return found[0].person_id if found else None

    async def unlink(self, call: CommandCall) -> None:
        event = call.event
        removed = await self.links.unlink(identity_of(event.channel, event.sender_id))
        await self._reply(call, say("unlink.done" if removed else "unlink.none", call.locale))
