"""The MCP server: chatgate's agent and sessions as MCP tools and resources at `/mcp`.

Built with the official SDK (`mcp.server.mcpserver.MCPServer`), served over streamable
HTTP in stateless mode with JSON responses: every request stands alone, so any replica
answers any request and nothing of an MCP session is kept in memory. `Authorization:
Bearer <token>` (`MCP_SERVER_TOKENS`) is checked before the SDK sees the request; the
tools read the same header again (verified by then) to know the caller and its grant.

- `ask` is an event of the `mcp` channel in the session `mcp:<caller>:<session>`: stored
  in the inbox, handled in turn, answered from the outbox like every channel.
- `list_sessions`, `get_history` and the `chatgate://sessions/{key}/history` resource
  read only the sessions the token grants (and the caller's own `ask` sessions).
- `send_message` queues a message to a chat the token grants, through the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from typing import Any
from urllib.parse import unquote

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import ToolAnnotations
from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from app.channel import ChannelContext, SendResult
from app.events import ChatType, InboundEvent, OutboundMessage, SessionScope, TextPart, escape_key_component
from app.gateway.tokens import GatewayGrant, TokenInvalid, TokenVerifier
from app.sessions.directory import NotAllowed, SessionDirectory
from channels.mcp_server.settings import McpServerSettings

PATH = "/mcp"
_MAX_ID = 200


class McpServerChannel:
    name = "mcp"
    delivers = False  # `ask` answers are read by the tool call

    def __init__(self, settings: McpServerSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.tokens = TokenVerifier(settings.tokens, None)  # static tokens only
        self.directory: SessionDirectory | None = None
        self.server = self._build()
        # Stateless JSON: no server-side MCP session, so replicas need no affinity. The
        # SDK's Host/Origin checks guard unauthenticated local servers; here every request
        # carries a bearer token a browser page cannot add across origins without CORS.
        self.server.streamable_http_app(
            streamable_http_path=PATH,
            stateless_http=True,
            json_response=True,
            max_request_body_size=settings.max_body_bytes,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        )
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None

    def use_session_directory(self, directory: SessionDirectory) -> None:
        self.directory = directory

    # --- lifecycle: the SDK's session manager runs in a task of its own ----------------

    async def start(self) -> None:
        ready = asyncio.Event()

        async def run() -> None:
            async with self.server.session_manager.run():
                ready.set()
                await self._stop.wait()

        self._runner = asyncio.create_task(run(), name="mcp-server")
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({waiter, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._runner.done():
            self._runner.result()  # raise what stopped it

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            with contextlib.suppress(Exception):
                await self._runner
            self._runner = None

    async def send(self, message: OutboundMessage) -> SendResult:
        return SendResult()  # never called: `delivers` is False

    # --- who is asking ------------------------------------------------------------------

    def grant(self, authorization: str | None) -> GatewayGrant | None:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        try:
            return self.tokens.verify(token.strip())
        except TokenInvalid:
            return None

    def _caller(self, ctx: Context) -> tuple[str, list[GatewayGrant]]:
        """The caller and its grants: the token's, and its own `ask` sessions."""
        headers = ctx.headers or {}
        grant = self.grant(headers.get("authorization"))
        if grant is None:  # the route checked the token; a transport without headers has none
            raise ToolError("not authenticated")
        own = GatewayGrant(grant.subject, key_prefix=f"{self.name}:{escape_key_component(grant.subject)}")
        return grant.subject, [own, grant]

    def _directory(self) -> SessionDirectory:
        if self.directory is None:
            raise ToolError("sessions are not available on this server")
        return self.directory

    # --- the tools ------------------------------------------------------------------------

    def _build(self) -> MCPServer:
        server = _quietly_built(
            "chatgate",
            instructions="Ask chatgate's agent (`ask`, one conversation per session id), read the "
            "sessions your token allows, and send messages to the chats it allows.",
        )

        @server.tool(
            description="Ask the agent; `session` names your conversation (it remembers it). "
            "The same `request_id` again is one turn and the same answer (safe retries)."
        )
        async def ask(session: str, text: str, ctx: Context, request_id: str | None = None) -> str:
            caller, _ = self._caller(ctx)
            return await self.ask(caller, session, text, request_id)

        @server.tool(
            description="Send a text to a chat of a channel (as the bot), through the outbox. "
            "`message_id` makes a retry send it once."
        )
        async def send_message(
            channel: str, chat_id: str, text: str, ctx: Context, message_id: str | None = None
        ) -> dict[str, Any]:
            caller, grants = self._caller(ctx)
            if not text.strip() or len(text) > self.settings.max_text_chars:
                raise ToolError(f"text must be 1 to {self.settings.max_text_chars} characters")
            if message_id is not None and not 0 < len(message_id) <= _MAX_ID:
                raise ToolError(f"message_id is 1 to {_MAX_ID} characters")
            # The caller's own (another caller's same message_id is another message), hashed
            # to fit the outbox's message id.
            given = message_id or uuid.uuid4().hex
            mid = "mcp-" + hashlib.sha256(f"{caller}\n{given}".encode()).hexdigest()[:48]
            try:
                sent = await self._directory().send(grants, channel, chat_id, text, message_id=mid)
            except NotAllowed as exc:
                raise ToolError(f"this token may not send to {exc} (or that channel is not running)") from exc
            return {"message_id": sent.message_id, "session_key": sent.session_key, "queued": True}

        @server.tool(
            description="Sessions this token may read, most recent first; `prefix` narrows by key.",
            annotations=ToolAnnotations(read_only_hint=True),
        )
        async def list_sessions(ctx: Context, prefix: str = "", limit: int = 50) -> list[dict[str, Any]]:
            _, grants = self._caller(ctx)
            return await self._directory().list_sessions(grants, prefix=prefix, limit=max(1, min(limit, 200)))

        @server.tool(
            description="The last messages of a session this token may read.",
            annotations=ToolAnnotations(read_only_hint=True),
        )
        async def get_history(key: str, ctx: Context, limit: int = 50) -> list[dict[str, Any]]:
            _, grants = self._caller(ctx)
            try:
                return await self._directory().history(
                    grants, key, limit=max(1, min(limit, self.settings.max_history))
                )
            except NotAllowed as exc:
                raise ToolError(f"no session {key!r} for this token") from exc

        @server.resource(
            "chatgate://sessions/{key}/history",
            description="A session's recent history (key percent-encoded), as JSON.",
            mime_type="application/json",
        )
        async def history(key: str, ctx: Context) -> list[dict[str, Any]]:
            _, grants = self._caller(ctx)
            try:
                return await self._directory().history(grants, unquote(key), limit=self.settings.max_history)
            except NotAllowed as exc:
                raise ResourceError(f"no session {unquote(key)!r} for this token") from exc

        return server

    async def ask(self, caller: str, session: str, text: str, request_id: str | None = None) -> str:
        if not session or len(session) > _MAX_ID:
            raise ToolError(f"session is 1 to {_MAX_ID} characters")
        if request_id is not None and not 0 < len(request_id) <= _MAX_ID:
            raise ToolError(f"request_id is 1 to {_MAX_ID} characters")
        if not text.strip() or len(text) > self.settings.max_text_chars:
            raise ToolError(f"text must be 1 to {self.settings.max_text_chars} characters")
        event = InboundEvent(
            channel=self.name,
            chat_id=caller,
            sender_id=caller,
            thread_id=session,
            chat_type=ChatType.DIRECT,
            parts=(TextPart(text=text),),
            session_scope=SessionScope.THREAD,
            # Deduplicated per caller: the inbox stores one event per (channel, external id).
            external_id=f"req:{escape_key_component(caller)}:{request_id}" if request_id else None,
            metadata={"mcp": {"caller": caller, "session": session}},
        )
        [result] = await self.context.accept([event])
        if result.skipped:
            raise ToolError("this caller is not allowed here")
        waited = await self.context.wait_for_replies(result.event_id, self.settings.wait_max_seconds)
        if not waited.done:
            raise ToolError(
                f"no answer within {self.settings.wait_max_seconds:g} s; the question stays queued "
                "and its answer will be in get_history"
            )
        return "\n\n".join(r.text for r in waited.replies if r.text)

    # --- ASGI ---------------------------------------------------------------------------

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve `/mcp` (mounted by `app.api.routes.mounted`): the bearer check, then the SDK."""
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self.settings.tokens or self.grant(headers.get("authorization")) is None:
            response = JSONResponse(
                {"error": "unauthorized", "detail": "missing or unknown bearer token (MCP_SERVER_TOKENS)"},
                status_code=401,
                headers={"WWW-Authenticate": 'Bearer realm="mcp"'},
            )
            await response(scope, receive, send)
            return
        await self.server.session_manager.handle_request(scope, receive, send)


def _quietly_built(name: str, instructions: str) -> MCPServer:
    """`MCPServer(...)`, without the side effect of its constructor on the process's logging:
    it calls `logging.basicConfig` (a rich handler at INFO on the root logger), which would
    print every library's INFO lines beside chatgate's structured log."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        return MCPServer(name, instructions=instructions, log_level="WARNING")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
