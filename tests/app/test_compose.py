"""docker-compose.yml never does what `chatgate serve` refuses: no known secrets, no port
on every interface by default, channels from an env file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _service() -> dict[str, Any]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service: dict[str, Any] = compose["services"]["chatgate"]
    return service


def test_secrets_are_required_not_defaulted() -> None:
    env = _service()["environment"]
    for name in ("ADMIN_TOKEN", "WEBHOOK_SECRET"):
        # `${NAME:?message}`: compose refuses to start when it is unset or empty.
        assert re.fullmatch(rf"\$\{{{name}:\?[^}}]+\}}", env[name]), env[name]
    text = (ROOT / "docker-compose.yml").read_text()
    assert "change-me" not in text


def test_the_port_is_published_on_loopback_unless_told_otherwise() -> None:
    (port,) = _service()["ports"]
    assert port == "${CHATGATE_BIND:-127.0.0.1}:${CHATGATE_PORT:-8000}:8000"


def test_channels_and_platform_settings_come_from_an_env_file() -> None:
    assert _service()["env_file"] == ["${CHATGATE_ENV_FILE:-.env}"]
    assert "CHANNELS" not in _service()["environment"]
