"""The `chatgate` command: serve, chat, migrate, sessions."""

from __future__ import annotations

import argparse
import asyncio
import gc
import getpass
import json
import sys
from collections.abc import Sequence
from typing import Any

from app.config import Settings
from app.dead_letters.cli import add_parser as add_dead_letters_parser
from app.events import SessionScope
from app.scheduling.cli import add_parser as add_cron_parser


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str, ensure_ascii=False))


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.app import create_app, server_options

    app = create_app(settings)
    # Everything imported and built so far lives as long as the process: frozen, the
    # cyclic GC stops rescanning it. Under load a full collection otherwise walked
    # ~180,000 objects and stalled the event loop for 100-150 ms, several times a minute.
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=args.host or settings.host,
        port=args.port or settings.port,
        log_level=settings.log_level.lower(),
        access_log=False,
        **server_options(app),
    )
    return 0


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from app.db.migrate import upgrade_to_head

    upgrade_to_head(settings.database_url)
    print("database is at the newest migration")
    return 0


async def _chat(settings: Settings, chat_id: str) -> int:
    from app.events import InboundEvent
    from app.logs import configure_logging
    from app.runtime import Runtime
    from channels.cli import CliChannel, CliSettings

    configure_logging("WARNING", "console")
    runtime = Runtime(settings, channel_settings={"cli": CliSettings()})
    async with runtime:
        cli = runtime.adapters["cli"]
        assert isinstance(cli, CliChannel)
        key = InboundEvent.from_text("cli", chat_id, chat_id, "").session_key
        print(f"chatgate — session {key}. /new starts over, Ctrl-D quits.")
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                print()
                return 0
            if not line.strip():
                continue
            event = InboundEvent.from_text("cli", chat_id, chat_id, line)
            [accepted] = await runtime.ingest.accept("cli", [event])
            done = await runtime.waiters.wait_for_replies(accepted.event_id, 300)
            for _ in done.replies:
                message = await asyncio.wait_for(cli.delivered.get(), 30)
                print(f"bot> {message.text}")
            if not done.done:
                print("(still working — the answer will appear when ready)")


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_chat(settings, args.chat or getpass.getuser()))


async def _sessions(settings: Settings, args: argparse.Namespace) -> int:
    from app.db.engine import create_engine
    from app.events import InboundEvent, TextPart
    from app.pipeline.storage import build_store
    from app.sessions import queries
    from app.sessions.store import Lifecycle, SessionStore

    engine = create_engine(settings)
    try:
        if args.action == "list":
            _print_json(
                await queries.list_sessions(
                    engine, channel=args.channel, status=args.status, limit=args.limit
                )
            )
        elif args.action == "show":
            session = await queries.current_session(engine, args.key)
            if session is None:
                print(f"no session with key {args.key!r}", file=sys.stderr)
                return 1
            session["messages"] = await queries.session_messages(engine, session["id"])
            if args.runs:
                session["run_traces"] = await queries.session_runs(engine, args.key)
            _print_json(session)
        elif args.action == "reset":
            event = InboundEvent(
                channel="admin",
                chat_id=args.key,
                sender_id="admin",
                parts=(TextPart(text="/reset"),),
                session_key_override=args.key,
                metadata={"silent": True},
            )
            store = build_store(
                engine, SessionStore(engine, Lifecycle()), lease_ttl=settings.lease_ttl_seconds
            )
            await store.accept([event])
            print(f"reset of {args.key!r} queued; a running server applies it in order")
    finally:
        await engine.dispose()
    return 0


def cmd_sessions(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_sessions(settings, args))


def cmd_channels(settings: Settings, args: argparse.Namespace) -> int:
    from channels.telegram.webhook_admin import run_cli

    return asyncio.run(run_cli(args.action, settings.public_base_url, drop_pending=args.drop_pending))


def _channel_scope(name: str) -> SessionScope | None:
    """How channel `name` keys its sessions (from its settings), or None if it does not exist."""
    from channels import KNOWN_CHANNELS, load_spec

    if name not in KNOWN_CHANNELS:
        return None
    try:
        return load_spec(name).settings_class().session_scope
    except ImportError:
        return None


def cmd_cron(settings: Settings, args: argparse.Namespace) -> int:
    from app.scheduling.cli import run

    return asyncio.run(run(settings, args, _channel_scope))


def cmd_dead_letters(settings: Settings, args: argparse.Namespace) -> int:
    from app.dead_letters.cli import run

    return asyncio.run(run(settings, args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatgate", description="Multi-channel chatbot gateway")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.set_defaults(func=cmd_serve)

    sub.add_parser("migrate", help="upgrade the database to the newest schema").set_defaults(func=cmd_migrate)

    chat = sub.add_parser("chat", help="talk to the agent in this terminal (channel cli)")
    chat.add_argument("--chat", help="conversation id (default: your user name)")
    chat.set_defaults(func=cmd_chat)

    sessions = sub.add_parser("sessions", help="inspect and reset sessions")
    ssub = sessions.add_subparsers(dest="action", required=True)
    ls = ssub.add_parser("list")
    ls.add_argument("--channel")
    ls.add_argument("--status")
    ls.add_argument("--limit", type=int, default=50)
    show = ssub.add_parser("show")
    show.add_argument("key")
    show.add_argument("--runs", action="store_true", help="include run traces")
    reset = ssub.add_parser("reset")
    reset.add_argument("key")
    sessions.set_defaults(func=cmd_sessions)

    add_cron_parser(sub).set_defaults(func=cmd_cron)
    add_dead_letters_parser(sub).set_defaults(func=cmd_dead_letters)

    channels = sub.add_parser("channels", help="platform set-up tasks")
    csub = channels.add_subparsers(dest="channel", required=True)
    telegram = csub.add_parser("telegram", help="Telegram webhook registration")
    telegram.add_argument("action", choices=["set-webhook", "delete-webhook"])
    telegram.add_argument("--drop-pending", action="store_true", help="discard updates Telegram queued")
    channels.set_defaults(func=cmd_channels)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings()
    return int(args.func(settings, args))


if __name__ == "__main__":
    raise SystemExit(main())
