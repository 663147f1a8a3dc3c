"""Platform adapters, one package per channel.

The core finds a channel by name here and imports its package only when the channel is
enabled, so a deployment never loads SDKs it does not use. Each package exposes
`CHANNEL: app.channel.ChannelSpec`.
"""

from __future__ import annotations

import importlib
import importlib.util

from app.channel import ChannelSpec

# URL name -> package. The URL name is what appears in /channels/{name}.
KNOWN_CHANNELS: dict[str, str] = {
    "webhook": "channels.webhook",
    "cli": "channels.cli",
    "telegram": "channels.telegram",
    "slack": "channels.slack",
    "wecom": "channels.wecom",
    "wechat-mp": "channels.wechat_mp",
    "onebot": "channels.onebot",
    "qq": "channels.qq",
    "feishu": "channels.feishu",
    "cron": "channels.cron",
    "browser": "channels.browser",
    "discord": "channels.discord",
    "dingtalk": "channels.dingtalk",
    "a2a": "channels.a2a",
    "weixin": "channels.weixin",
    "whatsapp": "channels.whatsapp",
    "openai": "channels.openai_api",
    "mcp": "channels.mcp_server",
    "line": "channels.line",
    "matrix": "channels.matrix",
    "email": "channels.email",
}


def load_spec(name: str) -> ChannelSpec:
    module = importlib.import_module(KNOWN_CHANNELS[name])
    spec: ChannelSpec = module.CHANNEL
    return spec


def available_channels() -> list[str]:
    """Names whose package exists in this installation."""
    found = []
    for name, module in KNOWN_CHANNELS.items():
        if importlib.util.find_spec(module) is not None:
            found.append(name)
    return found
