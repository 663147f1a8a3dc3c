"""The `chatgate` command: serve, chat, migrate, sessions."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from app.access.cli import add_parser as add_access_parser
from app.chat_cli import cmd_chat
from app.cli_output import print_json as _print_json
from app.cli_output import print_table as _print_table
from app.config import Settings
from app.dead_letters.cli import add_parser as add_dead_letters_parser
from app.events import SessionScope
from app.records_cli import add_records_parsers
from app.scheduling.cli import add_parser as add_cron_parser
from app.serve_cli import cmd_serve, reach_database


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from app.db.engine import driver_connect_args
    from app.migrate import upgrade_to_head

    asyncio.run(reach_database(settings))
    upgrade_to_head(settings.database_url, driver_connect_args(settings))
    print("database is at the newest migration")
    return 0


async def _sessions(settings: Settings, args: argparse.Namespace) -> int:
    from app.db.engine import create_engine
    from app.events import InboundEvent, TextPart
    from app.pipeline.storage import build_store
    from app.sessions import queries
    from app.sessions.store import Lifecycle, SessionStore

    engine = create_engine(settings)
    try:
        if args.action == "list":
            rows = await queries.list_sessions(
                engine, channel=args.channel, status=args.status, limit=args.limit
            )
            if args.json:
                _print_json(rows)
            else:
                _print_table(rows, ["key", "status", "message_count", "last_active_at"])
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
            await store.close()
            print(f"reset of {args.key!r} queued; a running server applies it in order")
    finally:
        await engine.dispose()
    return 0


def cmd_sessions(settings: Settings, args: argparse.Namespace) -> int:
    return asyncio.run(_sessions(settings, args))


def cmd_channels(settings: Settings, args: argparse.Namespace) -> int:
    if args.channel == "weixin":
        from channels.weixin.cli import run_cli as weixin_cli

        return asyncio.run(weixin_cli(settings, args.action))
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


def cmd_access(settings: Settings, args: argparse.Namespace) -> int:
    from app.access.cli import run

    return asyncio.run(run(settings, args))


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    from app.doctor import doctor
    from app.firstrun import load_existing

    if load_existing() is not None:
        settings = Settings()  # what `make run` serves with

    checks = asyncio.run(doctor(settings, offline=args.offline))
    if args.json:
        _print_json([{"check": c.name, "ok": c.ok, "warning": c.warning, "detail": c.detail} for c in checks])
    else:
        for check in checks:
            print(check.line())
    return 0 if all(c.ok for c in checks) else 1


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from app.doctor import StatusUnavailable, server_status, status

    if args.url:
        token = args.admin_token or settings.admin_token
        if not token:
            print("chatgate: status --url needs ADMIN_TOKEN (or --admin-token)", file=sys.stderr)
            return 2
        try:
            data = asyncio.run(server_status(args.url, token))
        except (StatusUnavailable, OSError) as exc:
            print(f"chatgate: status: {exc}", file=sys.stderr)
            return 1
    else:
        data = asyncio.run(status(settings))
    if args.json:
        _print_json(data)
        return 0
    print(f"server: {data['server']}" if "server" in data else f"database: {data['database']}")
    print("backlog:  " + "  ".join(f"{k}={v}" for k, v in data["backlog"].items()))
    print("sessions: " + ("  ".join(f"{k}={v}" for k, v in data["sessions"].items()) or "none"))
    print("channels:")
    columns = (
        ["channel", "health", "inbound_last_hour"] if "server" in data else ["channel", "inbound_last_hour"]
    )
    _print_table(data["channels"], columns)
    if "connections" in data:
        print("connections:")
        _print_table(data["connections"], ["connection", "owner", "expires_at", "takeovers"])
    if "workers" in data:
        print("workers holding leases:")
        _print_table(data["workers"], ["worker", "leases"])
    return 0


def cmd_memory(settings: Settings, args: argparse.Namespace) -> int:
    from app.memory.__main__ import run

    return asyncio.run(run(args, settings))


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chatgate")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="chatgate", description="Multi-channel chatbot gateway")
    parser.add_argument("--version", action="version", version=f"chatgate {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    doctor = sub.add_parser("doctor", help="check database, schema, channels, model, secrets, clock")
    doctor.add_argument("--json", action="store_true", help="JSON for scripts")
    doctor.add_argument(
        "--offline", action="store_true", help="skip the live checks of platform credentials and the model"
    )
    doctor.set_defaults(func=cmd_doctor)
    status = sub.add_parser(
        "status", help="the running deployment: channels, connections, backlog, sessions, workers"
    )
    status.add_argument("--json", action="store_true", help="JSON for scripts")
    status.add_argument("--url", help="ask this running server's admin API instead of the database")
    status.add_argument("--admin-token", help="the server's ADMIN_TOKEN (default: from the environment)")
    status.set_defaults(func=cmd_status)

    serve = sub.add_parser("serve", help="run the HTTP server")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument(
        "--first-run",
        action="store_true",
        help="on loopback, use (and make once) local secrets in .chatgate/secrets.env (`make run`)",
    )
    serve.set_defaults(func=cmd_serve)

    sub.add_parser("migrate", help="upgrade the database to the newest schema").set_defaults(func=cmd_migrate)
    add_records_parsers(sub)

    chat = sub.add_parser("chat", help="talk to the agent in this terminal (channel cli)")
    chat.add_argument("--chat", help="conversation id (default: your user name)")
    chat.set_defaults(func=cmd_chat)

    sessions = sub.add_parser("sessions", help="inspect and reset sessions")
    ssub = sessions.add_subparsers(dest="action", required=True)
    ls = ssub.add_parser("list")
    ls.add_argument("--channel")
    ls.add_argument("--status")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true", help="JSON for scripts instead of a table")
    show = ssub.add_parser("show")
    show.add_argument("key")
    show.add_argument("--runs", action="store_true", help="include run traces")
    reset = ssub.add_parser("reset")
    reset.add_argument("key")
    sessions.set_defaults(func=cmd_sessions)

    add_cron_parser(sub).set_defaults(func=cmd_cron)
    add_dead_letters_parser(sub).set_defaults(func=cmd_dead_letters)
    add_access_parser(sub).set_defaults(func=cmd_access)

    channels = sub.add_parser("channels", help="platform set-up tasks")
    csub = channels.add_subparsers(dest="channel", required=True)
    telegram = csub.add_parser("telegram", help="Telegram webhook registration")
    telegram.add_argument("action", choices=["set-webhook", "delete-webhook"])
    telegram.add_argument("--drop-pending", action="store_true", help="discard updates Telegram queued")
    weixin = csub.add_parser("weixin", help="personal WeChat (iLink): QR-code login, login status")
    weixin.add_argument("action", choices=["login", "status"])
    channels.set_defaults(func=cmd_channels)

    from app.memory_cli import add_subcommands

    memory = sub.add_parser("memory", help="identity links, operator facts, user memory")
    add_subcommands(memory)
    memory.set_defaults(func=cmd_memory, command="memory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a configuration error, a database that cannot be used, Ctrl-C and
    a closed pipe end it with one line, never a traceback."""
    from pydantic import ValidationError

    from app.errors import DatabaseUnusable

    def config_error(exc: ValidationError) -> int:
        from app.doctor import format_validation_error  # HTTP and SQL modules: only when needed

        print(f"chatgate: configuration error: {format_validation_error(exc)}", file=sys.stderr)
        return 2

    args = build_parser().parse_args(argv)
    try:
        try:
            settings = Settings()
        except ValidationError as exc:
            return config_error(exc)
        return int(args.func(settings, args))
    except ValidationError as exc:
        return config_error(exc)
    except DatabaseUnusable as exc:
        print(f"chatgate: database unusable: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: say nothing more, and stop Python's own
        # flush at exit from failing on the closed pipe.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
