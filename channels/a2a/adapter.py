"""The A2A channel: the SDK's Agent Card and JSON-RPC routes, behind our bearer check.

`GET /.well-known/agent-card.json` is public; `POST /a2a` needs `Authorization: Bearer
<token>` with a token of `A2A_TOKENS`, which names the caller. The caller and the
`contextId` make the session key (`a2a:<caller>:<contextId>`, components escaped), so a
context belongs to its caller. Replies are read from the inbox and outbox rows
(`delivers = False`); a caller that gave a push config is also told each state change
of its task by a signed POST (`channels.a2a.push`, through the outbox).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import unquote

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.routes.common import DefaultServerCallContextBuilder
from a2a.server.routes.jsonrpc_routes import create_jsonrpc_routes
from a2a.types.a2a_pb2 import AgentCard
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from app.channel import AgentListing, ChannelContext, SendResult
from app.events import OutboundMessage
from channels.a2a.card import AGENTS_PATH, RPC_PATH, agent_card
from channels.a2a.guard import is_post, read_body, replay, screen
from channels.a2a.handler import AGENT, CALLER, ChatgateRequestHandler
from channels.a2a.params import check_params
from channels.a2a.settings import A2ASettings
from channels.a2a.versions import negotiate_version

PATHS = (RPC_PATH, AGENT_CARD_WELL_KNOWN_PATH)


class _Caller(User):
    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self._name


class _CallerContextBuilder(DefaultServerCallContextBuilder):
    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        caller = request.scope[CALLER]
        context.state[CALLER] = caller
        context.state[AGENT] = request.scope.get(AGENT)
        headers = context.state.get("headers")
        if isinstance(headers, dict):  # the version header is read from here; the token is not
            headers.pop("authorization", None)
        context.user = _Caller(caller)
        return context


def _unauthorized(detail: str) -> JSONResponse:
    return JSONResponse(
        {"error": "unauthorized", "detail": detail},
        status_code=401,
        headers={"WWW-Authenticate": 'Bearer realm="a2a"'},
    )


class A2AChannel:
    name = "a2a"
    delivers = False  # callers read replies (message/send, tasks/get, the stream)

    def __init__(self, settings: A2ASettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.handler = ChatgateRequestHandler(settings, context, self.name)
        self._rpc = Router(
            routes=create_jsonrpc_routes(
                self.handler, RPC_PATH, context_builder=_CallerContextBuilder(), enable_v0_3_compat=True
            )
        )
        self._card_route = Route(AGENT_CARD_WELL_KNOWN_PATH, self._card, methods=["GET"])

    async def start(self) -> None:
        await self.handler.push.start(self.handler.status_event)

    async def stop(self) -> None:
        await self.handler.push.stop()

    async def send(self, message: OutboundMessage) -> SendResult:
        """Only push notifications come here; replies are read by the caller."""
        if "a2a_push" in message.metadata:
            await self.handler.push.send(message)
        return SendResult()

    def card(self, base_url: str, agent: AgentListing | None = None) -> AgentCard:
        return agent_card(
            self.settings,
            self.settings.public_base_url or base_url,
            push=self.handler.push.offered,
            agent=agent,
        )

    async def _card(self, request: Request) -> JSONResponse:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        base = str(request.base_url)
        default = next((a for a in self.context.agents if a.default), None)
        return JSONResponse(agent_card_to_dict(self.card(base, request.scope.get(AGENT) or default)))

    def _agent_in(self, scope: Scope) -> tuple[AgentListing | None, str]:
        """The agent a `/a2a/agents/<name>…` path names (None: unknown), and the rest of the path."""
        name, _, rest = scope["path"][len(AGENTS_PATH) :].partition("/")
        found = next((a for a in self.context.agents if a.name == unquote(name)), None)
        return found, "/" + rest if rest else ""

    def caller(self, authorization: str | None) -> str | None:
        """The caller named by a bearer token, compared in constant time with every token."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        found = None
        for known, name in self.settings.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                found = name
        return found

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve `/a2a` and the Agent Card, and with several agents `/a2a/agents/<name>` and
        its card (mounted by `app.api.routes.a2a`)."""
        if scope["path"].startswith(AGENTS_PATH):
            agent, rest = self._agent_in(scope)
            if agent is None or rest not in ("", AGENT_CARD_WELL_KNOWN_PATH):
                await JSONResponse(
                    {"error": "not_found", "detail": "no such agent here (see AGENTS_FILE)"}, status_code=404
                )(scope, receive, send)
                return
            scope = {**scope, "path": rest or RPC_PATH, "raw_path": (rest or RPC_PATH).encode(), AGENT: agent}
        if scope["path"] == AGENT_CARD_WELL_KNOWN_PATH:
            await self._card_route.handle(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        response: Any = None
        if not self.settings.tokens:
            response = _unauthorized("no A2A callers are configured (A2A_TOKENS)")
        else:
            caller = self.caller(headers.get("authorization"))
            if caller is None:
                response = _unauthorized("missing or unknown bearer token")
            else:
                declared = headers.get("content-length", "")
                if declared.isdigit() and int(declared) > self.settings.max_body_bytes:
                    response = JSONResponse(
                        {
                            "error": "payload_too_large",
                            "detail": f"over {self.settings.max_body_bytes} bytes",
                        },
                        status_code=413,
                    )
                scope = {**scope, CALLER: caller}
        if response is None and is_post(scope):
            body = await read_body(receive, self.settings.max_body_bytes)
            if len(body) > self.settings.max_body_bytes:  # a chunked body declares no length
                response = JSONResponse(
                    {"error": "payload_too_large", "detail": f"over {self.settings.max_body_bytes} bytes"},
                    status_code=413,
                )
            else:
                response = screen(body)
                receive = replay(body, receive)
        if response is not None:
            await response(scope, receive, send)
            return
        body = await read_body(receive, self.settings.max_body_bytes)  # replayed when read above
        scope, refusal = negotiate_version(scope, body)
        refusal = refusal or check_params(body)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self._rpc(scope, replay(body, receive), send)
