"""One trace per event (app/tracing.py), across two replicas on one database.

Replica A serves the webhook over HTTP but has no run slot (it accepts and stores only);
replica B, a second runtime on the same database, takes the key, runs the turn (a tool
call between two model calls against a real fake OpenAI server) and delivers the reply
to a real callback receiver. Spans are collected with the SDK's in-memory exporter, and
once exported over OTLP/HTTP to a real receiver the test starts.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import structlog
from a2a.client import ClientConfig, create_client
from a2a.types.a2a_pb2 import TaskState
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import select

from app import tracing
from app.api.app import create_app
from app.db.models import inbox, outbox, utcnow
from app.events import InboundEvent
from app.logs import configure_logging
from app.migrate import upgrade
from app.pipeline.storage.portable import inbox_values
from app.runtime import Runtime
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.a2a.test_a2a import TOKEN_A as A2A_TOKEN
from tests.channels.a2a.test_a2a import channels as a2a_channels
from tests.channels.a2a.test_a2a import only_task
from tests.channels.a2a.test_a2a import user_message as a2a_message
from tests.conftest import WEBHOOK_SECRET, ServeApp, make_settings, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.otlp_receiver import OtlpReceiver
from tests.support.servers import serve_in_loop
from tests.support.timing import scaled
from tests.support.webhook import post_webhook

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
CALLER_TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on, every span kept in memory; off again after the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.configure_tracing(provider=provider)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


def _hex(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _parent(span: ReadableSpan) -> str | None:
    return _hex(span.parent.span_id, 16) if span.parent is not None else None


def _id(span: ReadableSpan) -> str:
    assert span.context is not None
    return _hex(span.context.span_id, 16)


def _traceparent_span(header: str) -> tuple[str, str]:
    _version, trace_id, span_id, _flags = header.split("-")
    return trace_id, span_id


async def _replica_b(db_url: str, fake: FakeOpenAI, callback: str) -> Runtime:
    settings = make_settings(db_url, auto_migrate=False, inbox_poll_seconds=0.05, **openai_settings(fake))
    runtime = Runtime(settings, channel_settings={"webhook": webhook_settings(callback_url=callback)})
    await runtime.start()
    return runtime


async def _until(check: Any, timeout: float = 15.0) -> None:
    for _ in range(int(scaled(timeout) / 0.05)):
        if await check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


@asynccontextmanager
async def _one_event(
    db_url: str, fake: FakeOpenAI, receiver: HttpReceiver, headers: dict[str, str]
) -> AsyncIterator[tuple[Runtime, Runtime]]:
    """Post one event to replica A; replica B answers it. Yields (A, B) once delivered."""
    await upgrade(db_url)
    app = create_app(
        make_settings(db_url, auto_migrate=False, max_concurrent_runs=0),  # A stores, never runs
        channel_settings={"webhook": webhook_settings(callback_url=receiver.url)},
    )
    async with serve_in_loop(app) as a, httpx.AsyncClient(timeout=30) as client:
        b = await _replica_b(db_url, fake, receiver.url)
        try:
            payload = {"chat_id": "c1", "sender_id": "u1", "text": "what time is it?", "message_id": "m-1"}
            resp = await post_webhook(client, a.url, WEBHOOK_SECRET, payload, headers=headers)
            assert resp.status_code == 202, resp.text
            await receiver.wait_for(1, timeout=20)
            yield a.runtime, b
        finally:
            await b.stop()


async def test_a_tool_turn_that_crossed_replicas_is_one_trace(
    db_url: str, spans: InMemorySpanExporter
) -> None:
    async with FakeOpenAI() as fake, HttpReceiver() as receiver:
        fake.enqueue(calls(ToolCall("current_time", {"timezone": "UTC"})), text("It is noon."))
        async with _one_event(db_url, fake, receiver, {"traceparent": CALLER_TRACEPARENT}) as (a, b):
            async with b.engine.connect() as conn:
                stored_in = (await conn.execute(select(inbox.c.trace_context))).scalar_one()
                stored_out = (await conn.execute(select(outbox.c.trace_context))).scalar_one()
            replica_a, replica_b = a.owner, b.owner
            await _until(_has(spans, "deliver webhook"))

    finished = spans.get_finished_spans()
    # One trace throughout: the caller's.
    assert {_hex(s.context.trace_id, 32) for s in finished if s.context} == {CALLER_TRACE}
    by_name: dict[str, list[ReadableSpan]] = {}
    for span in finished:
        by_name.setdefault(span.name, []).append(span)
    (server,) = by_name["POST /channels/webhook"]
    (ingest,) = by_name["chatgate.ingest"]
    (commit,) = by_name["chatgate.inbox.commit"]
    (wait,) = by_name["chatgate.wait"]
    (turn,) = by_name["chatgate.turn"]
    models = by_name["chat fake-model"]
    (tool,) = by_name["execute_tool current_time"]
    (deliver,) = by_name["deliver webhook"]

    # The incoming traceparent is the parent; then the way of the event, parent by parent.
    assert _parent(server) == CALLER_SPAN and server.parent is not None and server.parent.is_remote
    assert _parent(ingest) == _id(server)
    assert _parent(commit) == _id(ingest)
    assert _parent(wait) == _id(commit)
    assert _parent(turn) == _id(wait)
    assert [_parent(m) for m in models] == [_id(turn), _id(turn)]
    assert _parent(tool) == _id(turn)
    assert _parent(deliver) == _id(turn)
    # Accepted on A, run on B: the trace crossed replicas through the inbox row.
    assert ingest.attributes is not None and ingest.attributes["chatgate.replica"] == replica_a
    assert turn.attributes is not None and turn.attributes["chatgate.replica"] == replica_b
    assert replica_a != replica_b
    assert stored_in is not None and stored_in["traceparent"].split("-")[1] == CALLER_TRACE
    assert stored_out is not None and _traceparent_span(stored_out["traceparent"])[1] == _id(turn)
    assert server.attributes is not None and server.attributes["http.response.status_code"] == 202

    # GenAI semantic conventions on the model calls and the tool call.
    for model in models:
        attrs = dict(model.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "fake-model"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (11, 7)
    assert [dict(m.attributes or {})["gen_ai.response.finish_reasons"] for m in models] == [
        ("tool_calls",),
        ("stop",),
    ]
    assert models[0].end_time is not None and tool.start_time is not None
    assert models[0].end_time <= tool.start_time  # the tool ran between the two calls
    tool_attrs = dict(tool.attributes or {})
    assert tool_attrs["gen_ai.operation.name"] == "execute_tool"
    assert tool_attrs["gen_ai.tool.name"] == "current_time"
    assert dict(deliver.attributes or {})["http.response.status_code"] == 200

    # traceparent reached the model endpoint (each call: its own span) and the callback.
    sent = [_traceparent_span(r.headers["traceparent"]) for r in fake.requests]
    assert sent == [(CALLER_TRACE, _id(m)) for m in models]
    (callback,) = receiver.received
    assert _traceparent_span(callback.headers["traceparent"]) == (CALLER_TRACE, _id(deliver))


def _has(spans: InMemorySpanExporter, name: str) -> Any:
    async def check() -> bool:
        return any(s.name == name for s in spans.get_finished_spans())

    return check


async def test_without_an_incoming_traceparent_the_request_starts_the_trace(
    db_url: str, spans: InMemorySpanExporter
) -> None:
    async with FakeOpenAI(default=text("hi")) as fake, HttpReceiver() as receiver:
        async with _one_event(db_url, fake, receiver, {}):
            await _until(_has(spans, "deliver webhook"))
    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if s.name == "POST /channels/webhook"]
    assert server.parent is None
    assert len({s.context.trace_id for s in finished if s.context}) == 1
    assert fake.requests[0].headers["traceparent"].split("-")[1] == _hex(server.context.trace_id, 32)  # type: ignore[union-attr]


async def test_spans_arrive_at_a_real_otlp_http_receiver(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start-up path: OTEL_* from the environment, the SDK's batch processor and OTLP/HTTP."""
    async with OtlpReceiver() as otlp, FakeOpenAI(default=text("hi")) as fake, HttpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "chatgate-otlp-test")
        try:
            async with _one_event(db_url, fake, receiver, {"traceparent": CALLER_TRACEPARENT}):
                assert tracing.enabled()
            # The exporter posts from its own thread to the receiver served by this loop.
            await asyncio.to_thread(tracing.flush)
            received = await otlp.wait_for({"chatgate.turn", "chat fake-model", "deliver webhook"})
        finally:
            tracing.shutdown_tracing()
    assert {s.trace_id for s in received} == {CALLER_TRACE}
    assert {s.service for s in received} == {"chatgate-otlp-test"}
    assert set(otlp.content_types) == {"application/x-protobuf"}
    (model,) = [s for s in received if s.name == "chat fake-model"]
    assert model.attributes["gen_ai.usage.input_tokens"] == 11


async def test_with_tracing_off_nothing_is_exported_or_stored(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    async with OtlpReceiver() as otlp, FakeOpenAI(default=text("hi")) as fake, HttpReceiver() as receiver:
        async with _one_event(db_url, fake, receiver, {"traceparent": CALLER_TRACEPARENT}) as (a, _b):
            assert not tracing.enabled()
            async with a.engine.connect() as conn:
                stored = [
                    (await conn.execute(select(table.c.trace_context))).scalar_one()
                    for table in (inbox, outbox)
                ]
        await asyncio.to_thread(tracing.flush)
    assert stored == [None, None]
    assert otlp.requests == 0 and otlp.spans == []
    assert "traceparent" not in fake.requests[0].headers
    assert "traceparent" not in receiver.received[0].headers


async def test_log_lines_carry_the_trace_id(
    spans: InMemorySpanExporter, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging("INFO", "json")
    log = structlog.get_logger("test")
    with tracing.ingest("webhook", 1, replica="r") as span:
        log.info("inside")
    log.info("outside")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert span is not None
    context = span.get_span_context()
    assert lines[0]["trace_id"] == _hex(context.trace_id, 32)
    assert lines[0]["span_id"] == _hex(context.span_id, 16)
    assert "trace_id" not in lines[1]


async def test_an_a2a_callers_traceparent_becomes_the_parent(
    serve: ServeApp, spans: InMemorySpanExporter
) -> None:
    async with (
        FakeOpenAI(default=text("pong")) as fake,
        serve(channel_settings=a2a_channels(), **openai_settings(fake)) as srv,
        httpx.AsyncClient(
            timeout=30, headers={"Authorization": f"Bearer {A2A_TOKEN}", "traceparent": CALLER_TRACEPARENT}
        ) as http,
    ):
        client = await create_client(srv.url, ClientConfig(httpx_client=http, streaming=False))
        try:
            task = await only_task(client, a2a_message("ping"))
            assert task.status.state == TaskState.TASK_STATE_COMPLETED
        finally:
            await client.close()
    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if s.name == "POST /a2a"]
    assert _parent(server) == CALLER_SPAN
    by_name = {s.name: s for s in finished if s.context and _hex(s.context.trace_id, 32) == CALLER_TRACE}
    assert {"chatgate.ingest", "chatgate.inbox.commit", "chatgate.turn", "chat fake-model"} <= set(by_name)
    assert _parent(by_name["chatgate.ingest"]) == _id(server)
    assert fake.requests[0].headers["traceparent"].split("-")[1] == CALLER_TRACE


async def test_an_event_stored_without_a_trace_context_gets_a_trace_of_its_own(
    serve: ServeApp, spans: InMemorySpanExporter
) -> None:
    """Rows from before tracing was on (or from an untraced replica) start their own trace."""
    async with serve() as srv:
        runtime = srv.runtime
        event = InboundEvent.from_text("webhook", "old", "u", "stored before tracing")
        async with runtime.engine.begin() as conn:
            values = inbox_values(event, utcnow())  # no span is active here: nothing to carry
            assert values["trace_context"] is None
            await conn.execute(inbox.insert().values(**values))
        runtime.scheduler.notify(event.session_key)
        await _until(_has(spans, "chatgate.turn"))
    finished = spans.get_finished_spans()
    (turn,) = [s for s in finished if s.name == "chatgate.turn"]
    assert turn.parent is None
    assert not [s for s in finished if s.name == "chatgate.wait"]
    assert dict(turn.attributes or {})["chatgate.event_ids"] == (event.event_id,)
