"""Handling a key's next events under its lease: a command, or a turn of the agent.

The busy policy of the events' channel says which rows form the turn (`collect` merges a
burst). Before anything runs, its attempt is counted and committed (a command's by a
statement of its own, a turn's by the commit that starts it, or by one of its own if that
start fails), so an event that fails for any reason, even one that kills the process, is
tried at most `max_attempts` times: then it is failed with its last error, its sender is
told where the channel can carry a reply, and the key's next events run.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from app import tracing
from app.access.roles import Role, Roles
from app.channel import ChannelSettings
from app.errors import LeaseLost
from app.pipeline.busy import BusyPolicies
from app.pipeline.commands import Command, CommandCall, CommandRegistry, required_role
from app.pipeline.platform_events import PlatformEvents
from app.pipeline.replies import Replies, reply_for
from app.pipeline.storage.port import InboxRow, PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import Handled, HandOn
from app.sessions.lease import SessionLease

log = structlog.get_logger(__name__)


class Handler:
    def __init__(
        self,
        store: PipelineStore,
        commands: CommandRegistry,
        turns: TurnRunner,
        policies: BusyPolicies,
        replies: Replies,
        *,
        max_attempts: int,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        roles: Roles | None = None,
        native: PlatformEvents | None = None,
    ) -> None:
        self.store = store
        self.commands = commands
        self.turns = turns
        self.policies = policies
        self.replies = replies
        self.max_attempts = max_attempts
        self.channel_settings = dict(channel_settings or {})
        self.roles = roles or Roles(self.channel_settings)
        # Edits and recalls queued behind a turn's messages apply before it starts.
        self.native = native

    def locale(self, channel: str) -> str:
        settings = self.channel_settings.get(channel)
        return settings.locale if settings is not None else "en"

    async def handle(
        self, lease: SessionLease, rows: list[InboxRow], hand_on: HandOn | None = None
    ) -> Handled:
        """Handle the key's next turn out of its next `rows` (at least one)."""
        policy = self.policies.of(rows[0].channel)
        batch = await policy.batch(
            rows, lambda limit: self.store.next_rows(lease.key, limit), self.commands.is_command
        )
        live = [r for r in batch if r.attempts < self.max_attempts and r.unreadable is None]
        unreadable = [r for r in batch if r.unreadable is not None]
        spent = [r for r in batch if r.attempts >= self.max_attempts and r.unreadable is None]
        for row in unreadable:
            await self._give_up(lease, [row], row.unreadable or "")
        if spent:
            await self._give_up(lease, spent, f"gave up after {self.max_attempts} attempts")
        if not live:
            return Handled()
        found = self.commands.find(live[0].event) if len(live) == 1 else None
        if found is None and self.native is not None:
            live = await self.native.before_turn(lease, live)
            if not live:
                return Handled()
        if found is not None:
            counted = set(await self.store.count_attempt(lease, [r.id for r in live]))
            live = [r for r in live if r.id in counted]  # a row canceled while it waited is skipped
            if not live:
                return Handled()
        ids = [r.id for r in live]
        with tracing.handling(live, replica=lease.owner):  # continues the rows' stored traces
            return await self._attempt(lease, live, ids, hand_on, found)

    async def _attempt(
        self,
        lease: SessionLease,
        live: list[InboxRow],
        ids: list[int],
        hand_on: HandOn | None,
        found: tuple[Command, str] | None,
    ) -> Handled:
        try:
            if found is None:
                # A turn counts its attempt in the commit that starts it (`TurnPlan.count_attempt`).
                return await self.turns.run(lease, live, hand_on, counted=False)
            return await self._command(lease, live[0], found)
        except LeaseLost:
            raise
        except Exception as exc:
            # Kept with the rows: the error they fail with if no attempt succeeds.
            await self.store.note_error(ids, f"{type(exc).__name__}: {exc}")
            raise

    async def _command(self, lease: SessionLease, row: InboxRow, found: tuple[Command, str]) -> Handled:
        command, args = found
        locale = self.locale(row.channel)
        call = CommandCall(lease, row, command.name, args, locale)
        refusal = await self._refusal(command, row, locale)
        if refusal is not None:  # a refused command changes nothing: only the reply is stored
            await self.replies.answer(lease, row, refusal)
        else:
            return await command.run(call) or Handled()
        return Handled()

    async def _refusal(self, command: Command, row: InboxRow, locale: str) -> str | None:
        """Why the sender may not run `command` here (the reply), or None when they may."""
        if command.allowed is not None and not command.allowed(row.event):
            return say("not_allowed", locale, command=command.name)
        settings = self.channel_settings.get(row.channel)
        needed = required_role(command, settings.conversation_commands if settings else "admin")
        if needed is Role.GUEST:
            return None
        role = await self.roles.of(row.event)
        if role >= needed:
            return None
        log.info("command_refused", command=command.name, role=role.label, needed=needed.label)
        return say("role_needed", locale, command=command.name, role=say(f"role.{needed.label}", locale))

    async def _give_up(self, lease: SessionLease, rows: list[InboxRow], reason: str) -> None:
        """Fail rows that used their attempts; tell their senders instead of dropping them."""
        replies = [
            self.replies.row(
                reply_for(r.event, say("failed", self.locale(r.channel))),
                session_id=None,
                run_id=None,
                event_id=r.event_id,
            )
            for r in rows
            if r.event.chat_id  # a row whose chat cannot be read gets no reply
        ]
        await self.store.fail(lease, rows, reason, replies)
        log.error("events_failed", event_ids=[r.event_id for r in rows])
        self.replies.handled([r.event_id for r in rows])
