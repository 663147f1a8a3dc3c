"""What a turn's run may do: its tool context (session, workspace identity, tool policy,
whom it serves and how far it trusts what it reads) and the approval gate of risky calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial

from app.access.roles import Role, Roles
from app.agent.loop import Decision
from app.agent.policy import PolicyLayer, ToolPolicy
from app.agent.tools import ToolContext
from app.agent.trust import Trust
from app.channel import ChannelSettings
from app.events import InboundEvent
from app.memory.recall import RECALLED
from app.pipeline.approvals import ApprovalRules
from app.pipeline.turn_state import TurnState
from app.sessions.profiles import SessionProfiles


class TurnTools:
    def __init__(
        self,
        channel_settings: Mapping[str, ChannelSettings],
        profiles: SessionProfiles,
        *,
        tools_allow: Sequence[str] = (),
        tools_deny: Sequence[str] = (),
        roles: Roles | None = None,
    ) -> None:
        self.channel_settings = channel_settings
        self.profiles = profiles  # the serving agent's tool lists and approvers (app.agents)
        self.tools_allow = list(tools_allow)
        self.tools_deny = list(tools_deny)
        self.approval_rules = ApprovalRules(channel_settings, profiles)
        # Who is who in a group (`app.access.roles`): tools are checked against the turn's senders.
        self.roles = roles if roles is not None else Roles(channel_settings)

    def trust(self, events: Sequence[InboundEvent], origin: InboundEvent) -> Trust:
        """A new turn's trust: the least role of its senders; untrusted when it carries a
        file or image, or messages of someone other than `origin`'s sender."""
        trust = Trust(role=Role.OWNER, tool_roles=self._tool_roles(origin.channel))
        self.join(trust, events, origin)
        return trust

    def join(self, trust: Trust, events: Iterable[InboundEvent], origin: InboundEvent) -> None:
        """Messages that joined a turn (its start, a steer) lower its role and may taint it."""
        for event in events:
            trust.unresolved.append(partial(self.roles.of, event))  # asked when a tool needs it
            if event.sender_id != origin.sender_id or event.channel != origin.channel:
                trust.others.add(event.event_id)
                trust.untrusted = True
            if any(p.type in ("file", "image") for p in event.parts):
                trust.untrusted = True

    def _tool_roles(self, channel: str) -> dict[str, Role]:
        settings = self.channel_settings.get(channel)
        given = settings.tool_roles if settings is not None else {}
        return {glob: role for glob, name in given.items() if (role := Role.parse(name)) is not None}

    def context(self, turn: TurnState, message_count: Callable[[], Awaitable[int]]) -> ToolContext:
        origin = turn.origin
        return ToolContext(
            session_id=turn.session.id,
            session_key=turn.lease.key,
            channel=origin.channel,
            chat_id=origin.chat_id,
            sender_id=origin.sender_id,
            thread_id=origin.thread_id,
            message_count=message_count,
            policy=self.policy(turn),
            chat_type=origin.chat_type.value,
            generation=turn.session.generation,
            extras={RECALLED: turn.recalled} if turn.recalled is not None else {},
            trust=turn.trust,
        )

    def policy(self, turn: TurnState) -> ToolPolicy:
        """The service's lists, the channel's (or the sender's there), and the agent's."""
        origin = turn.origin
        policy = ToolPolicy.build(
            allow=self.tools_allow,
            deny=self.tools_deny,
            channel=self.channel_settings.get(origin.channel),
            sender_id=origin.sender_id,
        )
        allow, deny = self.profiles.tools_of(turn.lease.key)
        if not allow and not deny:
            return policy
        return ToolPolicy((*policy.layers, PolicyLayer(tuple(allow), tuple(deny))))

    def gate(self, turn: TurnState) -> Decision:
        return self.approval_rules.gate(turn.origin, turn.lease.key)
