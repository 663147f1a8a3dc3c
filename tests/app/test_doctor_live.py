"""`chatgate doctor` checks each served platform's credentials live, against fakes of the
platforms, and checks only the parts in use."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.app.test_cli import _cli
from tests.fakes import discord, slack, telegram
from tests.fakes.openai_server import FakeOpenAI
from tests.support.db import sqlite_database

pytestmark = pytest.mark.slow


async def _doctor(tmp_path: Path, *args: str, **env: str) -> tuple[int, list[str]]:
    db = f"sqlite:///{tmp_path / 'chatgate.db'}"
    if not (tmp_path / "chatgate.db").exists():
        # A copy of the migrated template (`chatgate migrate` itself is tested in test_cli).
        async with sqlite_database(tmp_path):
            pass
    done = await asyncio.to_thread(
        _cli, ["doctor", *args], tmp_path, DATABASE_URL=db, ADMIN_TOKEN="a" * 20, **env
    )
    return done.returncode, done.stdout.splitlines()


async def test_a_healthy_webhook_only_configuration_passes(tmp_path: Path) -> None:
    code, lines = await _doctor(tmp_path, CHANNELS="webhook", WEBHOOK_SECRET="s" * 20)
    assert code == 0, lines
    assert not any("browser chat tokens" in line for line in lines)


async def test_a_wrong_telegram_token_fails_and_the_right_one_passes(tmp_path: Path) -> None:
    async with telegram.FakeTelegram() as fake:
        env = {"CHANNELS": "telegram", "TELEGRAM_API_BASE_URL": fake.url, "TELEGRAM_WEBHOOK_SECRET": "w" * 20}
        code, lines = await _doctor(tmp_path, TELEGRAM_BOT_TOKEN="123:wrong", **env)
        assert code == 1
        assert "FAIL  channel telegram: getMe refused the token: Unauthorized" in lines
        assert not any("123:wrong" in line for line in lines)  # the token is never echoed

        code, lines = await _doctor(tmp_path, TELEGRAM_BOT_TOKEN=telegram.TOKEN, **env)
        assert code == 0, lines
        assert f"ok    channel telegram: credentials accepted (getMe: @{fake.username})" in lines

        asked = len(fake.calls_of("getMe"))
        code, lines = await _doctor(tmp_path, "--offline", TELEGRAM_BOT_TOKEN="123:wrong", **env)
        assert code == 0, lines  # --offline: settings only, no request
        assert "ok    channel telegram: settings complete" in lines
        assert len(fake.calls_of("getMe")) == asked


async def test_slack_and_discord_tokens_are_asked_live(tmp_path: Path) -> None:
    async with slack.FakeSlack() as slack_fake, discord.FakeDiscord() as discord_fake:
        env = {
            "CHANNELS": "slack,discord",
            "SLACK_API_BASE_URL": slack_fake.url,
            "SLACK_SIGNING_SECRET": "x" * 20,
            "SLACK_APP_TOKEN": "xapp-unused",
            "DISCORD_API_BASE": discord_fake.url,
            "DISCORD_GATEWAY_URL": discord_fake.gateway_url,
        }
        code, lines = await _doctor(tmp_path, SLACK_BOT_TOKEN="xoxb-wrong", DISCORD_BOT_TOKEN="nope", **env)
        assert code == 1
        assert "FAIL  channel slack: auth.test refused the bot token: invalid_auth" in lines
        assert "FAIL  channel discord: /users/@me refused the bot token: 401: Unauthorized" in lines

        good = {"SLACK_BOT_TOKEN": slack.BOT_TOKEN, "DISCORD_BOT_TOKEN": discord.TOKEN}
        code, lines = await _doctor(tmp_path, **good, **env)
        assert any(
            line.startswith("ok    channel slack: credentials accepted (auth.test: ") for line in lines
        )
        assert "ok    channel discord: credentials accepted (/users/@me: gate)" in lines


async def test_a_model_the_endpoint_does_not_list_fails(tmp_path: Path) -> None:
    env = {"CHANNELS": "webhook", "WEBHOOK_SECRET": "s" * 20, "LLM_PROVIDER": "openai", "LLM_API_KEY": "sk-t"}
    async with FakeOpenAI() as fake:
        code, lines = await _doctor(tmp_path, LLM_BASE_URL=fake.url, LLM_MODEL="gpt-typo", **env)
    assert code == 1
    assert (
        f"FAIL  model: {fake.url}/models answered 200 but does not list LLM_MODEL=gpt-typo "
        "(listed: gpt-4o-mini)" in lines
    )


async def test_token_endpoints_of_feishu_dingtalk_qq_wecom_and_the_official_account() -> None:
    """Each probe asks its platform's token endpoint (a fake that checks the credentials)
    and reports a refusal with the platform's reason, never the secret."""
    import httpx

    from app.probe import CredentialsRejected
    from channels.dingtalk.probe import probe as dingtalk_probe
    from channels.dingtalk.settings import DingTalkSettings
    from channels.feishu.probe import probe as feishu_probe
    from channels.feishu.settings import FeishuSettings
    from channels.qq.probe import probe as qq_probe
    from channels.qq.settings import QQSettings
    from channels.wechat_mp.adapter import WeChatMpSettings
    from channels.wechat_mp.probe import probe as mp_probe
    from channels.wecom.adapter import WeComSettings
    from channels.wecom.probe import probe as wecom_probe
    from tests.fakes.dingtalk import FakeDingTalk
    from tests.fakes.feishu import FakeFeishu
    from tests.fakes.qq import QQPlatform
    from tests.fakes.wechat_mp import FakeWeChatMpApi
    from tests.fakes.wecom import FakeWeComApi

    async with (
        FakeFeishu() as feishu,
        FakeDingTalk() as ding,
        QQPlatform("1020", "qq-secret") as qq,
        FakeWeComApi() as wecom,
        FakeWeChatMpApi() as mp,
        httpx.AsyncClient(timeout=10) as client,
    ):
        cases: list[tuple[Any, Any]] = [
            (feishu_probe, lambda s: FeishuSettings(app_id=feishu.app_id, app_secret=s, api_base=feishu.url)),
            (
                dingtalk_probe,
                lambda s: DingTalkSettings(client_id=ding.client_id, client_secret=s, api_base=ding.url),
            ),
            (qq_probe, lambda s: QQSettings(app_id="1020", app_secret=s, token_url=qq.token_url)),
            (
                wecom_probe,
                lambda s: WeComSettings(corp_id=wecom.corp_id, corp_secret=s, api_base_url=wecom.url),
            ),
            (mp_probe, lambda s: WeChatMpSettings(app_id=mp.app_id, app_secret=s, api_base_url=mp.url)),
        ]
        rights = [feishu.app_secret, ding.client_secret, "qq-secret", wecom.corp_secret, mp.app_secret]
        for (probe, settings), right in zip(cases, rights, strict=True):
            assert "issued" in await probe(settings(right), client)
            with pytest.raises(CredentialsRejected) as refused:
                await probe(settings("wrong-secret-value"), client)
            assert "refused" in str(refused.value)
            assert "wrong-secret-value" not in str(refused.value)
