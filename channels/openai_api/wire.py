"""OpenAI's wire format: the request we read, the objects and errors we answer.

Shapes follow the API reference and what the official SDKs parse: errors as
`{"error": {"message", "type", "param", "code"}}`, completions as `chat.completion`,
stream chunks as `chat.completion.chunk` server-sent events ended by `data: [DONE]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse

ROLES = ("system", "developer", "user", "assistant", "tool", "function")


class ApiError(Exception):
    """An error answered in OpenAI's shape; nothing was stored when it is raised before accept."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": 'Bearer realm="openai"'} if self.status == 401 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


@dataclass(frozen=True)
class Said:
    role: str
    text: str


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[Said, ...]
    stream: bool
    include_usage: bool

    def new_text(self) -> str:
        """The trailing user messages: what a kept session has not seen yet."""
        new = self._trailing_users()
        return "\n\n".join(m.text for m in new)

    def whole_text(self) -> str:
        """A one-off request: the earlier messages as a labelled transcript, then the new
        message(s). The model sees them as one user message (see docs/openai-api.md)."""
        new = self._trailing_users()
        earlier = self.messages[: len(self.messages) - len(new)]
        if not earlier:
            return self.new_text()
        lines = ["Earlier messages of this conversation, as the client sent them:"]
        lines += [f"[{m.role}] {m.text}" for m in earlier if m.text]
        return "\n".join(lines) + "\n\n" + self.new_text()

    def _trailing_users(self) -> tuple[Said, ...]:
        count = 0
        for message in reversed(self.messages):
            if message.role != "user":
                break
            count += 1
        return self.messages[len(self.messages) - count :]


def _text_of(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    400, "only text content parts are supported here", param=f"messages[{index}].content"
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise ApiError(
        400, "content must be a string or a list of text parts", param=f"messages[{index}].content"
    )


def parse_chat_request(raw: bytes, *, max_messages: int, max_text_chars: int) -> ChatRequest:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ApiError(400, "the body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "you must provide a model parameter", param="model")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty array", param="messages")
    if len(messages) > max_messages:
        raise ApiError(400, f"at most {max_messages} messages per request", param="messages")
    said = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise ApiError(400, f"role must be one of {', '.join(ROLES)}", param=f"messages[{index}].role")
        said.append(Said(role=str(message["role"]), text=_text_of(message.get("content"), index)))
    if said[-1].role != "user":
        raise ApiError(400, "the last message must be a user message", param="messages")
    if not any(m.text.strip() for m in said if m.role == "user"):
        raise ApiError(400, "the user message is empty", param="messages")
    if sum(len(m.text) for m in said) > max_text_chars:
        raise ApiError(400, f"the messages are longer than {max_text_chars} characters", param="messages")
    n = data.get("n", 1)
    if n not in (1, None):
        raise ApiError(400, "only n=1 is supported", param="n")
    stream = data.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "stream must be a boolean", param="stream")
    options = data.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return ChatRequest(
        model=model,
        messages=tuple(said),
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
    )


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(
    completion_id: str, created: int, model: str, text: str, tokens: tuple[int, int]
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(*tokens),
    }


def chunk(
    completion_id: str,
    created: int,
    model: str,
    delta: dict[str, Any] | None,
    *,
    finish: str | None = None,
    with_usage: bool = False,
    tokens: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """One stream chunk; `delta` None: the usage chunk (no choices) that ends the stream."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
    }
    if with_usage:  # the API sends `usage: null` on every chunk but the last when asked
        body["usage"] = usage(*tokens) if tokens is not None else None
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def models_list(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [model_object(n, created) for n in names]}


def model_object(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "chatgate"}
