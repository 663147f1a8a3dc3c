"""Prometheus metrics, one registry per app instance (no process globals)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        # process_resident_memory_bytes and friends, read only when scraped (alerts on memory).
        ProcessCollector(registry=self.registry)
        r = self.registry
        self.events_accepted = Counter(
            "chatgate_events_accepted", "Events stored in the inbox", ["channel"], registry=r
        )
        self.events_deduplicated = Counter(
            "chatgate_events_deduplicated", "Redeliveries answered from the inbox", ["channel"], registry=r
        )
        self.events_rejected = Counter(
            "chatgate_events_rejected", "Requests refused before storage", ["channel", "reason"], registry=r
        )
        self.events_skipped = Counter(
            "chatgate_events_skipped", "Events dropped by sender policy", ["channel"], registry=r
        )
        self.run_duration = Histogram(
            "chatgate_run_duration_seconds",
            "Agent run duration",
            ["outcome"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.deliveries = Counter(
            "chatgate_deliveries", "Outbox delivery results", ["channel", "result"], registry=r
        )
        self.inbox_backlog = Gauge("chatgate_inbox_backlog", "Unfinished inbox events", registry=r)
        self.outbox_backlog = Gauge("chatgate_outbox_backlog", "Undelivered outbox rows", registry=r)
        self.outbox_unserved = Gauge(
            "chatgate_outbox_unserved",
            "Undelivered outbox rows of channels this process does not run (kept until a replica does)",
            ["channel"],
            registry=r,
        )
        self.dead_letters = Gauge(
            "chatgate_dead_letters",
            "Failed inbox events (kind=inbox) and deliveries (kind=outbox) nobody retried or discarded",
            ["kind"],
            registry=r,
        )
        self.mcp_server_up = Gauge(
            "chatgate_mcp_server_up", "1 while an MCP tool server is connected", ["server"], registry=r
        )
        self.lease_takeovers = Counter(
            "chatgate_lease_takeovers", "Leases taken from an expired owner", registry=r
        )
        self.connection_held = Gauge(
            "chatgate_connection_held",
            "1 while this process (owner) holds the long-lived platform connection",
            ["connection", "owner"],
            registry=r,
        )
        self.connection_conflicts = Gauge(
            "chatgate_connection_conflicts",
            "Times in a row the platform refused this process's connection as a conflict "
            "(Telegram getUpdates 409); only while this process runs the connection",
            ["channel"],
            registry=r,
        )
        self.cron_undelivered = Gauge(
            "chatgate_cron_undelivered",
            "Cron results whose delivery failed (dead letters of cron fires nobody retried or discarded)",
            registry=r,
        )
        self.connection_takeovers = Counter(
            "chatgate_connection_takeovers",
            "Long-lived connections this process took over from an owner whose lease expired",
            ["connection"],
            registry=r,
        )
        self.provider_errors = Counter(
            "chatgate_provider_errors", "Model provider failures", ["provider"], registry=r
        )
        self.model_tokens = Counter(
            "chatgate_model_tokens",
            "Model tokens used, by model and kind (input, output, cached)",
            ["model", "kind"],
            registry=r,
        )
        self.speech_seconds = Counter(
            "chatgate_speech_seconds",
            "Seconds of audio transcribed (speech to text), by model",
            ["model"],
            registry=r,
        )
        self.model_cost = Counter(
            "chatgate_model_cost",
            "Cost of model calls, by model and currency",
            ["model", "currency"],
            registry=r,
        )
        self.ws_connections = Gauge("chatgate_ws_connections", "Open browser gateway connections", registry=r)
        self.ws_closed = Counter(
            "chatgate_ws_closed", "Browser gateway connections closed, by reason", ["reason"], registry=r
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
