"""The browser gateway: `WS /ws` and issuing short-lived gateway tokens (docs/gateway.md)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, WebSocket
from pydantic import BaseModel, Field, model_validator
from starlette.websockets import WebSocketState

from app.api.bodies import RequestBody
from app.api.deps import require_admin
from app.gateway.hub import GatewayHub
from app.gateway.tokens import issue_token, prefix_problem

router = APIRouter(tags=["gateway"])


def get_gateway(request: Request) -> GatewayHub:
    hub: GatewayHub = request.app.state.gateway
    return hub


class _StarletteGatewaySocket:
    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws

    async def accept(self) -> None:
        await self._ws.accept()

    async def receive_text(self) -> str | None:
        message = await self._ws.receive()
        if message["type"] == "websocket.disconnect":
            return None
        text = message.get("text")
        if text is None:
            data = message.get("bytes") or b""
            text = data.decode("utf-8", errors="replace")
        return str(text)

    async def send_text(self, data: str) -> None:
        await self._ws.send_text(data)

    async def close(self, code: int, reason: str) -> None:
        if self._ws.application_state != WebSocketState.DISCONNECTED:
            await self._ws.close(code, reason)


@router.websocket("/ws")
async def gateway_websocket(websocket: WebSocket) -> None:
    """Browser gateway: JSON frames, token auth, live session messages."""
    hub: GatewayHub = websocket.app.state.gateway
    await hub.serve(_StarletteGatewaySocket(websocket))


class TokenRequest(RequestBody):
    subject: str = Field(min_length=1, max_length=200, description="Who talks: the events' sender_id.")
    session_keys: list[str] = Field(default_factory=list, max_length=100, description="Exact keys allowed.")
    key_prefix: str | None = Field(None, max_length=512, description='Keys under this prefix ("" = all).')
    ttl_seconds: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Lifetime; default GATEWAY_TOKEN_TTL_SECONDS."
    )

    @model_validator(mode="after")
    def _some_scope(self) -> TokenRequest:
        if not self.session_keys and self.key_prefix is None:
            raise ValueError("give session_keys or key_prefix: a token must allow some session")
        if self.key_prefix is not None and (problem := prefix_problem(self.key_prefix)):
            raise ValueError(problem)
        return self


class TokenResponse(BaseModel):
    token: str
    subject: str
    session_keys: list[str]
    key_prefix: str | None
    expires_at: str


@router.post(
    "/admin/api/gateway-tokens",
    status_code=201,
    response_model=TokenResponse,
    dependencies=[Depends(require_admin)],
    tags=["admin"],
)
async def issue_gateway_token(body: TokenRequest, hub: GatewayHub = Depends(get_gateway)) -> dict[str, Any]:
    """Issue a short-lived signed gateway token for the given subject and session keys."""
    settings = hub.settings
    if not settings.gateway_token_secret:
        raise HTTPException(503, "signed gateway tokens are disabled: set GATEWAY_TOKEN_SECRET")
    ttl = body.ttl_seconds or settings.gateway_token_ttl_seconds
    if ttl > settings.gateway_token_max_ttl_seconds:
        raise HTTPException(400, f"ttl_seconds is over the limit of {settings.gateway_token_max_ttl_seconds}")
    token, grant = issue_token(
        settings.gateway_token_secret,
        subject=body.subject,
        session_keys=body.session_keys,
        key_prefix=body.key_prefix,
        ttl_seconds=ttl,
    )
    assert grant.expires_at is not None
    return {
        "token": token,
        "subject": grant.subject,
        "session_keys": list(grant.session_keys),
        "key_prefix": grant.key_prefix,
        "expires_at": datetime.fromtimestamp(grant.expires_at, UTC).isoformat().replace("+00:00", "Z"),
    }
