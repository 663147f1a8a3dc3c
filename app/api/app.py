"""`create_app(settings)`: the FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.asyncexitstack import AsyncExitStackMiddleware
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.middleware import Middleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.middleware.exceptions import ExceptionMiddleware
from starlette.types import ASGIApp, ExceptionHandler, Receive, Scope, Send

from app import tracing
from app.agent.provider import ChatProvider
from app.agent.tools import Tool
from app.alerts import AlertSettings, build_monitor
from app.api import docs as api_docs
from app.api import responses
from app.api.door import Door
from app.api.limits import UrlGuard
from app.api.responses import SafeJSONResponse
from app.api.routes import a2a as a2a_routes
from app.api.routes import (
    admin,
    admin_dashboard,
    admin_data,
    admin_dead_letters,
    admin_memory,
    admin_usage,
    channels,
    health,
)
from app.api.routes import admin_access as access_routes
from app.api.routes import admin_config as config_routes
from app.api.routes import admin_live as live_routes
from app.api.routes import admin_weixin as weixin_routes
from app.api.routes import cron as cron_routes
from app.api.routes import gateway as gateway_routes
from app.api.routes import mounted as mounted_routes
from app.assembly.storage import StoreWrapper
from app.channel import ChannelSettings
from app.config import Settings
from app.db.outage import Outage
from app.errors import ChannelRequestError
from app.gateway.hub import GatewayHub
from app.logs import configure_logging, secret_values
from app.runtime import Runtime
from app.tracing import TracingSettings, configure_tracing
from app.web import access_page
from app.web import pages as web_pages
from app.web.admin_auth import AdminLockout

NO_NATIVE_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


class ChatgateApp(FastAPI):
    """FastAPI with one middleware stack for every request, the platform webhooks too.

    Outermost come the URL guard and tracing (around Starlette's 500, so a span records
    it), then FastAPI's stack and the app's own (`create_app`). `/channels` is mounted as
    the first route (`app.api.routes.channels.ChannelsApp`); its OpenAPI operations are
    added to the generated document.
    """

    def __init__(self, **kwargs: Any) -> None:
        # chatgate traces with its own provider (`app.tracing`, OTEL_*): FastAPI's native
        # telemetry would only look up the global providers on every request (and, with a
        # global provider set by someone else, give a request a second server span).
        super().__init__(telemetry=NO_NATIVE_TELEMETRY, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What `FastAPI.__call__` and `Starlette.__call__` do for a request when native
        # telemetry is off (it always is here), in one coroutine instead of two: every
        # request holds its callers' coroutines while it runs.
        if scope["type"] == "lifespan" or self.root_path:
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        await self.middleware_stack(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        return UrlGuard(tracing.asgi(self._fastapi_stack()))

    def _fastapi_stack(self) -> ASGIApp:
        """FastAPI's stack (`FastAPI.build_middleware_stack`) without its two layers that
        cannot act here: the native-telemetry exception hook (telemetry is off) and the
        app-wide `max_body_size` (unset: `app.api.door.Door` holds the one body limit).
        Every request, each webhook too, would hold their coroutines while it runs."""
        if self.max_body_size is not None:
            return super().build_middleware_stack()
        error_handler = None
        handlers: dict[Any, ExceptionHandler] = {}
        for key, value in self.exception_handlers.items():
            if key in (500, Exception):
                error_handler = value
            else:
                handlers[key] = value
        middleware = [
            Middleware(ServerErrorMiddleware, handler=error_handler, debug=self.debug),
            *self.user_middleware,
            Middleware(ExceptionMiddleware, handlers=handlers, debug=self.debug),
            Middleware(AsyncExitStackMiddleware),  # FastAPI closes a request's files here
        ]
        app: ASGIApp = self.router
        for cls, args, kwargs in reversed(middleware):
            app = cls(app, *args, **kwargs)
        return app

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            schema["paths"] = {**channels.openapi_paths(), **schema["paths"]}
        return self.openapi_schema  # type: ignore[return-value]


def create_app(
    settings: Settings,
    *,
    channel_settings: Mapping[str, ChannelSettings] | None = None,
    provider: ChatProvider | None = None,
    tools: Sequence[Tool] | None = None,
    alert_settings: AlertSettings | None = None,
    wrap_store: StoreWrapper | None = None,
) -> FastAPI:
    """Build the app; nothing connects until the lifespan starts the runtime.

    `wrap_store` wraps the storage port the assembly chose (tests record its operations)."""
    configure_logging(settings.log_level, settings.log_format)
    configure_tracing(TracingSettings())  # on only with an OTLP endpoint (docs/observability.md)
    runtime = Runtime(
        settings, channel_settings=channel_settings, provider=provider, tools=tools, wrap_store=wrap_store
    )
    # Again, now that every served channel's settings are known: their secrets are blanked
    # wherever they appear in a log line (a library may quote the token it was refused).
    configure_logging(
        settings.log_level,
        settings.log_format,
        secrets=secret_values(settings, *runtime.channel_settings.values()),
    )
    gateway = GatewayHub(runtime)
    alerts = build_monitor(alert_settings or AlertSettings(), runtime, runtime.http)
    outage = Outage(runtime.engine, retry_after=settings.db_outage_retry_after_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        await gateway.start()
        if alerts is not None:
            alerts.start()
        try:
            yield
        finally:
            if alerts is not None:
                await alerts.stop()
            await gateway.stop()
            await runtime.stop()
            await outage.aclose()

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
    app.state.outage = outage
    app.state.admin_failures = AdminLockout(
        runtime.engine, settings.admin_max_failures, settings.admin_lockout_seconds
    )
    # The platform webhooks: the first route, so matching it is one regular expression.
    app.router.routes.insert(0, channels.mount(runtime))
    # The outage 503, admin authentication before the body, the body limit; webhooks refuse
    # a declared length themselves (their channel's limit, their shape).
    app.add_middleware(
        Door, outage=outage, limit=settings.max_body_bytes, checked_by_route=(channels.PREFIX + "/",)
    )

    @app.exception_handler(ChannelRequestError)
    async def _channel_error(_request: Request, exc: ChannelRequestError) -> JSONResponse:
        return channels.error_response(exc)

    responses.install(app)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(admin_memory.router)
    app.include_router(admin_data.router)
    app.include_router(admin_usage.router)
    app.include_router(cron_routes.router)
    app.include_router(admin_dashboard.router)
    app.include_router(config_routes.router)
    app.include_router(live_routes.router)
    app.include_router(admin_dead_letters.router)
    app.include_router(access_routes.router)
    app.include_router(weixin_routes.router)  # the personal WeChat QR login (404 unless enabled)
    app.include_router(access_page.router)
    app.include_router(gateway_routes.router)
    web_pages.install(app)
    a2a_routes.install(app)
    mounted_routes.install(app)  # /v1 (OpenAI-compatible API), /mcp (MCP server)
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
