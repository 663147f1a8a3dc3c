"""The gateway's frames and close codes (docs/gateway.md is the public description)."""

from __future__ import annotations

import json
from enum import IntEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from app.events import unstorable_in


class CloseCode(IntEnum):
    NORMAL = 1000
    GOING_AWAY = 1001
    TOO_BIG = 1009
    UNAUTHORIZED = 4001
    TOKEN_EXPIRED = 4002
    TOO_SLOW = 4008
    IDLE = 4009
    UNAVAILABLE = 4503


CLOSE_REASONS = {
    CloseCode.NORMAL: "bye",
    CloseCode.GOING_AWAY: "server shutting down",
    CloseCode.TOO_BIG: "frame too big",
    CloseCode.UNAUTHORIZED: "unauthorized",
    CloseCode.TOKEN_EXPIRED: "token expired",
    CloseCode.TOO_SLOW: "too slow",
    CloseCode.IDLE: "idle",
    CloseCode.UNAVAILABLE: "browser channel not enabled",
}


class _Frame(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


ClientMessageId = Annotated[str, Field(min_length=1, max_length=200)]


class AuthFrame(_Frame):
    type: Literal["auth"]
    token: str = Field(min_length=1, max_length=4096)


class AttachFrame(_Frame):
    type: Literal["attach"]
    session_key: str | None = Field(None, min_length=1, max_length=512)
    last_seq: int | None = Field(None, ge=0)
    session_id: int | None = None


class SendFrame(_Frame):
    type: Literal["send"]
    text: str
    client_message_id: ClientMessageId | None = None


class ApprovalFrame(_Frame):
    type: Literal["approve", "deny"]
    approval_id: int
    client_message_id: ClientMessageId | None = None


class StopFrame(_Frame):
    type: Literal["stop"]
    client_message_id: ClientMessageId | None = None


class ListSessionsFrame(_Frame):
    type: Literal["list_sessions"]


class PingFrame(_Frame):
    type: Literal["ping"]


ClientFrame = Annotated[
    AuthFrame | AttachFrame | SendFrame | ApprovalFrame | StopFrame | ListSessionsFrame | PingFrame,
    Field(discriminator="type"),
]
_client_frame: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)


class BadFrame(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def parse_client_frame(text: str) -> ClientFrame:
    """Validate one client frame; `BadFrame` says what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise BadFrame(f"not JSON: {exc}") from exc
    except RecursionError as exc:
        raise BadFrame("JSON nested too deeply") from exc
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise BadFrame('a frame is a JSON object with a "type"')
    if unstorable_in(data):  # no frame field may carry what no store or UTF-8 can hold
        raise BadFrame("text contains a NUL character or a lone surrogate (\\u0000, \\ud800-\\udfff)")
    try:
        return _client_frame.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"][1:]) or "type"
        raise BadFrame(f"{data['type']!r} frame: {where}: {first['msg']}") from exc


def error_frame(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "code": code, "detail": detail, **extra}
