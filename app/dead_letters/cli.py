"""`chatgate dead-letters list|retry|discard`: act on dead letters straight in the database.

A running server picks retried rows up at its next poll (`INBOX_POLL_SECONDS`,
`OUTBOX_POLL_SECONDS`); no restart is needed.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from app.config import Settings

if TYPE_CHECKING:
    from app.dead_letters.store import DeadLetterFilter


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `dead-letters` command to the `chatgate` sub-command parsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "dead-letters", help="failed events and deliveries: list, retry once more, discard"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    for action, text in (
        ("list", "print dead letters as JSON, newest failure first"),
        ("retry", "give dead letters exactly one more attempt"),
        ("discard", "mark dead letters discarded (never run; retention may delete them)"),
    ):
        one = actions.add_parser(action, help=text)
        if action != "list":
            one.add_argument("ids", nargs="*", help="inbox:<n> or outbox:<n>")
            one.add_argument("--all", action="store_true", help="every dead letter matching the filter")
        one.add_argument("--kind", choices=["inbox", "outbox"])
        one.add_argument("--channel")
        one.add_argument("--session", help="session key")
        one.add_argument("--error", help="substring of the error")
        one.add_argument("--before", type=datetime.fromisoformat, help="failed before (ISO-8601, UTC)")
        one.add_argument("--after", type=datetime.fromisoformat, help="failed at or after (ISO-8601, UTC)")
        if action == "list":
            one.add_argument("--limit", type=int, default=100)
    return parser


def _filter(args: argparse.Namespace) -> DeadLetterFilter:
    from app.dead_letters.store import DeadLetterFilter

    return DeadLetterFilter(
        kind=args.kind,
        ids=tuple(getattr(args, "ids", ()) or ()),
        channel=args.channel,
        session_key=args.session,
        error_contains=args.error,
        failed_before=args.before,
        failed_after=args.after,
    )


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


async def run(settings: Settings, args: argparse.Namespace) -> int:
    # Imported here: every `chatgate` start builds this parser, few run the command.
    from app.db.engine import create_engine
    from app.dead_letters.store import BadDeadLetterId, DeadLetters, parse_id

    f = _filter(args)
    try:
        for one in f.ids:
            parse_id(one)
    except BadDeadLetterId as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.action != "list" and f.is_empty() and not args.all:
        print("error: give ids or a filter, or --all", file=sys.stderr)
        return 2
    engine = create_engine(settings)
    store = DeadLetters(
        engine, event_attempts=settings.max_event_attempts, delivery_attempts=settings.outbox_max_attempts
    )
    try:
        if args.action == "list":
            _print({"dead_letters": await store.search(f, limit=args.limit), "counts": await store.counts()})
            return 0
        resolve = store.retry if args.action == "retry" else store.discard
        done = [item.id for item in await resolve(f)]
        _print({"retried" if args.action == "retry" else "discarded": done})
        if f.ids and len(done) < len(set(f.ids)):
            missing = sorted(set(f.ids) - set(done))
            print(f"not dead letters (resolved already, or unknown): {', '.join(missing)}", file=sys.stderr)
            return 1
        return 0
    finally:
        await engine.dispose()
