"""Render `.env.example` from the settings classes, so the two never drift apart.

`python -m app.envdoc > .env.example` regenerates it; a test compares.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from app.alerts.settings import AlertSettings
from app.config import Settings
from app.tracing import TracingSettings


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, (dict, tuple)):
        return json.dumps(value)
    return str(getattr(value, "value", value))


def env_names(cls: type[BaseSettings]) -> list[str]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    return [(prefix + name).upper() for name in cls.model_fields]


def _section(title: str, cls: type[BaseSettings]) -> list[str]:
    prefix = str(cls.model_config.get("env_prefix", ""))
    lines = [f"# --- {title} " + "-" * max(3, 70 - len(title)), ""]
    for name, field in cls.model_fields.items():
        if field.description:
            lines.append(f"# {field.description}")
        lines.append(f"# {(prefix + name).upper()}={_default(field)}")
    lines.append("")
    return lines


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    from channels import available_channels, load_spec

    classes: list[tuple[str, type[BaseSettings]]] = [("service", Settings)]
    classes.append(("tracing (OpenTelemetry; docs/observability.md)", TracingSettings))
    classes.append(("alerts (docs/alerts.md)", AlertSettings))
    for name in available_channels():
        classes.append((f"channel {name}", load_spec(name).settings_class))
    return classes


def render_env_example() -> str:
    lines = [
        "# chatgate settings. Every line shows the default; uncomment to change it.",
        "# Channel settings apply to channels listed in CHANNELS.",
        "",
    ]
    for title, cls in settings_classes():
        lines += _section(title, cls)
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(render_env_example(), end="")
