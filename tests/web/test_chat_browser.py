"""The chat page in a real browser against the real gateway (/ws), then the dashboard on it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from playwright.async_api import Page, WebSocket, WebSocketRoute, expect

from app.agent.provider import DeltaCallback, ProviderReply, ToolSpec
from app.agent.tools import Risk, ToolContext
from app.sessions.messages import ChatMessage, tool_call
from channels.browser.adapter import BrowserSettings
from tests.conftest import ADMIN_TOKEN, ServeApp, webhook_settings
from tests.support.timing import scaled
from tests.web.conftest import ignore_expected, shot

pytestmark = pytest.mark.slow

TOKEN = "tok-alice-0123456789abcdef"
GATEWAY_TOKENS = [
    {"token": TOKEN, "subject": "alice", "session_keys": ["web:alice"], "key_prefix": "web:alice:"},
]

# Records whether a streaming bubble ever appeared (deltas are gone once the message lands).
SAW_STREAMING = """
window.__sawStreaming = [];
new MutationObserver((records) => {
  for (const r of records) for (const n of r.addedNodes) {
    if (n.classList && n.classList.contains("streaming")) window.__sawStreaming.push(n.textContent);
  }
}).observe(document, { childList: true, subtree: true });
"""


def _serve(serve: ServeApp) -> Any:
    return serve(
        channel_settings={"webhook": webhook_settings(), "browser": BrowserSettings(_env_file=None)},  # type: ignore[call-arg]
        gateway_tokens=GATEWAY_TOKENS,
    )


class FrameLog:
    """Every frame the page's WebSockets sent and received, parsed."""

    def __init__(self, page: Page) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        page.on("websocket", self._attach)

    def _attach(self, ws: WebSocket) -> None:
        ws.on("framesent", lambda payload: self.sent.append(json.loads(payload)))
        ws.on("framereceived", lambda payload: self.received.append(json.loads(payload)))

    def received_types(self) -> list[str]:
        return [f["type"] for f in self.received]


async def test_chat_streams_reply_shows_tool_call_then_dashboard_resets_it(
    serve: ServeApp, page: Page
) -> None:
    async with _serve(serve) as srv:
        frames = FrameLog(page)
        await page.add_init_script(SAW_STREAMING)
        await page.goto(f"{srv.url}/#token={TOKEN}&session=web:alice")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        assert TOKEN not in page.url  # the token left the address bar
        await expect(page.locator("#session-select")).to_have_value("web:alice")

        await page.fill("#text", "what time is it?")
        await page.keyboard.press("Enter")
        tool = page.locator("details.tool")
        await expect(tool).to_have_count(1)
        await expect(tool.locator("summary strong")).to_have_text("current_time")
        await expect(tool.locator(".tool-status")).to_have_text("done")
        answer = page.locator(".msg.assistant").last
        await expect(answer).to_contain_text("It is ")
        await expect(page.locator(".msg.user")).to_have_text(["what time is it?"])
        await expect(page.locator(".msg.user.pending")).to_have_count(0)
        await tool.locator("summary").click()
        await expect(tool.locator(".tool-result")).to_contain_text("iso")

        await page.fill("#text", "hello there")
        await page.click("#send")
        await expect(page.locator(".msg.assistant").last).to_have_text("You said: hello there")
        await expect(page.locator(".msg.streaming")).to_have_count(0)
        assert "delta" in frames.received_types()
        # The bubble appeared with the first streamed piece, before the rest of the answer.
        seen = await page.evaluate("window.__sawStreaming")
        assert any(t.strip() == "You" for t in seen), seen
        await shot(page, "chat-conversation")

        sends = [f for f in frames.sent if f["type"] == "send"]
        assert [f["text"] for f in sends] == ["what time is it?", "hello there"]
        assert all(f["client_message_id"] for f in sends)

        # The dashboard shows the same session, its tool-call group, and resets it.
        await page.goto(f"{srv.url}/admin")
        await page.fill("#login-token", ADMIN_TOKEN)
        await page.click("#login-form button[type=submit]")
        await page.click('#nav a[data-route="sessions"]')
        await page.select_option('select[name="channel"]', "browser")
        await page.click(".filters button[type=submit]")
        row = page.locator('#sessions-table tr[data-key="web:alice"]')
        await expect(row).to_have_count(1)
        await row.locator("a").click()
        await expect(page.locator("#history .toolgroup .toolcall .name")).to_have_text("current_time")
        await expect(page.locator("#history .hmsg.user .text")).to_have_text(
            ["what time is it?", "hello there"]
        )
        await shot(page, "chat-session-in-dashboard")
        await page.click("#action-reset")
        await expect(page.locator("#session-status")).to_have_text("expired", timeout=scaled(10) * 1000)

        errors = ignore_expected(page.errors, r"401", r"Failed to load resource")  # type: ignore[attr-defined]
        assert errors == []


async def _ws_conversation(url: str, text: str) -> int:
    """Another client (a real WebSocket, like a second tab) talks in the same session."""
    import websockets

    async with websockets.connect(url.replace("http://", "ws://") + "/ws") as ws:
        await ws.send(json.dumps({"type": "auth", "token": TOKEN}))
        await ws.send(json.dumps({"type": "attach", "session_key": "web:alice"}))
        await ws.send(json.dumps({"type": "send", "text": text, "client_message_id": "other-1"}))
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "message" and frame["role"] == "assistant" and frame.get("content"):
                return int(frame["seq"])
    raise AssertionError("no answer")


class DroppableGateway:
    """Routes the page's /ws through Playwright so a test can cut it and refuse reconnects."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.offline = False
        self.routes: list[tuple[WebSocketRoute, WebSocketRoute]] = []

    async def install(self, page: Page) -> None:
        await page.route_web_socket("**/ws", self._route)

    async def _route(self, ws: WebSocketRoute) -> None:
        if self.offline:
            await ws.close(code=1013, reason="test: network down")
            return
        server = ws.connect_to_server()

        def from_page(message: str | bytes) -> None:
            self.sent.append(json.loads(message))
            server.send(message)

        def from_server(message: str | bytes) -> None:
            self.received.append(json.loads(message))
            ws.send(message)

        ws.on_message(from_page)
        server.on_message(from_server)
        self.routes.append((ws, server))

    async def drop(self) -> None:
        self.offline = True
        for page_side, server_side in self.routes:
            await server_side.close(code=1000)
            await page_side.close(code=4000, reason="test: connection lost")
        self.routes.clear()


async def test_chat_reconnects_and_resumes_from_last_seq(serve: ServeApp, page: Page) -> None:
    async with _serve(serve) as srv:
        gateway = DroppableGateway()
        await gateway.install(page)
        await page.goto(f"{srv.url}/#token={TOKEN}")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        await page.fill("#text", "first")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.assistant")).to_have_text(["You said: first"])
        # Committed (seq 2), not just streamed: the delta shows the same text earlier.
        await expect(page.locator('.msg.assistant[data-seq="2"]')).to_have_count(1)

        await gateway.drop()
        await expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
        await shot(page, "chat-reconnecting")
        # While this tab is away: another client talks in the session, and this tab queues a message.
        last = await _ws_conversation(srv.url, "from the other tab")
        await page.fill("#text", "typed while offline")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.user.pending")).to_have_text("typed while offline")

        gateway.offline = False
        await expect(page.locator("#conn")).to_have_attribute(
            "data-state", "connected", timeout=scaled(15) * 1000
        )
        await expect(page.locator(".msg.user")).to_have_text(
            ["first", "from the other tab", "typed while offline"], timeout=scaled(10) * 1000
        )
        await expect(page.locator(".msg.assistant")).to_have_text(
            ["You said: first", "You said: from the other tab", "You said: typed while offline"]
        )
        await expect(page.locator(".msg.user.pending")).to_have_count(0)
        await shot(page, "chat-resumed")
        await page.set_viewport_size({"width": 390, "height": 760})
        await shot(page, "chat-narrow")

        attaches = [f for f in gateway.sent if f["type"] == "attach"]
        assert len(attaches) == 2
        assert attaches[0].get("last_seq") is None
        assert attaches[1]["last_seq"] == 2 and attaches[1]["session_id"] is not None
        readies = [f for f in gateway.received if f["type"] == "ready"]
        missed = [m["seq"] for m in readies[-1]["messages"]]
        assert missed == [3, last]  # exactly what happened while away, nothing twice
        # The queued message went out once, on the new connection, after the resume.
        queued = [f for f in gateway.sent if f["type"] == "send" and f["text"] == "typed while offline"]
        assert len(queued) == 1


class WipeTool:
    """A risky tool: the run must stop and ask before it runs."""

    spec = ToolSpec(
        name="wipe_cache",
        description="Delete the cache.",
        parameters={"type": "object", "properties": {"scope": {"type": "string"}}},
    )
    risk = Risk.RISKY

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        self.calls.append(arguments)
        return json.dumps({"wiped": arguments.get("scope", "all")})


class WipeProvider:
    """A scripted model: "wipe" asks for the risky tool, a tool result is reported back."""

    name = "scripted"

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ProviderReply:
        last = messages[-1]
        if last.role == "tool":
            return ProviderReply(content=f"Result: {last.content}")
        if "wipe" in (last.content or ""):
            call = tool_call(f"call_wipe_{last.seq}", "wipe_cache", {"scope": "images"})
            return ProviderReply(content=None, tool_calls=(call,))
        return ProviderReply(content="ok")

    async def aclose(self) -> None:
        return None


async def test_chat_approval_prompt_approve_and_deny(serve: ServeApp, page: Page) -> None:
    tool = WipeTool()
    async with serve(
        channel_settings={"browser": BrowserSettings(_env_file=None, approvers=["alice"])},  # type: ignore[call-arg]
        gateway_tokens=GATEWAY_TOKENS,
        provider=WipeProvider(),
        tools=[tool],
    ) as srv:
        await page.goto(f"{srv.url}/#token={TOKEN}")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        await page.fill("#text", "please wipe the cache")
        await page.keyboard.press("Enter")
        card = page.locator(".approval")
        await expect(card).to_have_count(1)
        await expect(card.locator("strong")).to_have_text("Approval needed: wipe_cache")
        await expect(card.locator("pre")).to_contain_text('"scope": "images"')
        await expect(page.locator("details.tool .tool-status")).to_have_text("waiting for approval")
        await shot(page, "chat-approval")
        assert tool.calls == []

        await card.get_by_role("button", name="Approve").click()
        await expect(page.locator(".msg.assistant").last).to_have_text('Result: {"wiped": "images"}')
        await expect(card).to_have_count(0)
        await expect(page.locator("details.tool .tool-status")).to_have_text("done")
        assert tool.calls == [{"scope": "images"}]

        # A reload shows a pending request again (from `ready`), and Deny refuses it.
        await page.fill("#text", "wipe again")
        await page.keyboard.press("Enter")
        await expect(page.locator(".approval")).to_have_count(1)
        await page.reload()
        card = page.locator(".approval")
        await expect(card).to_have_count(1)
        await card.get_by_role("button", name="Deny").click()
        await expect(card).to_have_count(0)
        await expect(page.locator("details.tool").last.locator(".tool-result")).to_contain_text("deni")
        await expect(page.locator("details.tool").last.locator(".tool-status")).to_have_text("error")
        await expect(page.locator(".msg.assistant").last).to_contain_text("Result: ")
        assert tool.calls == [{"scope": "images"}]
        await shot(page, "chat-denied")


async def test_chat_token_refused_then_switch_sessions_and_scope(serve: ServeApp, page: Page) -> None:
    async with _serve(serve) as srv:
        await page.goto(f"{srv.url}/#token=not-a-valid-token-at-all")
        await expect(page.locator("#token-panel")).to_be_visible()
        await expect(page.locator("#token-error")).to_have_text("The gateway refused this token.")
        await shot(page, "chat-token-refused")

        await page.fill("#token-input", TOKEN)
        await page.click("#token-form button[type=submit]")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "connected")
        await page.fill("#text", "in the main session")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.assistant")).to_have_text(["You said: in the main session"])

        # A new conversation under the token's prefix, then back: each shows its own history.
        options = await page.locator("#session-select option").all_inner_texts()
        assert options[0] == "web:alice" and "new conversation under web:alice:" in options[-1]
        await page.select_option("#session-select", index=len(options) - 1)
        await expect(page.locator(".msg")).to_have_count(0)
        new_key = await page.locator("#session-select").input_value()
        assert new_key.startswith("web:alice:")
        await page.fill("#text", "in the side session")
        await page.keyboard.press("Enter")
        await expect(page.locator(".msg.assistant")).to_have_text(["You said: in the side session"])
        await shot(page, "chat-side-session")

        await page.select_option("#session-select", "web:alice")
        await expect(page.locator(".msg.user")).to_have_text(["in the main session"])
        await page.select_option("#session-select", new_key)
        await expect(page.locator(".msg.user")).to_have_text(["in the side session"])

        # Knowing another key gives nothing: refused, and the page falls back to its own session.
        # (A changed fragment is picked up at once, no reload needed.)
        await page.goto(f"{srv.url}/#session=webhook:someone-else")
        await expect(page.locator(".notice.error-text")).to_contain_text("may not")
        await expect(page.locator("#session-select")).to_have_value("web:alice")
        await expect(page.locator(".msg.user")).to_have_text(["in the main session"])


async def test_chat_says_when_the_gateway_is_not_enabled(serve: ServeApp, page: Page) -> None:
    async with serve(gateway_tokens=GATEWAY_TOKENS) as srv:  # CHANNELS without `browser`
        await page.goto(f"{srv.url}/#token={TOKEN}")
        await expect(page.locator(".notice.error-text")).to_contain_text("not enabled")
        await expect(page.locator("#conn")).to_have_attribute("data-state", "reconnecting")
        await expect(page.locator("#token-panel")).to_be_hidden()  # the token is not blamed


async def test_the_chat_page_speaks_chinese_to_a_chinese_browser(serve: ServeApp, browser: Any) -> None:
    """The browser's language decides (navigator.languages, like the dashboard): the page,
    the streamed answer's frame and the tool call's labels are in Chinese."""
    context = await browser.new_context(locale="zh-CN")
    page = await context.new_page()
    try:
        async with _serve(serve) as srv:
            await page.goto(f"{srv.url}/")
            await expect(page.locator("#token-form button")).to_have_text("连接")
            await expect(page.locator("#token-input")).to_have_attribute("placeholder", "网关令牌")
            await page.goto(f"{srv.url}/#token={TOKEN}")
            await expect(page.locator("#conn")).to_have_text("已连接")
            await expect(page.locator("#send")).to_have_text("发送")
            await expect(page.locator("#stop")).to_have_attribute("title", "取消正在生成的回答（/stop）")
            await page.fill("#text", "what time is it?")
            await page.press("#text", "Enter")
            await expect(page.locator(".tool summary").first).to_contain_text("工具调用")
            await expect(page.locator(".tool .tool-status").first).to_have_text("完成")
            icon = await page.request.get(f"{srv.url}/favicon.ico")
            assert icon.status == 200 and icon.headers["content-type"].startswith("image/svg+xml")
            await shot(page, "chat-zh")
    finally:
        await context.close()
