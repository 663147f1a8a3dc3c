"""`chatgate chat`: the runtime on one event loop, the terminal as a channel (`cli`)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
from typing import Any

from app.config import Settings


class _StreamPrinter:
    """The answer on the terminal as it is written: deltas from the session's feed, then
    the delivered reply, which completes the streamed line (or is printed whole when the
    stream showed something else)."""

    def __init__(self) -> None:
        self.shown = ""  # streamed text of the line being written
        self.open = False

    async def follow(self, feed: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            self._take(await feed.get())

    def catch_up(self, feed: asyncio.Queue[dict[str, Any]]) -> None:
        """Show what the feed still holds before the delivered text is printed."""
        while not feed.empty():
            self._take(feed.get_nowait())

    def _take(self, item: dict[str, Any]) -> None:
        if item.get("type") == "delta":
            if not self.open:
                print("bot> ", end="")
                self.open = True
            print(item["text"], end="", flush=True)
            self.shown += item["text"]
        elif item.get("type") == "message" and item.get("role") == "assistant" and item.get("tool_calls"):
            self.close_line()  # text written before a tool call is not the answer

    def close_line(self) -> None:
        if self.open:
            print(flush=True)
        self.open, self.shown = False, ""

    def final(self, text: str) -> None:
        if self.open and text.startswith(self.shown):
            print(text[len(self.shown) :], flush=True)
            self.open, self.shown = False, ""
            return
        self.close_line()
        print(f"bot> {text}", flush=True)


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
        """Send one line; print the answer as the model writes it, then the replies to it
        once they are delivered (the delivered text completes what was streamed)."""
        from app.events import InboundEvent
        from channels.cli import CliChannel

        cli = self.runtime.adapters["cli"]
        assert isinstance(cli, CliChannel)
        event = InboundEvent.from_text("cli", self.chat_id, self.chat_id, line)
        printer = _StreamPrinter()
        async with self.runtime.bus.subscribe(event.session_key) as feed:
            watching = asyncio.create_task(printer.follow(feed))
            try:
                [accepted] = await self.runtime.ingest.accept("cli", [event])
                done = await self.runtime.waiters.wait_for_replies(accepted.event_id, 300)
                wanted = {reply.message_id for reply in done.replies}
                while wanted:
                    message = await asyncio.wait_for(cli.delivered.get(), 30)
                    wanted.discard(message.message_id)
                    printer.catch_up(feed)
                    printer.final(message.text)  # a late answer to an earlier line too
            finally:
                watching.cancel()
        if not done.done:
            printer.close_line()
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
