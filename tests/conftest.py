"""Fixtures: databases on both backends, settings, and the app served for real."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.app import create_app
from app.channel import ChannelSettings
from app.config import Settings
from app.db.engine import create_engine
from app.migrate import upgrade
from channels.webhook import WebhookSettings
from tests.support.db import database, drop_templates
from tests.support.servers import RunningApp, forget_started, serve_in_loop, started_logs
from tests.support.timing import scaled


def _share_one_tls_context() -> None:
    """httpx makes a new SSL context for every client and loads the CA bundle into it: 18-26
    ms of CPU a client. The suite makes thousands of clients (most of them for the http://
    URLs of its local fakes and servers), so that was a fifth of the test workers' CPU.
    Here the clients that ask for the default verification share one context per set of
    the settings it is made from (`trust_env`, `SSL_CERT_FILE`, `SSL_CERT_DIR`); any other
    `verify` or a client certificate goes through as before. The same for `httpx2`, the
    fork the `openai` and `mcp` SDKs use: every in-process app makes an OpenAI client; and
    `httpx.create_ssl_context` itself, which the app's media fetcher calls once per app."""
    import httpx
    from httpx._transports import default
    from httpx2._transports import default as default2

    shared = _shared(httpx.create_ssl_context)  # the same function as `default`'s
    setattr(httpx, "create_ssl_context", shared)  # noqa: B010
    setattr(default, "create_ssl_context", shared)  # noqa: B010
    setattr(default2, "create_ssl_context", _shared(default2.create_ssl_context))  # noqa: B010


def _shared(make: Any) -> Any:
    made: dict[tuple[Any, ...], Any] = {}

    def create_ssl_context(verify: Any = True, cert: Any = None, trust_env: bool = True) -> Any:
        if verify is not True or cert is not None:
            return make(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if key not in made:
            made[key] = make(verify=verify, cert=cert, trust_env=trust_env)
        return made[key]

    return create_ssl_context


_share_one_tls_context()


def _scale_hypothesis_deadline() -> None:
    """Hypothesis fails an example that takes longer than its deadline (200 ms by default)
    as if it were a bug. The deadline is there to catch a property that became slow, and it
    is a fixed bound like any other in the suite: six workers on two cores gave one example
    278 ms on a slow host. Here it is 500 ms on a quiet machine (the suite runs three
    workers a core) and scales with `TEST_TIME_SCALE` (tests/support/timing.py); a test's
    own `@settings(deadline=…)` still wins."""
    from datetime import timedelta

    from hypothesis import settings

    settings.register_profile("chatgate", deadline=timedelta(seconds=scaled(0.5)))
    settings.load_profile("chatgate")


_scale_hypothesis_deadline()

# Server processes the tests start inherit this: the offline model streams its pieces
# without the demo's pauses (a test that wants them sets the setting itself).
os.environ.setdefault("OFFLINE_STREAM_DELAY_MS", "0")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    drop_templates()


def pytest_runtest_setup(item: pytest.Item) -> None:
    forget_started()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test's report carries the log of each server process it started: a flaky
    failure in a loaded full run is diagnosed from that run's output, not from a rerun."""
    report = yield
    if report.failed:
        for name, text in started_logs():
            report.sections.append((f"Captured log of {name}", text or "(empty)"))
    return report


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `long` first: `--dist loadgroup` hands the first tests out one per worker
    in turn, so each worker starts one long test at once, instead of when the queue reaches
    it, which would make the phase end minutes later. A test marked `alone` is `serial` too:
    it never runs in the parallel phase."""
    for item in items:
        if item.get_closest_marker("alone") and not item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.serial)
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    _note_serial_files(items)


def _note_serial_files(items: list[pytest.Item]) -> None:
    """With `TEST_SERIAL_FILES` set (scripts/test.sh sets it for its first phase), write the
    test files that hold `serial` tests there, one per line: the later phases collect those
    files only, instead of the whole suite again (9 CPU-s a process, on the way of each
    phase). Every xdist worker collects the same items and writes the same list."""
    target = os.environ.get("TEST_SERIAL_FILES")
    if not target:
        return
    files = sorted({item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("serial")})
    if not files:  # e.g. a failed test run again alone: keep the list the whole suite wrote
        return
    partial = Path(f"{target}.{os.getpid()}")
    partial.write_text("".join(f"{name}\n" for name in files))
    partial.replace(target)


WEBHOOK_SECRET = "test-webhook-secret"
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A database at head (no rows), once on SQLite and once on PostgreSQL; an empty one
    (no tables) for a test marked `empty_database`."""
    migrated = request.node.get_closest_marker("empty_database") is None
    async with database(request.param, tmp_path, migrated=migrated) as url:
        yield url


async def _migrated_engine(url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade(url)
    eng = create_engine(make_settings(url))
    yield eng
    await eng.dispose()


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated database engine on both backends, for tests below the HTTP app."""
    async for eng in _migrated_engine(db_url):
        yield eng


@pytest.fixture
async def pg_url(tmp_path: Path) -> AsyncIterator[str]:
    """A fresh PostgreSQL database (for tests that are about PostgreSQL only)."""
    async with database("postgres", tmp_path) as url:
        yield url


@pytest.fixture
async def pg_engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    """A migrated engine on a fresh PostgreSQL database only."""
    async for eng in _migrated_engine(pg_url):
        yield eng


def make_settings(db_url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        database_url=db_url,
        admin_token=ADMIN_TOKEN,
        log_level="WARNING",
        inbox_poll_seconds=0.2,
        outbox_poll_seconds=0.1,
        lifecycle_sweep_seconds=3600,
        outbox_backoff_base_seconds=0.05,
        collect_debounce_seconds=0.2,
        offline_stream_delay_ms=0,  # pieces still stream, without the demo's pauses
        pacing_enabled=False,  # platform limits would slow most tests; the pacing tests turn it on
    )
    values.update(overrides)
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def webhook_settings(**overrides: Any) -> WebhookSettings:
    return WebhookSettings(_env_file=None, secret=WEBHOOK_SECRET, **overrides)  # type: ignore[call-arg]


ServeApp = Callable[..., AbstractAsyncContextManager[RunningApp]]


@pytest.fixture
def serve(db_url: str) -> ServeApp:
    """`async with serve(**settings) as running:` the app on a real port, on `db_url`."""

    def _serve(
        *,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        provider: Any = None,
        tools: Any = None,
        wrap_store: Any = None,
        alert_settings: Any = None,
        **overrides: Any,
    ) -> AbstractAsyncContextManager[RunningApp]:
        settings = make_settings(db_url, **overrides)
        app = create_app(
            settings,
            channel_settings=channel_settings
            if channel_settings is not None
            else {"webhook": webhook_settings()},
            provider=provider,
            tools=tools,
            wrap_store=wrap_store,
            alert_settings=alert_settings,
        )
        return serve_in_loop(app)

    return _serve
