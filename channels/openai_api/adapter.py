"""The OpenAI-compatible API: `GET /v1/models`, `POST /v1/chat/completions`.

A completion is an event like any platform's: accepted into the inbox (durable before
anything runs, deduplicated on the caller's `Idempotency-Key`), handled in its session's
turn order, answered from its outbox rows (`delivers = False`: the caller reads them), so
a retry with the same key gets the stored answer and any replica can answer it.

`Authorization: Bearer <token>` names the caller (`OPENAI_API_TOKENS`). With the header
`X-Chatgate-Session: <id>` the conversation is kept in the session
`openai:<caller>:<id>` (another caller's same id is another session); without it every
request gets a session of its own, `openai:<caller>:once-<random>`, named in the
response's `X-Chatgate-Session` header.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from app.channel import AgentListing, ChannelContext, EventStatus, SendResult
from app.events import ChatType, InboundEvent, OutboundMessage, SessionScope, TextPart, escape_key_component
from channels.openai_api import wire
from channels.openai_api.settings import OpenAIApiSettings
from channels.openai_api.wire import ApiError

DEFAULT_MODEL = "chatgate"  # the gateway's default agent, as a model
SESSION_HEADER = "x-chatgate-session"
MODELS_PATH = "/v1/models"
COMPLETIONS_PATH = "/v1/chat/completions"
PATHS = {MODELS_PATH: ["GET"], MODELS_PATH + "/{model}": ["GET"], COMPLETIONS_PATH: ["POST"]}
_MAX_ID = 200
# A stream sends an SSE comment this often while the turn runs, so that proxies and
# clients with read timeouts keep the connection (the SDKs skip comment lines).
_KEEPALIVE_SECONDS = 10.0


@dataclass(frozen=True)
class _Accepted:
    event_id: str
    session: str
    model: str


class OpenAIChannel:
    name = "openai"
    delivers = False  # the caller reads the answer from the response

    def __init__(self, settings: OpenAIApiSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self._started = int(time.time())

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> SendResult:
        return SendResult()  # never called: `delivers` is False

    # --- who is asking ------------------------------------------------------------------

    def caller(self, authorization: str | None) -> str | None:
        """The caller a bearer token names, compared in constant time with every token."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        found = None
        for known, name in self.settings.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                found = name
        return found

    def models(self, caller: str) -> dict[str, AgentListing | None]:
        """The models this caller may name: `chatgate` (the default agent), and each other
        agent that does not restrict its users or lists this caller."""
        found: dict[str, AgentListing | None] = {DEFAULT_MODEL: None}
        for agent in self.context.agents:
            if not agent.default and (not agent.users or caller in agent.users):
                found[agent.name] = agent
        return found

    # --- ASGI ---------------------------------------------------------------------------

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve `/v1/…` (mounted by `app.api.routes.openai_api`)."""
        request = Request(scope, receive)
        try:
            response = await self._serve(request)
        except ApiError as exc:
            response = exc.response()
        await response(scope, receive, send)

    async def _serve(self, request: Request) -> Response:
        if not self.settings.tokens:
            raise ApiError(
                401, "no API callers are configured here (OPENAI_API_TOKENS)", code="invalid_api_key"
            )
        caller = self.caller(request.headers.get("authorization"))
        if caller is None:
            # Never echo what was sent: it may be a real key of another service.
            raise ApiError(401, "missing or unknown bearer token", code="invalid_api_key")
        path = request.url.path
        if path == MODELS_PATH:
            names = list(self.models(caller))
            return JSONResponse(wire.models_list(names, self._started))
        if path.startswith(MODELS_PATH + "/"):
            name = path[len(MODELS_PATH) + 1 :]
            if name not in self.models(caller):
                raise ApiError(
                    404, f"the model {name!r} does not exist", code="model_not_found", param="model"
                )
            return JSONResponse(wire.model_object(name, self._started))
        return await self._completions(request, caller)

    # --- completions --------------------------------------------------------------------

    async def _completions(self, request: Request, caller: str) -> Response:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.settings.max_body_bytes:
            raise ApiError(413, f"the body is over {self.settings.max_body_bytes} bytes")
        body = await request.body()
        if len(body) > self.settings.max_body_bytes:
            raise ApiError(413, f"the body is over {self.settings.max_body_bytes} bytes")
        chat = wire.parse_chat_request(
            body, max_messages=self.settings.max_messages, max_text_chars=self.settings.max_text_chars
        )
        accepted = await self._accept(request, caller, chat)
        headers = {"X-Chatgate-Session": accepted.session, "X-Chatgate-Event-Id": accepted.event_id}
        completion_id = f"chatcmpl-{accepted.event_id}"
        if chat.stream:
            return StreamingResponse(
                self._stream(accepted, completion_id, chat.include_usage),
                media_type="text/event-stream",
                headers={**headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        status = await self._answered(accepted.event_id, self.settings.wait_max_seconds)
        return JSONResponse(
            wire.completion(
                completion_id, _created(status), accepted.model, _answer(status), _tokens(status)
            ),
            headers=headers,
        )

    async def _accept(self, request: Request, caller: str, chat: wire.ChatRequest) -> _Accepted:
        """Check everything, then store the event (nothing is stored when this raises before)."""
        agents = self.models(caller)
        if chat.model not in agents:
            raise ApiError(
                404,
                f"the model {chat.model!r} does not exist (GET /v1/models)",
                code="model_not_found",
                param="model",
            )
        agent = agents[chat.model]
        session = request.headers.get(SESSION_HEADER, "").strip()
        if len(session) > _MAX_ID:
            raise ApiError(400, f"X-Chatgate-Session is at most {_MAX_ID} characters")
        text = chat.new_text() if session else chat.whole_text()
        if len(text) > self.settings.max_text_chars:
            raise ApiError(400, f"the messages are longer than {self.settings.max_text_chars} characters")
        session = session or f"once-{uuid.uuid4().hex}"
        idem = request.headers.get("idempotency-key", "").strip()
        external_id = None
        if idem:
            external_id = f"idem:{escape_key_component(caller)}:{idem}"
            if len(external_id) > 256:
                raise ApiError(400, "Idempotency-Key is too long")
        event = InboundEvent(
            channel=self.name,
            agent=agent.name if agent is not None else None,
            chat_id=caller,
            sender_id=caller,
            thread_id=session,
            chat_type=ChatType.DIRECT,
            parts=(TextPart(text=text),),
            external_id=external_id,
            session_scope=SessionScope.THREAD,
            metadata={"openai": {"caller": caller, "session": session, "model": chat.model}},
        )
        [result] = await self.context.accept([event])
        if result.skipped:
            raise ApiError(403, "this caller is not allowed here", type="permission_error")
        if result.duplicate:  # the original request's session, whatever this one said
            stored = await self.context.events.status(result.event_id)
            if stored is not None:
                session = str(stored.metadata.get("openai", {}).get("session", session))
        return _Accepted(event_id=result.event_id, session=session, model=chat.model)

    async def _answered(self, event_id: str, timeout: float) -> EventStatus:
        """The handled event, or a 504 when it is still queued or running after `timeout`."""
        waited = await self.context.wait_for_replies(event_id, timeout)
        status = await self.context.events.status(event_id)
        if not waited.done or status is None or status.status in ("pending", "processing"):
            raise ApiError(
                504,
                f"no answer within {timeout:g} s (the session may be busy); send the request "
                "again with the same Idempotency-Key to get the answer when it is ready",
                type="timeout",
                code="timeout",
            )
        if status.status not in ("done",):
            raise ApiError(
                500,
                f"the turn failed ({status.status}): {status.error or 'no reply'}",
                type="server_error",
                code="turn_failed",
            )
        return status

    async def _stream(
        self, accepted: _Accepted, completion_id: str, include_usage: bool
    ) -> AsyncIterator[bytes]:
        """Chunks as the SDKs parse them: the role, the answer, the finish, the usage when
        asked, `[DONE]`. The answer comes when the turn stored it; until then comments
        keep the connection alive. An error after the first byte is an `error` event."""
        loop = asyncio.get_running_loop()
        first = await self.context.events.status(accepted.event_id)
        created = _created(first) if first is not None else int(time.time())

        def piece(
            delta: dict[str, object] | None, finish: str | None = None, tokens: tuple[int, int] | None = None
        ) -> bytes:
            return wire.sse(
                wire.chunk(
                    completion_id,
                    created,
                    accepted.model,
                    delta,
                    finish=finish,
                    with_usage=include_usage,
                    tokens=tokens,
                )
            )

        yield piece({"role": "assistant", "content": ""})
        deadline = loop.time() + self.settings.wait_max_seconds
        while True:
            remaining = deadline - loop.time()
            try:
                status = await self._answered(accepted.event_id, max(0.0, min(_KEEPALIVE_SECONDS, remaining)))
                break
            except ApiError as exc:
                if exc.code != "timeout" or remaining <= _KEEPALIVE_SECONDS:
                    yield wire.sse(exc.body())
                    return
            yield b": the turn is still running\n\n"
        yield piece({"content": _answer(status)})
        yield piece({}, finish="stop")
        if include_usage:
            yield piece(None, tokens=_tokens(status))
        yield wire.sse("[DONE]")


def _answer(status: EventStatus) -> str:
    """The turn's answer: its reply texts (tool calls and their results stay in the history)."""
    return "\n\n".join(r.text for r in status.replies if r.text)


def _created(status: EventStatus) -> int:
    return int(status.created_at.timestamp())


def _tokens(status: EventStatus) -> tuple[int, int]:
    return status.prompt_tokens, status.completion_tokens
