"""Registering the webhook with Telegram (`chatgate channels telegram set-webhook`)."""

from __future__ import annotations

from channels.telegram.adapter import build_bot
from channels.telegram.members import ALLOWED_UPDATES
from channels.telegram.settings import TelegramSettings


def webhook_url(public_base_url: str) -> str:
    return public_base_url.rstrip("/") + "/channels/telegram"


async def set_webhook(
    settings: TelegramSettings, public_base_url: str | None, *, drop_pending: bool = False
) -> str:
    """Call setWebhook with `{PUBLIC_BASE_URL}/channels/telegram` and the secret; return the URL."""
    if not public_base_url:
        raise ValueError("PUBLIC_BASE_URL is not set (the https URL Telegram can reach this service at)")
    if not settings.webhook_secret:
        raise ValueError("TELEGRAM_WEBHOOK_SECRET is not set; without it anyone could post updates")
    url = webhook_url(public_base_url)
    async with build_bot(settings) as bot:
        await bot.set_webhook(
            url,
            secret_token=settings.webhook_secret,
            allowed_updates=ALLOWED_UPDATES,
            drop_pending_updates=drop_pending,
        )
    return url


async def delete_webhook(settings: TelegramSettings, *, drop_pending: bool = False) -> None:
    """Remove the webhook (needed before TELEGRAM_MODE=polling can call getUpdates)."""
    async with build_bot(settings) as bot:
        await bot.delete_webhook(drop_pending_updates=drop_pending)


async def run_cli(action: str, public_base_url: str | None, *, drop_pending: bool = False) -> int:
    """The CLI entry point; settings come from the environment. Returns the exit code."""
    import sys

    from telegram.error import TelegramError

    from app.errors import ChannelNotConfigured

    settings = TelegramSettings()
    try:
        if action == "set-webhook":
            url = await set_webhook(settings, public_base_url, drop_pending=drop_pending)
            print(f"Telegram will POST updates to {url}")
        else:
            await delete_webhook(settings, drop_pending=drop_pending)
            print("webhook deleted; TELEGRAM_MODE=polling can now call getUpdates")
    except (ValueError, ChannelNotConfigured, TelegramError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
