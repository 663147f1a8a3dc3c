"""The Messaging API calls chatgate makes, through the official SDK (`linebot.v3.messaging`).

The SDK's client is pointed at `LINE_API_BASE_URL` (its `Configuration(host=…)`), and
its errors become the outbox's typed delivery errors: 429 and 5xx are retried with
backoff, 401/403 are a credentials problem, other 4xx a refusal.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
from linebot.v3.messaging import (
    ApiException,
    AsyncApiClient,
    AsyncMessagingApi,
    Configuration,
    ConfirmTemplate,
    ImageMessage,
    PostbackAction,
    PushMessageRequest,
    ReplyMessageRequest,
    ShowLoadingAnimationRequest,
    TemplateMessage,
    TextMessage,
)

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)
from channels.line.settings import LineSettings

# Retry keys are UUIDs derived from the outbound message id and the batch, so a retry of
# the same push (even from another replica after a crash) carries the same key, and LINE
# answers 409 instead of delivering it twice.
_RETRY_NAMESPACE = uuid.UUID("5b0c1c8e-9a55-4c51-9d7e-2f0d6f1c6a11")


@dataclass(frozen=True)
class Image:
    """An image message: LINE fetches it from a public https URL (there is no upload)."""

    url: str


@dataclass(frozen=True)
class Confirm:
    """A confirm template: a short text and two postback buttons (label, postback data)."""

    text: str
    buttons: tuple[tuple[str, str], tuple[str, str]]


Item = str | Image | Confirm  # one message object: a text, an image, or two buttons


class InvalidReplyToken(ChannelRejected):
    """The reply token was used already or has expired: push instead."""


class AlreadyAccepted(ChannelRejected):
    """409 to a push with a retry key: an earlier attempt got through."""


def retry_key(outbound_id: str, batch: int) -> str:
    return str(uuid.uuid5(_RETRY_NAMESPACE, f"{outbound_id}:{batch}"))


class LineApi:
    def __init__(self, settings: LineSettings) -> None:
        self.settings = settings
        self._client: AsyncApiClient | None = None

    def _api(self) -> AsyncMessagingApi:
        if not self.settings.channel_access_token:
            raise ChannelSendAuthError("LINE_CHANNEL_ACCESS_TOKEN is needed to send")
        if self._client is None:  # made in the running loop: the SDK opens an aiohttp session
            config = Configuration(
                host=self.settings.api_base_url.rstrip("/"),
                access_token=self.settings.channel_access_token,
            )
            self._client = AsyncApiClient(config)
        return AsyncMessagingApi(self._client)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def reply(self, token: str, items: list[Item], quote_token: str | None = None) -> list[str]:
        messages = _messages(items, quote_token)
        request = ReplyMessageRequest(replyToken=token, messages=messages)
        answer = await self._call(self._api().reply_message(request, _request_timeout=self._timeout))
        return _sent_ids(answer)

    async def push(self, to: str, items: list[Item], key: str) -> list[str]:
        request = PushMessageRequest(to=to, messages=_messages(items, None))
        call = self._api().push_message(request, x_line_retry_key=key, _request_timeout=self._timeout)
        return _sent_ids(await self._call(call))

    async def member_name(self, chat_id: str, user_id: str) -> str | None:
        """A group (`C…`) or room (`R…`) member's display name; None when LINE has none
        for them (not a member any more, or never added the bot as a friend)."""
        api = self._api()
        if chat_id.startswith("R"):
            call = api.get_room_member_profile(chat_id, user_id, _request_timeout=self._timeout)
        else:
            call = api.get_group_member_profile(chat_id, user_id, _request_timeout=self._timeout)
        profile = await self._call(call)
        name = getattr(profile, "display_name", None)
        return name.strip() or None if isinstance(name, str) else None

    async def show_loading(self, user_id: str) -> None:
        request = ShowLoadingAnimationRequest(chatId=user_id, loadingSeconds=self.settings.loading_seconds)
        await self._call(self._api().show_loading_animation(request, _request_timeout=self._timeout))

    @property
    def _timeout(self) -> float:
        return self.settings.api_timeout_seconds

    async def _call(self, awaitable: Any) -> Any:
        try:
            return await awaitable
        except ApiException as exc:
            raise _error(exc) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ChannelUnavailable(f"LINE Messaging API unreachable: {exc!r}") from None


def _messages(items: list[Item], quote_token: str | None) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if isinstance(item, Image):
            out.append(ImageMessage(originalContentUrl=item.url, previewImageUrl=item.url))
            continue
        if isinstance(item, Confirm):
            actions = [PostbackAction(label=label, data=data) for label, data in item.buttons]
            template = ConfirmTemplate(text=item.text, actions=actions)
            out.append(TemplateMessage(altText=item.text, template=template))
            continue
        # The quote goes on the first text only: it is the answer to that message.
        quote = quote_token if not any(isinstance(m, TextMessage) for m in out) else None
        out.append(TextMessage(text=item, quoteToken=quote))
    return out


def _sent_ids(answer: Any) -> list[str]:
    sent = getattr(answer, "sent_messages", None) or []
    return [str(m.id) for m in sent if getattr(m, "id", None)]


def _error(exc: ApiException) -> DeliveryError:
    status = int(exc.status or 0)
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else str(exc.body or "")
    detail = f"LINE Messaging API answered {status}: {body[:300]}"
    if status == 429 and "monthly limit" in body.lower():
        # The account's push quota for the month is used up: retrying cannot help.
        return ChannelRejected(detail)
    if status == 429:
        retry = (exc.headers or {}).get("Retry-After") if exc.headers is not None else None
        try:
            after = float(retry) if retry else 1.0
        except ValueError:
            after = 1.0
        return ChannelRateLimited(after, detail)
    if status >= 500 or status in (0, 408):
        return ChannelUnavailable(detail)
    if status in (401, 403):
        return ChannelSendAuthError(detail)
    if status == 409:
        return AlreadyAccepted(detail)
    if status == 400 and "reply token" in body.lower():
        return InvalidReplyToken(detail)
    return ChannelRejected(detail)
