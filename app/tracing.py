"""OpenTelemetry: one trace per event, from the platform's request to each delivery.

Chosen once at start-up (`configure_tracing`): with no OTLP endpoint configured the
tracer is OpenTelemetry's no-op one and every helper here returns at its first line, so
tracing costs nothing when it is off. The pipeline calls these helpers, a line or two per
site; nothing else in the code imports OpenTelemetry.

The way of an event crosses replicas through the database: the W3C trace context of the
inbox commit is stored with the inbox row (`carrier`), and whichever replica takes the
row continues the trace from it (`handling`); the turn's context is stored with each
outbox row, and the delivery continues from that (`delivery`).

Span tree of one event (docs/observability.md):

    POST /channels/…          (server; parent: the caller's `traceparent`, if any)
      chatgate.ingest
        chatgate.inbox.commit
          chatgate.wait        (accepted → taken by a worker, on any replica)
            chatgate.turn
              chat <model>     (GenAI conventions; `traceparent` sent to the model API)
              execute_tool <name>
              deliver <channel> (the outbox delivery and the platform's answer)
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

_PROPAGATOR = TraceContextTextMapPropagator()  # W3C `traceparent` / `tracestate`
_ACCEPTED = "accepted_ns"  # our own key in a stored carrier: when the event was committed


class TracingSettings(BaseSettings):
    """The standard OpenTelemetry variables chatgate reads (the SDK reads the rest itself)."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    otel_exporter_otlp_endpoint: str | None = Field(
        None,
        description="OTLP/HTTP collector base URL (…/v1/traces is appended); unset: tracing is off.",
    )
    otel_exporter_otlp_traces_endpoint: str | None = Field(
        None, description="Full OTLP/HTTP traces URL; overrides the base URL for traces."
    )
    otel_service_name: str = Field("chatgate", description="service.name of every span.")
    otel_traces_sampler: str = Field(
        "parentbased_always_on",
        description="always_on, always_off, traceidratio, parentbased_always_on, "
        "parentbased_always_off or parentbased_traceidratio.",
    )
    otel_traces_sampler_arg: float | None = Field(
        None, description="The ratio of the *traceidratio samplers (default 1.0)."
    )
    otel_sdk_disabled: bool = Field(False, description="true: tracing off even with an endpoint set.")

    @property
    def traces_endpoint(self) -> str | None:
        if self.otel_sdk_disabled:
            return None
        if self.otel_exporter_otlp_traces_endpoint:
            return self.otel_exporter_otlp_traces_endpoint
        if self.otel_exporter_otlp_endpoint:
            return self.otel_exporter_otlp_endpoint.rstrip("/") + "/v1/traces"
        return None


class _Tracing:
    """What `configure_tracing` chose: the tracer, and the provider to flush at the end."""

    def __init__(self) -> None:
        self.on = False
        self.tracer: Tracer = trace.NoOpTracer()
        self.provider: Any = None


_state = _Tracing()


def configure_tracing(settings: TracingSettings | None = None, *, provider: Any = None) -> bool:
    """Choose the tracer once, at start-up; returns whether tracing is on.

    `provider`: a ready `TracerProvider` (tests pass one with an in-memory exporter).
    Otherwise the SDK is set up only when an OTLP endpoint is configured; without one
    nothing changes (off, unless a provider was given before; `shutdown_tracing` ends it).
    """
    if provider is None:
        settings = settings or TracingSettings()
        endpoint = settings.traces_endpoint
        if endpoint is None:
            return _state.on
        shutdown_tracing()
        provider = _sdk_provider(settings, endpoint)
    _state.provider, _state.tracer, _state.on = provider, provider.get_tracer("chatgate"), True
    return True


def _sdk_provider(settings: TracingSettings, endpoint: str) -> Any:
    # Imported only when tracing is on: the SDK and exporter stay unloaded otherwise.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace import sampling as s
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    ratio = 1.0 if settings.otel_traces_sampler_arg is None else settings.otel_traces_sampler_arg
    samplers = {
        "always_on": s.ALWAYS_ON,
        "always_off": s.ALWAYS_OFF,
        "traceidratio": s.TraceIdRatioBased(ratio),
        "parentbased_always_on": s.ParentBased(s.ALWAYS_ON),
        "parentbased_always_off": s.ParentBased(s.ALWAYS_OFF),
        "parentbased_traceidratio": s.ParentBasedTraceIdRatio(ratio),
    }
    sampler = samplers.get(settings.otel_traces_sampler.lower())
    if sampler is None:
        known = ", ".join(sorted(samplers))
        raise ValueError(f"OTEL_TRACES_SAMPLER={settings.otel_traces_sampler!r} is none of {known}")
    # Resource.create also reads OTEL_RESOURCE_ATTRIBUTES; the exporter reads
    # OTEL_EXPORTER_OTLP_HEADERS / _TIMEOUT / _COMPRESSION, the processor OTEL_BSP_*.
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: settings.otel_service_name}), sampler=sampler
    )
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    return provider


def shutdown_tracing() -> None:
    """Export what is buffered and turn tracing off."""
    provider, _state.provider = _state.provider, None
    _state.on, _state.tracer = False, trace.NoOpTracer()
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _state.on


def flush() -> None:
    """Export the spans buffered so far (the batch processor exports every few seconds)."""
    if _state.provider is not None:
        _state.provider.force_flush()


# --- carrying a trace over the database and over HTTP ---------------------------------


def carrier() -> dict[str, Any] | None:
    """The current trace context to store with a row (None: no trace, nothing stored)."""
    if not _state.on:
        return None
    stored: dict[str, Any] = {}
    _PROPAGATOR.inject(stored)
    if not stored:
        return None
    stored[_ACCEPTED] = time.time_ns()
    return stored


def _context_of(stored: Mapping[str, Any] | None) -> Context | None:
    if not stored or "traceparent" not in stored:
        return None
    context = _PROPAGATOR.extract({k: v for k, v in stored.items() if isinstance(v, str)})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current span, for an outgoing request."""
    out: dict[str, str] = {}
    if _state.on:
        _PROPAGATOR.inject(out)
    return out


def httpx_hooks() -> dict[str, list[Any]]:
    """httpx event hooks: `traceparent` on each request, the answer's status on the span."""
    if not _state.on:
        return {}

    async def on_request(request: Any) -> None:
        _PROPAGATOR.inject(request.headers)

    async def on_response(response: Any) -> None:
        trace.get_current_span().set_attribute("http.response.status_code", response.status_code)

    return {"request": [on_request], "response": [on_response]}


_TRACED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def asgi(app: Any) -> Any:
    """`app` with a server span per request that may carry an event (not GETs, polls or
    WebSockets); an incoming `traceparent` becomes its parent. `app` itself when off."""
    if not _state.on:
        return app

    async def traced(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in _TRACED_METHODS:
            await app(scope, receive, send)
            return
        incoming = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())}
        # The first two path segments name the route (`/channels/webhook`, `/a2a`); the
        # rest may be an id or a platform token and stays out of the span.
        route = "/" + "/".join(scope["path"].split("/")[1:3])
        attributes = {"http.request.method": scope["method"], "http.route": route}
        with _state.tracer.start_as_current_span(
            f"{scope['method']} {route}",
            context=_PROPAGATOR.extract(incoming),
            kind=SpanKind.SERVER,
            attributes=attributes,
        ) as span:

            async def send_with_status(message: Any) -> None:
                if message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await app(scope, receive, send_with_status)

    return traced


def add_trace_ids(_logger: Any, _method: str, event_dict: Any) -> Any:
    """structlog processor: `trace_id` and `span_id` of the active span, if any."""
    if _state.on:
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            event_dict.setdefault("trace_id", format(context.trace_id, "032x"))
            event_dict.setdefault("span_id", format(context.span_id, "016x"))
    return event_dict


# --- the spans of an event's way -------------------------------------------------------

_OFF: AbstractContextManager[Any] = nullcontext(None)


def _span(name: str, **kwargs: Any) -> AbstractContextManager[Span | None]:
    if not _state.on:
        return _OFF
    return _state.tracer.start_as_current_span(name, **kwargs)


def ingest(channel: str, count: int, *, replica: str) -> AbstractContextManager[Span | None]:
    """A channel's events on their way in: admission and the inbox commit."""
    attributes = {"chatgate.channel": channel, "chatgate.events": count, "chatgate.replica": replica}
    return _span("chatgate.ingest", attributes=attributes)


def inbox_commit(event_ids: Sequence[str]) -> AbstractContextManager[Span | None]:
    """The inbox commit; its context is what the rows store (`carrier`)."""
    return _span("chatgate.inbox.commit", attributes={"chatgate.event_ids": list(event_ids)})


class _Row(Protocol):
    @property
    def event_id(self) -> str: ...
    @property
    def session_key(self) -> str: ...
    @property
    def trace_context(self) -> Mapping[str, Any] | None: ...


def handling(rows: Sequence[_Row], *, replica: str) -> AbstractContextManager[Span | None]:
    """A key's turn on the replica that took the rows, continuing their stored traces.

    Each row's wait (committed → taken) becomes a span of its own trace; the turn is a
    child of the last row's wait (the event it answers), linked to the other rows' traces.
    """
    if not _state.on:
        return _OFF
    return _handling(rows, replica)


@contextmanager
def _handling(rows: Sequence[_Row], replica: str) -> Iterator[Span | None]:
    now = time.time_ns()
    parents: list[Context] = []
    for row in rows:
        context = _context_of(row.trace_context)
        if context is None:
            continue
        accepted = (row.trace_context or {}).get(_ACCEPTED)
        wait = _state.tracer.start_span(
            "chatgate.wait",
            context=context,
            start_time=accepted if isinstance(accepted, int) and accepted <= now else now,
            attributes={"chatgate.event_id": row.event_id, "chatgate.replica": replica},
        )
        wait.end(end_time=now)
        parents.append(trace.set_span_in_context(wait, context))
    # No stored context: a trace of its own, never the one the worker task was started in.
    parent = parents[-1] if parents else Context()
    links = [Link(trace.get_current_span(c).get_span_context()) for c in parents[:-1]]
    attributes = {
        "chatgate.session_key": rows[0].session_key,
        "chatgate.event_ids": [r.event_id for r in rows],
        "chatgate.replica": replica,
    }
    with _state.tracer.start_as_current_span(
        "chatgate.turn", context=parent, links=links, attributes=attributes
    ) as span:
        yield span


def model_call(provider: Any, model: str | None) -> AbstractContextManager[Span | None]:
    """One model request of a `ChatProvider` (GenAI semantic conventions)."""
    if not _state.on:
        return _OFF
    model = model or getattr(provider, "model", None)  # None: the provider's default model
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider.name,
        "gen_ai.system": provider.name,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    return _span(f"chat {model or provider.name}", kind=SpanKind.CLIENT, attributes=attributes)


def model_answered(span: Span | None, reply: Any) -> None:
    """Put a `ProviderReply`'s model and token counts on its model-call span."""
    if span is None:
        return
    usage = reply.usage
    span.set_attribute("gen_ai.usage.input_tokens", usage.prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", usage.completion_tokens)
    if reply.model:
        span.set_attribute("gen_ai.response.model", reply.model)
    span.set_attribute("gen_ai.response.finish_reasons", ["tool_calls" if reply.tool_calls else "stop"])


def tool_call(name: str, call_id: str) -> AbstractContextManager[Span | None]:
    """One tool call (GenAI semantic conventions)."""
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": name,
        "gen_ai.tool.call.id": call_id,
    }
    return _span(f"execute_tool {name}", attributes=attributes)


def delivery(row: Mapping[str, Any]) -> AbstractContextManager[Span | None]:
    """An outbox row sent to its platform, continuing the trace of the turn that wrote it."""
    if not _state.on:
        return _OFF
    attributes = {
        "chatgate.channel": row["channel"],
        "chatgate.outbox_id": row["id"],
        "chatgate.message_id": row["message_id"],
        "chatgate.attempt": row["attempts"],
    }
    return _state.tracer.start_as_current_span(
        f"deliver {row['channel']}",
        context=_context_of(row.get("trace_context")) or Context(),
        kind=SpanKind.CLIENT,
        attributes=attributes,
    )


def delivered(span: Span | None, platform_message_id: str | None) -> None:
    if span is not None and platform_message_id:
        span.set_attribute("chatgate.platform_message_id", platform_message_id)
