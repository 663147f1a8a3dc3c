"""The channels' side: the HTTP client, speech to text, where received files are kept, the
streaming preview hub, the platform connections' leases and the outbox sender.

The adapters themselves are made when the runtime starts (`Runtime.start`): a factory
may need the running loop; replies reach each through `delivery` (the hub's wrap of it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from app import tracing
from app.agent.workspace import Workspace
from app.assembly.observation import Observed
from app.assembly.record import Built
from app.assembly.storage import Storage
from app.channel import ChannelAdapter, ChannelSettings, delivers
from app.config import Settings
from app.connection_leases import DatabaseConnections
from app.connections import ConnectionHolder
from app.pacing_limits import limits_with
from app.pipeline.inbox_files import InboxFiles
from app.pipeline.outbox import OutboxSender
from app.pipeline.pacing import Pacer
from app.sessions.directory import SessionDirectory
from app.speech import SpeechToText
from app.streaming.hub import PreviewHub


@dataclass(frozen=True, eq=False)  # compared by identity, as `Parts` is
class Outbound:
    # The adapters are made at start (`Runtime.start`); replies reach them through
    # `delivery` (the preview hub's wrap of each).
    adapters: dict[str, ChannelAdapter]
    delivery: dict[str, ChannelAdapter]
    previews: PreviewHub
    http: httpx.AsyncClient
    speech: SpeechToText | None
    connections: ConnectionHolder
    sender: OutboxSender
    inbox_files: InboxFiles
    directory: SessionDirectory  # sessions as API callers see them (the MCP server)


def build_channels(
    built: Built,
    settings: Settings,
    channel_settings: Mapping[str, ChannelSettings],
    storage: Storage,
    observed: Observed,
    owner: str,
) -> Outbound:
    engine = storage.engine
    adapters: dict[str, ChannelAdapter] = {}
    delivery: dict[str, ChannelAdapter] = {}  # filled at start, read by the sender
    # Streaming previews (`app.streaming`): the hub watches the feed; replies of a
    # streaming channel reach its adapter through the hub (the preview's last edit).
    # Outbound pacing (`app.pipeline.pacing`): the platforms' limits, counted in the
    # database through the store, for the sender's replies and the hub's previews.
    pacer = (
        Pacer(
            storage.store,
            limits_with(settings.pacing_limits),
            max_wait=settings.pacing_max_wait_seconds,
            # A send in flight holds its chat no longer than a dead replica's keys are held.
            hold=settings.lease_ttl_seconds,
        )
        if settings.pacing_enabled
        else None
    )
    previews = PreviewHub(
        engine,
        locales={name: cs.locale for name, cs in channel_settings.items()},
        first_preview_after=settings.stream_first_preview_seconds,
        still_working_after=settings.stream_still_working_seconds,
        pacing=pacer,
    )
    # Platform calls carry the delivery's `traceparent` when tracing is on (app.tracing).
    http = httpx.AsyncClient(timeout=httpx.Timeout(15.0), event_hooks=tracing.httpx_hooks())
    speech = SpeechToText.from_settings(settings)  # voice messages, when STT_MODEL is set
    # Long-lived platform connections (polling, sockets): fenced leases in the database,
    # one holder across every replica on it.
    connections = DatabaseConnections(
        engine,
        owner,
        ttl=settings.connection_lease_ttl_seconds,
        on_change=observed.connection,
        on_takeover=observed.connection_takeover,
    )
    sender = OutboxSender(
        engine,
        storage.store,
        delivery,
        owner=owner,
        poll_interval=settings.outbox_poll_seconds,
        max_attempts=settings.outbox_max_attempts,
        backoff_base=settings.outbox_backoff_base_seconds,
        backoff_max=settings.outbox_backoff_max_seconds,
        # A dead replica's claims are free within the lease TTL (renewed while sending).
        claim_seconds=min(settings.outbox_claim_seconds, settings.lease_ttl_seconds),
        on_result=observed.delivery,
        pacer=pacer,
    )
    # Files users send are kept in their session's workspace (per-session only).
    per_session = settings.workspace_root if settings.workspace_per_session else None
    inbox_files = InboxFiles(Workspace(per_session, per_session=True) if per_session else None)
    # Sessions as API callers may see them (the MCP server), by their grants; messages go
    # only to channels that send (not to ones whose replies are read, like /v1).
    directory = SessionDirectory(
        engine,
        channels=lambda: [name for name, adapter in adapters.items() if delivers(adapter)],
        on_outbox=sender.notify,
    )
    if pacer is not None:
        built.part("pacer", pacer)
    return Outbound(
        adapters,
        delivery,
        built.part("previews", previews),
        built.part("http", http),
        built.part("speech", speech) if speech is not None else None,
        built.part("connections", connections),
        built.part("sender", sender),
        built.part("inbox_files", inbox_files),
        built.part("directory", directory),
    )
