"""Every part of a chatgate process, as the assembly built them (`app.assembly.assemble`).

`Parts` is the four groups the steps build (storage, agents, the channels' side, the
event's way) as one object, `runtime.engine`, `runtime.ingest` …, with what the steps
share: the settings, this replica's name, the metrics and the build record. Each group
declares its fields once, in its own step's module."""

from __future__ import annotations

from dataclasses import dataclass

from app.assembly.agents import Agents
from app.assembly.channels import Outbound
from app.assembly.observation import Observed
from app.assembly.pipeline import Way
from app.assembly.record import Built
from app.assembly.storage import Storage
from app.channel import ChannelSettings
from app.config import Settings
from app.metrics import Metrics


# A runtime is one process: compared (and hashed) by identity (the groups are `eq=False`).
@dataclass(frozen=True, eq=False)
class Parts(Way, Outbound, Agents, Storage):
    settings: Settings
    channel_settings: dict[str, ChannelSettings]
    owner: str  # this replica's name in leases
    metrics: Metrics
    observed: Observed
    built: Built  # what was built, in order (`python -m app.assembly --graph`)
