"""`/metrics` shows the gateway and the pipeline moving (issue 5's observability list)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.agent.provider import ProviderReply, ToolSpec
from app.errors import ProviderError
from app.sessions.messages import ChatMessage
from tests.conftest import WEBHOOK_SECRET
from tests.gateway.conftest import ALICE_TOKEN, GatewayServe, gateway_client
from tests.support.webhook import post_webhook

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(base_url: str) -> Samples:
    async with httpx.AsyncClient(timeout=30) as http:
        resp = await http.get(f"{base_url}/metrics")
    assert resp.status_code == 200
    out: Samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def wait_for_value(base_url: str, name: str, expected: float, **labels: str) -> Samples:
    for _ in range(100):
        samples = await scrape(base_url)
        if value(samples, name, **labels) == expected:
            return samples
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}{labels} never became {expected}: {value(samples, name, **labels)}")


async def test_metrics_follow_the_gateway_and_the_pipeline(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv:
        before = await scrape(srv.url)
        for family in (
            "chatgate_inbox_backlog",
            "chatgate_outbox_backlog",
            "chatgate_ws_connections",
        ):
            assert (family, frozenset()) in before, family
        assert value(before, "chatgate_ws_connections") == 0

        async with gateway_client(srv.url, ALICE_TOKEN) as c1, gateway_client(srv.url, ALICE_TOKEN) as c2:
            await wait_for_value(srv.url, "chatgate_ws_connections", 2)
            await c1.attach()
            await c2.attach()
            await c1.send({"type": "send", "text": "what time is it", "client_message_id": "m1"})
            await c1.messages_until_answer()
            await c1.send({"type": "send", "text": "what time is it", "client_message_id": "m1"})
            assert (await c1.expect("accepted"))["duplicate"] is True
            await c2.send({"type": "send"})  # refused before storage
            assert (await c2.expect("error"))["code"] == "bad_frame"
        after = await wait_for_value(srv.url, "chatgate_ws_connections", 0)
        assert value(after, "chatgate_ws_closed_total", reason="client") == 2
        assert value(after, "chatgate_events_accepted_total", channel="browser") == 1
        assert value(after, "chatgate_events_deduplicated_total", channel="browser") == 1
        assert value(after, "chatgate_run_duration_seconds_count", outcome="ok") == 1
        assert value(after, "chatgate_events_rejected_total", channel="browser", reason="bad_frame") == 1
        assert value(after, "chatgate_run_duration_seconds_sum", outcome="ok") > 0

        async with gateway_client(srv.url) as bad:
            await bad.send({"type": "auth", "token": "wrong"})
            assert await bad.closed_with() == 4001
        await wait_for_value(srv.url, "chatgate_ws_closed_total", 1, reason="unauthorized")

        async with httpx.AsyncClient(timeout=30) as http:
            bad_sig = await post_webhook(
                http, srv.url, "not-the-secret", {"chat_id": "c", "sender_id": "u", "text": "hi"}
            )
            assert bad_sig.status_code == 401
            ok = await post_webhook(
                http, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "hi"}, wait=True
            )
            assert ok.status_code == 200
        samples = await wait_for_value(srv.url, "chatgate_run_duration_seconds_count", 2, outcome="ok")
        assert value(samples, "chatgate_events_rejected_total", channel="webhook", reason="unauthorized") == 1
        assert value(samples, "chatgate_events_accepted_total", channel="webhook") == 1
        assert value(samples, "chatgate_inbox_backlog") == 0


class DownProvider:
    """A model endpoint that is down (what the provider raises after its own retries)."""

    name = "down"

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        **_: object,
    ) -> ProviderReply:
        raise ProviderError("connection refused", status=None, retryable=True)

    async def aclose(self) -> None:
        return None


async def test_provider_errors_are_counted(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(provider=DownProvider()) as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as c:
            await c.attach()
            await c.send({"type": "send", "text": "hello?", "client_message_id": "x"})
            answer = (await c.messages_until_answer())[-1]  # the user is told, not left waiting
            assert answer["role"] == "assistant" and answer["content"]
        samples = await wait_for_value(srv.url, "chatgate_provider_errors_total", 1, provider="down")
        assert value(samples, "chatgate_run_duration_seconds_count", outcome="provider_error") == 1
