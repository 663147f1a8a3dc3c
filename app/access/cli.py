"""`chatgate access …`: approve pairing codes and edit the stored allowlists.

Changes are made straight in the database; running servers see them with the next
message (nothing is cached), on every replica; an `--admin` entry within the channel's
`role_cache_seconds`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
from typing import Any

from app.config import Settings


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `access` command to the `chatgate` sub-command parsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "access", help="who may talk to the bot: pairing codes and allowlists"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    approve = actions.add_parser("approve", help="let the sender who was given CODE talk from now on")
    approve.add_argument("code")
    pending = actions.add_parser("pending", help="pairing requests waiting for approval (JSON)")
    pending.add_argument("--channel")
    listing = actions.add_parser("list", help="the stored allowlist entries (JSON)")
    listing.add_argument("--channel")
    for action, text in (
        ("allow", "allow a sender (or with --chat, everyone in a group chat)"),
        ("remove", "take a sender (or with --chat, a group chat) off the stored list"),
    ):
        one = actions.add_parser(action, help=text)
        one.add_argument("channel")
        one.add_argument("id", help="the sender's (or chat's) id on that platform")
        one.add_argument("--chat", action="store_true", help="ID is a group chat, not a sender")
        one.add_argument(
            "--admin", action="store_true", help="ID is a sender who is an admin in the channel's groups"
        )
        if action == "allow":
            one.add_argument("--note", help="why (shown in lists)")
    return parser


def _print(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _operator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except Exception:  # no user name in this environment (containers)
        return "cli"


async def run(settings: Settings, args: argparse.Namespace) -> int:
    # Here, not at the top: `chatgate` builds every command's parser on each start, and
    # only this command needs the gate's modules.
    from app.access.store import AccessStore, BadAccessInput
    from app.db.engine import create_engine

    engine = create_engine(settings)
    store = AccessStore(engine)
    try:
        if args.action == "approve":
            approved = await store.approve(args.code, by=_operator())
            if approved is None:
                print("error: no pending pairing code like that (expired, used, or unknown)", file=sys.stderr)
                return 1
            _print({"approved": {"channel": approved.channel, "sender_id": approved.sender_id}})
            return 0
        if args.action == "pending":
            _print({"pending": await store.pending(args.channel)})
            return 0
        if args.action == "list":
            _print({"entries": await store.entries(args.channel)})
            return 0
        kind = "chat" if args.chat else "admin" if args.admin else "sender"
        try:
            if args.action == "allow":
                added = await store.add(args.channel, kind, args.id, note=args.note, added_by=_operator())
                _print({"added": added, "channel": args.channel, "kind": kind, "id": args.id})
                return 0
            removed = await store.remove(args.channel, kind, args.id)
        except BadAccessInput as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        _print({"removed": removed, "channel": args.channel, "kind": kind, "id": args.id})
        return 0 if removed else 1
    finally:
        await engine.dispose()
