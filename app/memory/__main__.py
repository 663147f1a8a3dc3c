"""Operator commands for memory: `python -m app.memory …` (uses DATABASE_URL).

    python -m app.memory link telegram:12345 alice      # this identity is the person alice
    python -m app.memory link slack:U024BE7LH alice     # … and so is this one
    python -m app.memory unlink slack:U024BE7LH
    python -m app.memory links [alice]
    python -m app.memory global add "The office is closed on public holidays."
    python -m app.memory global list
    python -m app.memory global remove 17
    python -m app.memory show telegram:12345            # the user memory this identity sees

An identity is `channel:sender_id` as the platform sends it (everything after the first
colon is the sender id). The same operations are on the admin API
(`/admin/api/identity-links`, docs/memory.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence

from app.config import Settings
from app.memory_cli import add_subcommands


async def run(args: argparse.Namespace, settings: Settings) -> int:
    # Imported here: `chatgate` builds this parser on every start, few run the command.
    from app.db.engine import create_engine
    from app.memory.identity import IdentityLinks, parse_identity, resolve_owner
    from app.memory.store import GLOBAL_OWNER, MemoryStore, OwnerFilter, Scope

    engine = create_engine(settings)
    store = MemoryStore(engine)
    links = IdentityLinks(engine)
    try:
        if args.memory_command == "link":
            previous = await links.link(parse_identity(args.identity), args.person, created_by="cli")
            moved = f" (was {previous})" if previous and previous != args.person else ""
            print(f"linked {args.identity} to person {args.person}{moved}")
        elif args.memory_command == "unlink":
            print("unlinked" if await links.unlink(parse_identity(args.identity)) else "was not linked")
        elif args.memory_command == "links":
            print(json.dumps(await links.identities(args.person), indent=2))
        elif args.memory_command == "global" and args.action == "add":
            await store.put(Scope.GLOBAL, GLOBAL_OWNER, args.text, kind="operator")
            print("stored")
        elif args.memory_command == "global" and args.action == "list":
            for m in await store.entries([OwnerFilter(Scope.GLOBAL, GLOBAL_OWNER)], limit=1000):
                print(f"{m.id}\t{m.kind}\t{m.content}")
        elif args.memory_command == "global" and args.action == "remove":
            print("removed" if await store.delete(args.id, scope=Scope.GLOBAL) else "no such global memory")
        elif args.memory_command == "show":
            async with engine.connect() as conn:
                owner = await resolve_owner(conn, parse_identity(args.identity))
            for m in await store.entries([OwnerFilter(Scope.USER, owner)], limit=1000):
                print(f"{m.id}\t{m.kind}\t{m.content}")
        return 0
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        await engine.dispose()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m app.memory", description="chatgate memory admin")
    add_subcommands(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return asyncio.run(run(args, Settings()))


if __name__ == "__main__":
    raise SystemExit(main())
