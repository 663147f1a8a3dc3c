"""The `chatgate` command: serve, chat, migrate, sessions."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import getpass
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from app.access.cli import add_parser as add_access_parser
from app.config import Settings
from app.dead_letters.cli import add_parser as add_dead_letters_parser
from app.events import SessionScope
from app.scheduling.cli import add_parser as add_cron_parser


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str, ensure_ascii=False))


def _print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A plain text table of `columns` (missing values blank)."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(none)")


def cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    import uvicorn

    from app.api.app import create_app, server_options
    from app.doctor import model_settings_problem
    from app.firstrun import FirstRunError, banner, prepare

    host = args.host or settings.host
    port = args.port or settings.port
    try:
        plan = prepare(host, settings.channels, generate=args.first_run)
    except FirstRunError as exc:
        print(f"chatgate: {exc}", file=sys.stderr)
        return 2
    if plan.generated_file is not None:
        settings = Settings()  # now with the local secrets in the environment
    problem = model_settings_problem(settings)
    if problem is not None:
        print(f"chatgate: configuration error: {problem}", file=sys.stderr)
        return 2
    asyncio.run(_reach_database(settings))
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
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=False,
        **server_options(app),
    )
    server = _server_class()(config, lines)
    server.run()
    return 0 if server.started else 1


async def _reach_database(settings: Settings) -> None:
    """Fail fast, with the reason, on a database that waiting does not cure."""
    from app.db.engine import create_engine
    from app.migrate import wait_for_database

    engine = create_engine(settings)
    try:
        await wait_for_database(engine, settings.db_connect_retry_seconds)
    finally:
        await engine.dispose()


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, printing what is on and the URLs once it listens."""

        def __init__(self, config: uvicorn.Config, lines: list[str]) -> None:
            super().__init__(config)
            self.lines = lines

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                print("\n".join(self.lines), flush=True)

    return Server


def _webhook_secret() -> str | None:
    from channels.webhook.adapter import WebhookSettings

    return WebhookSettings().secret


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from app.migrate import upgrade_to_head

    asyncio.run(_reach_database(settings))
    upgrade_to_head(settings.database_url)
    print("database is at the newest migration")
    return 0


class _Chat:
    """`chatgate chat`: the runtime on one event loop, input read in the main thread.

    Reading input outside the loop is what makes Ctrl-C work: at the prompt it quits at
    once; during an answer it stops waiting (and sends `/stop` so the run ends too).
    """

    def __init__(self, settings: Settings, chat_id: str) -> None:
        from app.runtime import Runtime
        from channels.cli import CliSettings

        self.chat_id = chat_id
        self.runtime = Runtime(settings, channel_settings={"cli": CliSettings()})

    async def send(self, line: str) -> None:
        """Send one line and print the replies to it once they are delivered."""
        from app.events import InboundEvent
        from channels.cli import CliChannel

        cli = self.runtime.adapters["cli"]
        assert isinstance(cli, CliChannel)
        event = InboundEvent.from_text("cli", self.chat_id, self.chat_id, line)
        [accepted] = await self.runtime.ingest.accept("cli", [event])
        done = await self.runtime.waiters.wait_for_replies(accepted.event_id, 300)
        wanted = {reply.message_id for reply in done.replies}
        while wanted:
            message = await asyncio.wait_for(cli.delivered.get(), 30)
            wanted.discard(message.message_id)
            print(f"bot> {message.text}", flush=True)  # a late answer to an earlier line too
        if not done.done:
            print("(still working — the answer will appear when ready)")

    def run(self) -> int:
        from app.events import InboundEvent
        from app.logs import configure_logging

        configure_logging("WARNING", "console")
        with asyncio.Runner() as runner:
            runner.run(self.runtime.__aenter__())
            try:
                key = InboundEvent.from_text("cli", self.chat_id, self.chat_id, "").session_key
                print(f"chatgate — session {key}. /help lists commands, /new starts over, Ctrl-D quits.")
                while True:
                    try:
                        line = input("you> ")
                    except (EOFError, KeyboardInterrupt):
                        print()
                        return 0
                    if not line.strip():
                        continue
                    try:
                        runner.run(self.send(line))
                    except KeyboardInterrupt:
                        print("\n(stopped)")
                        with contextlib.suppress(Exception, KeyboardInterrupt):
                            runner.run(self.send("/stop"))
            finally:
                with contextlib.suppress(KeyboardInterrupt):
                    runner.run(self.runtime.__aexit__(None, None, None))


def cmd_chat(settings: Settings, args: argparse.Namespace) -> int:
    return _Chat(settings, args.chat or getpass.getuser()).run()


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


def cmd_access(settings: Settings, args: argparse.Namespace) -> int:
    from app.access.cli import run

    return asyncio.run(run(settings, args))


def cmd_doctor(settings: Settings, args: argparse.Namespace) -> int:
    from app.doctor import doctor
    from app.firstrun import load_existing

    if load_existing() is not None:
        settings = Settings()  # what `make run` serves with

    checks = asyncio.run(doctor(settings))
    if args.json:
        _print_json([{"check": c.name, "ok": c.ok, "detail": c.detail} for c in checks])
    else:
        for check in checks:
            print(check.line())
    return 0 if all(c.ok for c in checks) else 1


def cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from app.doctor import status

    data = asyncio.run(status(settings))
    if args.json:
        _print_json(data)
        return 0
    print(f"database: {data['database']}    channels: {', '.join(data['channels'])}")
    print("backlog:  " + "  ".join(f"{k}={v}" for k, v in data["backlog"].items()))
    print("sessions: " + ("  ".join(f"{k}={v}" for k, v in data["sessions"].items()) or "none"))
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
    doctor.set_defaults(func=cmd_doctor)
    status = sub.add_parser("status", help="backlog, sessions and the workers holding leases")
    status.add_argument("--json", action="store_true", help="JSON for scripts")
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
    channels.set_defaults(func=cmd_channels)

    from app.memory.__main__ import add_subcommands

    memory = sub.add_parser("memory", help="identity links, operator facts, user memory")
    add_subcommands(memory)
    memory.set_defaults(func=cmd_memory, command="memory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run a command; a configuration error, a database that cannot be used, Ctrl-C and
    a closed pipe end it with one line, never a traceback."""
    from pydantic import ValidationError

    from app.doctor import format_validation_error
    from app.migrate import DatabaseUnusable

    args = build_parser().parse_args(argv)
    try:
        try:
            settings = Settings()
        except ValidationError as exc:
            print(f"chatgate: configuration error: {format_validation_error(exc)}", file=sys.stderr)
            return 2
        return int(args.func(settings, args))
    except ValidationError as exc:
        print(f"chatgate: configuration error: {format_validation_error(exc)}", file=sys.stderr)
        return 2
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
