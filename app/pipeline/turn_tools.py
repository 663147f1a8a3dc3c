"""What a turn's run may do: its tool context (session, workspace identity, tool policy)
and the approval gate of risky calls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from app.agent.loop import Decision
from app.agent.policy import PolicyLayer, ToolPolicy
from app.agent.tools import ToolContext
from app.channel import ChannelSettings
from app.memory.recall import RECALLED
from app.pipeline.approvals import ApprovalRules
from app.pipeline.turn_state import TurnState


class TurnTools:
    def __init__(
        self,
        channel_settings: Mapping[str, ChannelSettings],
        *,
        tools_allow: Sequence[str] = (),
        tools_deny: Sequence[str] = (),
    ) -> None:
        self.channel_settings = channel_settings
        self.tools_allow = list(tools_allow)
        self.tools_deny = list(tools_deny)
        self.approval_rules = ApprovalRules(channel_settings)
        # Set by the runtime: the tool lists (allow, deny) of a session key's agent (app.agents).
        self.agent_tools: Callable[[str], tuple[Sequence[str], Sequence[str]]] = lambda key: ((), ())

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
        allow, deny = self.agent_tools(turn.lease.key)
        if not allow and not deny:
            return policy
        return ToolPolicy((*policy.layers, PolicyLayer(tuple(allow), tuple(deny))))

    def gate(self, turn: TurnState) -> Decision:
        return self.approval_rules.gate(turn.origin, turn.lease.key)
