"""Browser fixtures: Playwright (async) driving Debian's Chromium, screenshots as artifacts."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from tests.support.timing import scaled

CHROMIUM = "/usr/bin/chromium"
# An assertion waits up to 15 s for the page to reach what it expects (Playwright's default is
# 5 s): on a 2-CPU machine running four test workers and Chromium, one dashboard round trip
# (click, API call, redraw) has taken longer than 5 s. A page that never gets there still fails.
expect.set_options(timeout=scaled(15) * 1000)
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"
LAUNCH_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium chromium-driver (scripts/test.sh does)")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A fresh browser context; console errors and page crashes fail the test."""
    context = await browser.new_context(viewport={"width": 1280, "height": 860})
    pg = await context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    pg.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    pg.errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        await context.close()


def ignore_expected(errors: list[str], *patterns: str) -> list[str]:
    """Console errors minus the ones a test provokes on purpose (e.g. a 401 before login)."""
    return [e for e in errors if not any(re.search(p, e) for p in patterns)]


async def shot(page: Page, name: str) -> Path:
    """Save a full-page screenshot under test-artifacts/web/ (gitignored).

    The SQLite and PostgreSQL runs of a test save the same name, possibly at the same time
    on two xdist workers: each writes its own file and renames it into place, so the
    artifact is always one whole PNG."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    partial = path.with_name(f"{name}.{os.getpid()}.part")
    partial.write_bytes(await page.screenshot(full_page=True))
    partial.replace(path)
    return path
