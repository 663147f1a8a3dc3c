"""`chatgate backup|restore`, `chatgate data export|erase` and `chatgate usage`: what the
database holds, for an operator (docs/data.md, docs/usage.md)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from app.cli_output import print_json as _print_json
from app.cli_output import print_table as _print_table
from app.config import Settings


def cmd_backup(settings: Settings, args: argparse.Namespace) -> int:
    from pathlib import Path

    from app.backup import BackupError, backup, restore

    try:
        if args.command == "backup":
            counts = asyncio.run(backup(settings.database_url, Path(args.file)))
        else:
            counts = asyncio.run(restore(settings.database_url, Path(args.file)))
    except BackupError as exc:
        print(f"chatgate: {args.command} failed: {exc}", file=sys.stderr)
        return 1
    if args.json:
        _print_json(counts)
    else:
        done = "backed up to" if args.command == "backup" else "restored from"
        print(f"{done} {args.file}: " + ", ".join(f"{t}={n}" for t, n in counts.items() if n))
    return 0


def cmd_data(settings: Settings, args: argparse.Namespace) -> int:
    from app.data_rights import UnknownPerson, erase, export, export_session, find_person
    from app.db.engine import create_engine

    async def run() -> Any:
        engine = create_engine(settings)
        try:
            if args.action == "export" and args.session:
                return await export_session(engine, args.session)
            who = await find_person(engine, identity=args.identity, person=args.person)
            if args.action == "export":
                return await export(engine, who)
            return await erase(engine, who, settings.workspace_root)
        finally:
            await engine.dispose()

    if args.action == "erase" and not args.yes:
        print("chatgate: data erase cannot be undone: add --yes", file=sys.stderr)
        return 2
    try:
        data = asyncio.run(run())
    except (ValueError, UnknownPerson) as exc:
        print(f"chatgate: data {args.action}: {exc}", file=sys.stderr)
        return 1
    _print_json(data if args.action == "export" else {"receipt": data})
    return 0


def cmd_usage(settings: Settings, args: argparse.Namespace) -> int:
    from app.db.engine import create_engine
    from app.usage.report import usage_by

    async def run() -> list[dict[str, Any]]:
        engine = create_engine(settings)
        try:
            return await usage_by(engine, args.by, days=args.days, limit=args.limit, channel=args.channel)
        finally:
            await engine.dispose()

    rows = asyncio.run(run())
    if args.json:
        _print_json(rows)
    else:
        counts = ["calls", "input_tokens", "output_tokens", "cached_tokens", "audio_seconds"]
        _print_table(rows, [args.by, *counts, "cost", "currency"])
    return 0


def add_records_parsers(sub: Any) -> None:
    usage = sub.add_parser(
        "usage", help="model calls, tokens, speech seconds and cost by day, session, model, sender, chat, …"
    )
    usage.add_argument(
        "--by", choices=["day", "session", "model", "sender", "chat", "channel", "agent"], default="day"
    )
    usage.add_argument("--channel", help="only this channel's usage")
    usage.add_argument("--days", type=int, default=30, help="the last N UTC days, today included")
    usage.add_argument("--limit", type=int, default=50)
    usage.add_argument("--json", action="store_true", help="JSON for scripts instead of a table")
    usage.set_defaults(func=cmd_usage)
    data = sub.add_parser("data", help="people's data on request: export or erase one person (JSON)")
    dsub = data.add_subparsers(dest="action", required=True)
    for action, text in (
        ("export", "everything stored about one person (or --session KEY: one session)"),
        ("erase", "erase one person everywhere; prints a receipt of what was removed"),
    ):
        cmd = dsub.add_parser(action, help=text)
        who = cmd.add_mutually_exclusive_group(required=True)
        who.add_argument("--identity", help="channel:sender_id as the platform sends it, e.g. telegram:42")
        who.add_argument("--person", help="a person id: all the identities linked to it")
        if action == "export":
            who.add_argument("--session", help="a session key: that session's generations, messages, runs")
        else:
            cmd.add_argument("--yes", action="store_true", help="erasure cannot be undone")
    data.set_defaults(func=cmd_data)
    for name, text in (
        ("backup", "write the whole database to FILE (pg_dump, or SQLite's online backup)"),
        ("restore", "load FILE into a new, empty database (DATABASE_URL) and print the rows per table"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument("file")
        cmd.add_argument("--json", action="store_true", help="rows per table as JSON")
        cmd.set_defaults(func=cmd_backup)
