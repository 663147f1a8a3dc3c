"""Settings: the documented names exist, `.env.example` lists every one of them."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.envdoc import env_names, render_env_example, settings_classes

ROOT = Path(__file__).resolve().parents[2]


def test_env_example_lists_every_setting() -> None:
    committed = (ROOT / ".env.example").read_text()
    assert committed == render_env_example(), "regenerate: python -m app.envdoc > .env.example"
    for _title, cls in settings_classes():
        for name in env_names(cls):
            assert f"# {name}=" in committed


def test_contract_setting_names() -> None:
    names = set(env_names(Settings))
    for name in ("DATABASE_URL", "ADMIN_TOKEN", "LLM_PROVIDER", "LLM_BASE_URL", "LLM_API_KEY", "LLM_MODEL"):
        assert name in names
    webhook = dict(settings_classes())["channel webhook"]
    assert "WEBHOOK_SECRET" in env_names(webhook)


def test_environment_is_read_when_settings_are_built(monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://u@db:5432/chatgate")
    monkeypatch.setenv("CHANNELS", "webhook, telegram")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.database_url == "postgresql+asyncpg://u@db:5432/chatgate"
    assert settings.channels == ["webhook", "telegram"]
    assert settings.llm_provider == "offline"
