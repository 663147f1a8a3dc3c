"""The shared waiting helper: `eventually()` and the `TEST_TIME_SCALE` deadline scale."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.timing import eventually, scaled


def test_deadlines_scale_with_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_TIME_SCALE", raising=False)
    assert scaled(15) == 15
    monkeypatch.setenv("TEST_TIME_SCALE", "3")
    assert scaled(15) == 45
    monkeypatch.setenv("TEST_TIME_SCALE", "0")
    with pytest.raises(ValueError, match="TEST_TIME_SCALE"):
        scaled(1)


async def test_eventually_waits_for_a_plain_or_async_check_and_fails_at_the_scaled_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flag = asyncio.Event()
    asyncio.get_running_loop().call_later(0.1, flag.set)
    await eventually(flag.is_set, timeout=5)

    async def async_check() -> bool:
        return flag.is_set()

    await eventually(async_check, timeout=1)

    monkeypatch.setenv("TEST_TIME_SCALE", "0.5")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError, match=r"within 0.1 s"):
        await eventually(lambda: False, timeout=0.2, interval=0.01)
    assert 0.1 <= loop.time() - started < 1


def test_hypothesis_examples_get_the_scaled_deadline() -> None:
    """Hypothesis's own 200 ms failed a correct property on a slow host (tests/conftest.py)."""
    from datetime import timedelta

    from hypothesis import settings

    assert settings.get_current_profile_name() == "chatgate"
    assert settings.get_profile("chatgate").deadline == timedelta(seconds=scaled(0.5))
