"""`chatgate serve`: check the configuration, reach the database, build the app and run it
under uvicorn, printing the start-up banner once it listens and handing the work over on
SIGTERM (`app.shutdown`) before it exits."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from app.config import Settings

GC_YOUNG_THRESHOLD = 10_000  # allocations between two young collections (CPython: 700)


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.app import create_app, server_options
    from app.doctor import database_settings_problem, model_settings_problem
    from app.firstrun import FirstRunError, banner, prepare

    host = args.host or settings.host
    port = args.port or settings.port
    unknown = _unknown_channels(settings.channels)
    if unknown:
        print(f"chatgate: configuration error: CHANNELS: {unknown}", file=sys.stderr)
        return 2
    try:
        plan = prepare(host, settings.channels, generate=args.first_run)
    except FirstRunError as exc:
        print(f"chatgate: {exc}", file=sys.stderr)
        return 2
    if plan.generated_file is not None:
        settings = Settings()  # now with the local secrets in the environment
    problem = model_settings_problem(settings) or database_settings_problem(settings)
    if problem is not None:
        print(f"chatgate: configuration error: {problem}", file=sys.stderr)
        return 2
    asyncio.run(reach_database(settings))
    app = create_app(settings)
    webhook = "webhook" in settings.channels and bool(os.environ.get("WEBHOOK_SECRET") or _webhook_secret())
    chat_on = "browser" in settings.channels and bool(
        settings.gateway_tokens or settings.gateway_token_secret
    )
    chat_token = settings.gateway_tokens[0].token if chat_on and settings.gateway_tokens else None
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else host
    lines = banner(
        f"http://{shown}:{port}",
        webhook=webhook,
        admin=bool(settings.admin_token),
        chat=chat_on,
        chat_token=chat_token,
        secrets_file=plan.generated_file,
        model=(
            "offline (built in, deterministic)"
            if settings.llm_provider == "offline"
            else f"{settings.llm_model} at {settings.llm_base_url or 'api.openai.com'}"
        ),
    )
    # Everything imported and built so far lives as long as the process: frozen, the
    # cyclic GC stops rescanning it. Under load a full collection otherwise walked
    # ~180,000 objects and stalled the event loop for 100-150 ms, several times a minute.
    gc.collect()
    gc.freeze()
    # A young collection every 700 allocations (the default) ran ~150 times a second under
    # load, a tenth of the server's CPU per event (bench/RESULTS.md, "The mount's cost");
    # every 10,000 scans at most that many young objects, well under a millisecond.
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        **server_options(app),
    )
    # SIGTERM hands the work over while HTTP still answers (503s), then the server exits.
    runtime = app.state.runtime
    server = _server_class()(config, lines, runtime, hand_over=runtime.hand_over)
    server.run()
    return 0 if server.started else 1


def _unknown_channels(names: Sequence[str]) -> str | None:
    """A one-line reason naming each unknown channel (and the likely intended name)."""
    import difflib

    from channels import KNOWN_CHANNELS

    problems = []
    for name in names:
        if name in KNOWN_CHANNELS:
            continue
        close = difflib.get_close_matches(name, KNOWN_CHANNELS, n=1)
        problems.append(f"unknown channel {name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    if not problems:
        return None
    return "; ".join(problems) + f"; known: {', '.join(KNOWN_CHANNELS)}"


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, printing what is on and the URLs once it listens.

        On SIGTERM it keeps serving while the runtime hands its work over (`app.shutdown`:
        `/readyz` and channel requests answer 503 meanwhile), then exits with status 0.
        uvicorn alone would close its sockets at once and re-raise the signal at the end.
        """

        def __init__(
            self,
            config: uvicorn.Config,
            lines: list[str],
            runtime: Any,
            hand_over: Callable[[], Awaitable[object]] | None = None,
        ) -> None:
            super().__init__(config)
            self.lines = lines
            self.runtime = runtime
            self._hand_over = hand_over
            self._loop: asyncio.AbstractEventLoop | None = None
            self._handing: asyncio.Future[object] | None = None

        async def startup(self, sockets: Any = None) -> None:
            from app.doctor import channel_states

            self._loop = asyncio.get_running_loop()
            await super().startup(sockets=sockets)
            if self.started:
                rt = self.runtime
                states = await channel_states(rt.channel_settings, rt.engine, rt.owner)
                print("\n".join([*self.lines, *states]), flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if sig == signal.SIGTERM and self._hand_over is not None and self._loop is not None:
                if self._handing is None and not self.should_exit:
                    self._loop.call_soon_threadsafe(self._begin_hand_over)
                return  # a second SIGTERM waits for the same hand-over
            super().handle_exit(sig, frame)

        def _begin_hand_over(self) -> None:
            assert self._hand_over is not None
            if self._handing is not None:
                return
            self._handing = asyncio.ensure_future(self._hand_over())

            def done(task: asyncio.Future[object]) -> None:
                if not task.cancelled() and task.exception() is not None:
                    print(f"chatgate: hand-over failed: {task.exception()!r}", file=sys.stderr)
                self.should_exit = True

            self._handing.add_done_callback(done)

    return Server


def _webhook_secret() -> str | None:
    from channels.webhook.adapter import WebhookSettings

    return WebhookSettings().secret


async def reach_database(settings: Settings) -> None:
    """Fail fast, with the reason, on a database that waiting does not cure."""
    from app.db.engine import create_engine
    from app.migrate import wait_for_database

    engine = create_engine(settings)
    try:
        await wait_for_database(engine, settings.db_connect_retry_seconds)
    finally:
        await engine.dispose()
