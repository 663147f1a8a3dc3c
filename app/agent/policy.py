"""Which tools a run may use: allow/deny lists per service, channel and sender.

A policy is a stack of layers; a tool is usable only if every layer allows it. A layer
allows a name when it matches one of its `allow` globs (an empty list allows all) and
none of its `deny` globs. The service layer (`TOOLS_ALLOW`/`TOOLS_DENY`) always applies;
below it the channel's lists, replaced by the sender's entry of `tools_by_sender` when
the sender has one (so an operator can grant one person more than the room).

A tool the policy refuses is not offered to the model, and a call to it anyway (a model
may hallucinate a name it saw earlier in the history) is refused with an error result.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from app.channel import ChannelSettings


@dataclass(frozen=True)
class PolicyLayer:
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    def allows(self, name: str) -> bool:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.deny):
            return False
        return not self.allow or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.allow)


@dataclass(frozen=True)
class ToolPolicy:
    layers: tuple[PolicyLayer, ...] = ()

    def allows(self, name: str) -> bool:
        return all(layer.allows(name) for layer in self.layers)

    @classmethod
    def build(
        cls,
        *,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        channel: ChannelSettings | None = None,
        sender_id: str | None = None,
    ) -> ToolPolicy:
        layers = [PolicyLayer(tuple(allow), tuple(deny))]
        if channel is not None:
            rule = channel.tools_by_sender.get(sender_id or "") if sender_id is not None else None
            if rule is not None:
                layers.append(PolicyLayer(tuple(rule.get("allow", ())), tuple(rule.get("deny", ()))))
            else:
                layers.append(PolicyLayer(tuple(channel.tools_allow), tuple(channel.tools_deny)))
        return cls(tuple(layers))


ALLOW_ALL = ToolPolicy()
