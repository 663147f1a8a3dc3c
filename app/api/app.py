"""`create_app(settings)`: the FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from app import tracing
from app.agent.provider import ChatProvider
from app.agent.tools import Tool
from app.api import docs as api_docs
from app.api import responses
from app.api.limits import AdminAuthFirst, BodyLimit, UrlGuard
from app.api.responses import SafeJSONResponse
from app.api.routes import a2a as a2a_routes
from app.api.routes import admin, admin_dashboard, admin_dead_letters, admin_memory, channels, health
from app.api.routes import admin_access as access_routes
from app.api.routes import cron as cron_routes
from app.api.routes import gateway as gateway_routes
from app.channel import ChannelSettings
from app.config import Settings
from app.errors import ChannelRequestError
from app.gateway.hub import GatewayHub
from app.logs import configure_logging
from app.runtime import Runtime
from app.tracing import TracingSettings, configure_tracing
from app.web import access_page
from app.web import pages as web_pages
from app.web.admin_auth import AdminLockout


class ChatgateApp(FastAPI):
    """FastAPI, with platform webhooks (`/channels/...` over HTTP) served before its routing.

    See `app.api.routes.channels.serve_http`: the webhook path is the one every event
    takes, and FastAPI's per-request machinery was a sixth of a loaded server's CPU.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The URL guard comes first, for the fast channel path too.
        guard = self.__dict__.get("_url_guard")
        if guard is None:
            guard = self.__dict__["_url_guard"] = UrlGuard(tracing.asgi(self._dispatch))
        await guard(scope, receive, send)

    async def _dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in channels.HTTP_METHODS
            and scope["path"].startswith(channels.PREFIX, len(scope.get("root_path", "")))
        ):
            await channels.serve_http(self.state.runtime, scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(
    settings: Settings,
    *,
    channel_settings: Mapping[str, ChannelSettings] | None = None,
    provider: ChatProvider | None = None,
    tools: Sequence[Tool] | None = None,
) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts the runtime."""
    configure_logging(settings.log_level, settings.log_format)
    configure_tracing(TracingSettings())  # on only with an OTLP endpoint (docs/observability.md)
    runtime = Runtime(settings, channel_settings=channel_settings, provider=provider, tools=tools)
    gateway = GatewayHub(runtime)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()
            await runtime.stop()

    app = ChatgateApp(
        title="chatgate",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
        docs_url=None,
        redoc_url=None,
    )
    app.state.runtime = runtime
    app.state.settings = settings
    app.state.gateway = gateway
    app.state.admin_failures = AdminLockout(
        runtime.engine, settings.admin_max_failures, settings.admin_lockout_seconds
    )
    # Added last runs first: authentication, then the body limit, then the routes.
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(AdminAuthFirst)

    @app.exception_handler(ChannelRequestError)
    async def _channel_error(_request: Request, exc: ChannelRequestError) -> JSONResponse:
        return channels.error_response(exc)

    responses.install(app)
    app.include_router(health.router)
    app.include_router(channels.router)
    app.include_router(admin.router)
    app.include_router(admin_memory.router)
    app.include_router(cron_routes.router)
    app.include_router(admin_dashboard.router)
    app.include_router(admin_dead_letters.router)
    app.include_router(access_routes.router)
    app.include_router(access_page.router)
    app.include_router(gateway_routes.router)
    web_pages.install(app)
    a2a_routes.install(app)
    api_docs.install(app)
    return app


def server_options(app: FastAPI) -> dict[str, Any]:
    """uvicorn options the app needs, for `chatgate serve` and tests alike.

    `ws_max_size` bounds every WebSocket frame, the first one included, before anything of
    it is buffered: the largest frame any WebSocket endpoint takes (`GATEWAY_MAX_FRAME_BYTES`,
    `ONEBOT_MAX_FRAME_BYTES`); each endpoint checks its own, smaller limit after. Forwarded
    headers are never applied by the server: only `TRUSTED_PROXIES` decides whom to believe.
    """
    settings: Settings = app.state.settings
    runtime: Runtime = app.state.runtime
    frame_limits = [settings.gateway_max_frame_bytes]
    frame_limits += [
        int(limit)
        for channel_settings in runtime.channel_settings.values()
        if (limit := getattr(channel_settings, "max_frame_bytes", None)) is not None
    ]
    return {"ws_max_size": max(frame_limits), "proxy_headers": False}
