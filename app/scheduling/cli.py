"""`chatgate cron list|add|remove|enable|disable`: manage jobs straight in the database.

A running server picks changes up at its next tick; no restart is needed. Channel
knowledge (which channels exist, how a channel keys its sessions) is passed in by
`app.cli`, so this package still imports no channel.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.config import Settings
from app.events import SessionScope, build_session_key

if TYPE_CHECKING:
    from app.scheduling.store import JobStore

ScopeOf = Callable[[str], SessionScope | None]
"""The session scope of a channel by name, or None if there is no such channel."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `cron` command to the `chatgate` sub-command parsers."""
    cron: argparse.ArgumentParser = sub.add_parser("cron", help="scheduled jobs and reminders")
    actions = cron.add_subparsers(dest="action", required=True)

    ls = actions.add_parser("list", help="print jobs as JSON")
    ls.add_argument("--session", help="only jobs of this source session key")
    ls.add_argument("--enabled", action="store_true", help="only enabled jobs")
    ls.add_argument("--limit", type=int, default=100)

    add = actions.add_parser("add", help="create a job")
    when = add.add_mutually_exclusive_group(required=True)
    when.add_argument("--schedule", help="cron expression, e.g. '0 9 * * 1-5'")
    when.add_argument("--at", help="one-shot ISO-8601 time, e.g. 2026-12-24T18:00")
    add.add_argument("--prompt", required=True, help="text the session receives when the job fires")
    add.add_argument("--channel", required=True, help="channel the answer goes to, e.g. telegram")
    add.add_argument("--chat", required=True, help="chat id on that channel")
    add.add_argument("--thread", help="thread/topic id on that channel")
    add.add_argument("--tz", default="UTC", help="IANA time zone of --schedule/--at (default UTC)")
    add.add_argument("--session-key", help="session the prompt lands on (default: the target chat's)")
    add.add_argument("--name")
    add.add_argument("--max-runs", type=int, help="disable the job after this many fires")
    add.add_argument("--disabled", action="store_true", help="create it disabled")

    for action, text in (
        ("remove", "delete a job"),
        ("enable", "enable a job"),
        ("disable", "disable a job"),
    ):
        parser = actions.add_parser(action, help=text)
        parser.add_argument("id", type=int)
    return cron


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


async def run(settings: Settings, args: argparse.Namespace, scope_of: ScopeOf) -> int:
    # Imported here: every `chatgate` start builds this parser, few run the command.
    from app.db.engine import create_engine
    from app.migrate import upgrade
    from app.scheduling.schedule import InvalidSchedule
    from app.scheduling.store import JobStore

    if settings.auto_migrate:
        await upgrade(settings.database_url)
    engine = create_engine(settings)
    try:
        return await _run(JobStore(engine), args, scope_of)
    except InvalidSchedule as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        await engine.dispose()


async def _run(jobs: JobStore, args: argparse.Namespace, scope_of: ScopeOf) -> int:
    from app.scheduling.store import Target

    if args.action == "list":
        found = await jobs.list_jobs(
            source_session_key=args.session, enabled=True if args.enabled else None, limit=args.limit
        )
        _print([j.to_dict() for j in found])
        return 0
    if args.action == "add":
        scope = scope_of(args.channel)
        if scope is None or args.channel == "cron":
            print(f"error: unknown target channel {args.channel!r}", file=sys.stderr)
            return 2
        key = args.session_key
        if key is None:
            if scope is SessionScope.USER_IN_CHAT:
                print(f"error: {args.channel} keys sessions per user: give --session-key", file=sys.stderr)
                return 2
            key = build_session_key(args.channel, args.chat, scope, thread_id=args.thread)
        job = await jobs.create(
            prompt=args.prompt,
            source_session_key=key,
            target=Target(args.channel, args.chat, args.thread),
            schedule=args.schedule,
            run_at=args.at,
            timezone=args.tz,
            name=args.name,
            max_runs=args.max_runs,
            enabled=not args.disabled,
            created_by="cli",
        )
        _print(job.to_dict())
        return 0
    if args.action == "remove":
        if not await jobs.delete(args.id):
            print(f"error: no cron job with id {args.id}", file=sys.stderr)
            return 1
        print(f"removed cron job {args.id}")
        return 0
    changed = await jobs.set_enabled(args.id, args.action == "enable")
    if changed is None:
        print(f"error: no cron job with id {args.id}", file=sys.stderr)
        return 1
    _print(changed.to_dict())
    return 0
