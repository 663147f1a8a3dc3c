"""The memory commands' parser (`chatgate memory …`, `python -m app.memory …`).

Apart from `app.memory.__main__` because importing anything inside `app.memory` loads the
package (SQLAlchemy, the agent's modules), and `chatgate` builds every command's parser on
each start.
"""

from __future__ import annotations

import argparse


def add_subcommands(parser: argparse.ArgumentParser) -> None:
    """The memory commands, here and as `chatgate memory …`."""
    sub = parser.add_subparsers(dest="memory_command", required=True)
    link = sub.add_parser("link", help="link a channel identity to a person id")
    link.add_argument("identity")
    link.add_argument("person")
    sub.add_parser("unlink", help="remove an identity's link").add_argument("identity")
    sub.add_parser("links", help="list links").add_argument("person", nargs="?")
    glob = sub.add_parser("global", help="operator facts for every session")
    gsub = glob.add_subparsers(dest="action", required=True)
    gsub.add_parser("add").add_argument("text")
    gsub.add_parser("list")
    gsub.add_parser("remove").add_argument("id", type=int)
    sub.add_parser("show", help="user memory of an identity").add_argument("identity")
