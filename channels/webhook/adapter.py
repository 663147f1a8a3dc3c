"""Generic signed webhook: any system that can sign an HTTP POST can talk to chatgate.

Replies come back synchronously (`?wait=true`, bounded) or are POSTed, signed the same
way, to `WEBHOOK_CALLBACK_URL` with retries by the outbox.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, ChannelSettings, SendResult
from app.errors import ChannelNotConfigured, InvalidPayload
from app.events import ChatType, InboundEvent, OutboundMessage, TextPart
from app.signed_callback import post_signed
from channels.webhook import signing


class WebhookSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="WEBHOOK_", env_file=".env", extra="ignore")

    secret: str | None = Field(None, description="HMAC-SHA256 key shared with the sender.")
    callback_url: str | None = Field(None, description="Replies are POSTed here when set.")
    wait_max_seconds: float = Field(30.0, description="Upper bound of ?wait=true.")
    timestamp_tolerance_seconds: int = Field(300, description="Allowed clock difference.")
    max_text_chars: int = Field(32_000, description="Longer texts get 400.")


class WebhookBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    chat_id: str = Field(min_length=1, max_length=256)
    sender_id: str = Field(min_length=1, max_length=256)
    text: str
    thread_id: str | None = Field(None, max_length=256)
    message_id: str | None = Field(None, min_length=1, max_length=200)
    session_key: str | None = Field(None, min_length=1, max_length=512)
    chat_type: ChatType = ChatType.DIRECT

    @field_validator("chat_id", "sender_id", "thread_id", "message_id", mode="before")
    @classmethod
    def _ids_may_be_numbers(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value


# Why an event was not taken (`AcceptResult.reason`, app.access), in the answer's `detail`.
_SKIPPED = {
    "not_allowed": "sender not allowed",
    "pairing": "sender not paired yet: approve its pairing code first",
    "quota": "over quota: nothing was run",
}


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


class WebhookChannel:
    name = "webhook"

    def __init__(self, settings: WebhookSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # --- inbound ----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path not in ("", "/"):
            return ChannelResponse.json({"error": "not_found", "detail": "POST /channels/webhook"}, 404)
        event = self.parse(request)
        # Every parameter is checked before the inbox commit: an error means nothing stored.
        wait = _truthy(request.query.get("wait"))
        timeout = self._wait_timeout(request.query.get("timeout"))
        [result] = await self.context.accept([event])
        body: dict[str, Any] = {"event_id": result.event_id, "session_key": result.session_key}
        if result.duplicate:
            body["duplicate"] = True
        if result.skipped:
            reason = result.reason or "not_allowed"
            body.update(skipped=True, reason=reason, detail=_SKIPPED.get(reason, reason))
            if result.notice:  # what the sender was told (a pairing code, a quota notice)
                body["notice"] = result.notice
            return ChannelResponse.json(body, 202)
        if not wait:
            return ChannelResponse.json(body, 200 if result.duplicate else 202)
        waited = await self.context.wait_for_replies(result.event_id, timeout)
        body["replies"] = [
            {"message_id": r.message_id, "text": r.text, "parts": r.parts, "status": r.status}
            for r in waited.replies
        ]
        if not waited.done:
            body["pending"] = True
            return ChannelResponse.json(body, 202)
        return ChannelResponse.json(body, 200)

    def parse(self, request: ChannelRequest) -> InboundEvent:
        """Verify the signature, then validate the body; raises a 4xx error otherwise."""
        if not self.settings.secret:
            raise ChannelNotConfigured("WEBHOOK_SECRET is not set on this server")
        signing.verify(
            self.settings.secret,
            request.headers.get(signing.TIMESTAMP_HEADER),
            request.headers.get(signing.SIGNATURE_HEADER),
            request.body,
            tolerance=self.settings.timestamp_tolerance_seconds,
        )
        data = request.json()
        if not isinstance(data, dict):
            raise InvalidPayload("body must be a JSON object")
        try:
            body = WebhookBody.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidPayload(problems) from exc
        if len(body.text) > self.settings.max_text_chars:
            raise InvalidPayload(f"text is longer than {self.settings.max_text_chars} characters")
        idem = request.headers.get("idempotency-key")
        external_id = f"idem:{idem}" if idem else (f"msg:{body.message_id}" if body.message_id else None)
        if external_id is not None and len(external_id) > 256:
            raise InvalidPayload("Idempotency-Key is longer than 250 characters")
        return InboundEvent(
            channel=self.name,
            chat_id=body.chat_id,
            sender_id=body.sender_id,
            thread_id=body.thread_id,
            chat_type=body.chat_type,
            parts=(TextPart(text=body.text),),
            external_id=external_id,
            session_scope=self.settings.session_scope,
            session_key_override=body.session_key if self.settings.allow_session_override else None,
        )

    def _wait_timeout(self, raw: str | None) -> float:
        limit = self.settings.wait_max_seconds
        if raw is None:
            return limit
        try:
            value = float(raw)
        except ValueError as exc:
            raise InvalidPayload("timeout must be a number of seconds") from exc
        if not math.isfinite(value):
            raise InvalidPayload("timeout must be a finite number of seconds")
        return max(0.0, min(value, limit))

    # --- outbound ---------------------------------------------------------------------

    @property
    def delivers(self) -> bool:
        """Without a callback URL replies are read (?wait=true, the admin API): nothing to send."""
        return bool(self.settings.callback_url)

    async def send(self, message: OutboundMessage) -> SendResult:
        if not self.settings.callback_url:
            return SendResult()  # delivered through ?wait=true or the admin API
        assert self.settings.secret, "a callback needs WEBHOOK_SECRET to sign it"
        payload = {
            "message_id": message.message_id,
            "event_id": message.in_reply_to_event,
            "session_key": message.session_key,
            "chat_id": message.chat_id,
            "thread_id": message.thread_id,
            "text": message.text,
            "parts": [p.model_dump(mode="json") for p in message.parts],
        }
        raw = json.dumps(payload, ensure_ascii=False).encode()
        await post_signed(
            self.context.http,
            self.settings.callback_url,
            raw,
            secret=self.settings.secret,
            headers={"Idempotency-Key": message.message_id},
        )
        return SendResult(platform_message_id=None)
