"""Assembly: every part of a chatgate process built once, from settings, bottom up.

Each part gets its collaborators as constructor arguments (python-telegram-bot's
`ApplicationBuilder.build` is the model); nothing is assigned into a part after it is
built, and a genuine cycle would be closed by one typed `set_…` call, declared where it
is made (`Built.closed`). The steps, in order: observation, storage, agents, the
channels' side, the event's way (with the commands). `Runtime` (`app.runtime`) runs what
this builds: start, stop, the sweepers.

`python -m app.assembly --graph` prints what was built, what each part holds, and
whatever was assigned after construction (nothing).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from app.agent.provider import ChatProvider
from app.agent.tools import Tool
from app.assembly.agents import build_agents
from app.assembly.channels import build_channels
from app.assembly.observation import Observed
from app.assembly.parts import Parts
from app.assembly.pipeline import build_way
from app.assembly.record import Built
from app.assembly.storage import StoreWrapper, build_storage
from app.channel import ChannelSettings
from app.config import Settings
from app.metrics import Metrics
from app.usage_settings import UsageSettings

__all__ = ["Parts", "assemble", "default_owner", "load_channel_settings"]


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def load_channel_settings(names: Sequence[str]) -> dict[str, ChannelSettings]:
    """Read each named channel's settings from the environment (imports its package)."""
    from channels import load_spec

    loaded = {name: load_spec(name).settings_class() for name in names}
    # A2A is served as soon as callers are configured, without listing it in CHANNELS.
    if "a2a" not in loaded and os.environ.get("A2A_TOKENS", "").strip():
        loaded["a2a"] = load_spec("a2a").settings_class()
    # Likewise the OpenAI-compatible API and the MCP server, once their callers are.
    for name, tokens in (("openai", "OPENAI_API_TOKENS"), ("mcp", "MCP_SERVER_TOKENS")):
        if name not in loaded and os.environ.get(tokens, "").strip():
            loaded[name] = load_spec(name).settings_class()
    return loaded


def assemble(
    settings: Settings,
    *,
    channel_settings: Mapping[str, ChannelSettings] | None = None,
    provider: ChatProvider | None = None,
    tools: Sequence[Tool] | None = None,
    metrics: Metrics | None = None,
    wrap_store: StoreWrapper | None = None,
) -> Parts:
    """Build every part from `settings` (the others replace what they name: tests, the CLI).

    Nothing connects here: the database, the bus, MCP servers and the adapters are
    reached when the runtime starts."""
    built = Built()
    channels = dict(
        channel_settings if channel_settings is not None else load_channel_settings(settings.channels)
    )
    owner = settings.worker_id or default_owner()
    observed_metrics = built.part("metrics", metrics or Metrics())
    observed = built.part("observed", Observed(observed_metrics, owner))
    storage = build_storage(built, settings, channels, wrap_store)
    agents = build_agents(built, settings, channels, storage, provider=provider, tools=tools)
    outbound = build_channels(built, settings, channels, storage, observed, owner)
    usage = UsageSettings.from_settings(settings)
    way = build_way(built, settings, channels, storage, agents, outbound, observed, owner, usage)
    return Parts(
        settings=settings,
        channel_settings=channels,
        owner=owner,
        metrics=observed_metrics,
        observed=observed,
        built=built,
        **_fields_of(storage),
        **_fields_of(agents),
        **_fields_of(outbound),
        **_fields_of(way),
    )


def _fields_of(group: object) -> dict[str, Any]:
    return {f.name: getattr(group, f.name) for f in fields(group)}  # type: ignore[arg-type]
