"""A real local OTLP/HTTP receiver: `POST /v1/traces` with protobuf, decoded with opentelemetry-proto."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class OtlpReceiver(LocalServer):
    """Records every span exported to it; `url` is the base (the exporter appends /v1/traces)."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.content_types: list[str] = []
        self._changed = asyncio.Condition()

    async def _traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.content_types.append(request.headers.get("Content-Type", ""))
        export = ExportTraceServiceRequest()
        export.ParseFromString(body)
        async with self._changed:
            self.requests += 1
            for resource_spans in export.resource_spans:
                resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            ReceivedSpan(
                                service=str(resource.get("service.name", "")),
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                attributes={a.key: _value(a.value) for a in span.attributes},
                            )
                        )
            self._changed.notify_all()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    async def wait_for(self, names: set[str], timeout: float = 10) -> list[ReceivedSpan]:
        """Wait until spans of all these names arrived."""
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: names <= {s.name for s in self.spans}), scaled(timeout)
            )
        return list(self.spans)

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        await self._serve(app)
        return self
