"""Observation: the metrics, and the callbacks through which the parts report to them."""

from __future__ import annotations

from typing import Any

from app.metrics import Metrics


class Observed:
    """What the parts tell the metrics (each method is one part's callback)."""

    def __init__(self, metrics: Metrics, owner: str) -> None:
        self.metrics = metrics
        self.owner = owner
        # The labelled children of the per-event counters, looked up once each
        # (prometheus_client checks and joins the label values on every `labels`).
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Any, *values: str) -> Any:
        key = (id(metric), *values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*values)
        return child

    def event(self, channel: str, outcome: str) -> None:
        """`Ingest.counted`: an event accepted, deduplicated or skipped."""
        counter = {
            "accepted": self.metrics.events_accepted,
            "deduplicated": self.metrics.events_deduplicated,
            "skipped": self.metrics.events_skipped,
        }[outcome]
        self._child(counter, channel).inc()

    def run(self, outcome: str, seconds: float, provider: str) -> None:
        """`TurnRunner.on_run_finished`."""
        self._child(self.metrics.run_duration, outcome).observe(seconds)
        if outcome == "provider_error":
            self.metrics.provider_errors.labels(provider).inc()

    def usage(self, model: str, row: dict[str, Any]) -> None:
        """`UsageMeter.on_record`: one model call's tokens (or transcribed seconds) and cost."""
        for kind in ("input", "output", "cached"):
            self._child(self.metrics.model_tokens, model, kind).inc(row[f"{kind}_tokens"])
        if row["audio_seconds"]:
            self._child(self.metrics.speech_seconds, model).inc(row["audio_seconds"])
        if row["cost"] is not None:
            self._child(self.metrics.model_cost, model, row["currency"]).inc(row["cost"])

    def delivery(self, channel: str, result: str) -> None:
        """`OutboxSender.on_result`."""
        self._child(self.metrics.deliveries, channel, result).inc()

    def connection(self, name: str, held: bool) -> None:
        """`DatabaseConnections.on_change`: this replica holds (or lost) a platform connection."""
        self.metrics.connection_held.labels(name, self.owner).set(int(held))

    def connection_takeover(self, name: str) -> None:
        self.metrics.connection_takeovers.labels(name).inc()
