"""Socket Mode (development): events over the WebSocket the app opens, acknowledged after the commit."""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox, outbox, runs
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.slack import FakeSlack
from tests.support.timing import eventually


async def test_socket_mode_event_is_acknowledged_answered_and_redelivery_is_processed_once(
    serve: ServeApp,
) -> None:
    async with FakeSlack() as fake:
        settings = slack_settings(fake, mode="socket", app_token=sl.APP_TOKEN, signing_secret=None)
        async with serve(channel_settings={"slack": settings}) as srv:
            await fake.wait_for_socket()
            payload = sl.event_callback(sl.dm("over the socket"))
            await fake.push_envelope(payload, "env-1")
            assert await fake.wait_for_acks(1) == ["env-1"]
            assert await count(srv.runtime, inbox) == 1  # stored before the ack was sent
            await fake.push_envelope(payload, "env-1", retry_attempt=1)
            await fake.wait_for_acks(2)
            [call] = await fake.wait_for("chat.postMessage", 1)
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
            # Without SLACK_SIGNING_SECRET the HTTP endpoint is refused as not configured.
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_event(client, srv.url, payload)
                assert resp.status_code == 503
                assert "SLACK_SIGNING_SECRET" in resp.json()["detail"]
            # A bot message over the socket is acknowledged and ignored.
            await fake.push_envelope(sl.event_callback(sl.dm("bot", bot_id="BX")), "env-2")
            await fake.wait_for_acks(3)
            assert await count(srv.runtime, inbox) == 1
    assert fake.calls_of("apps.connections.open")[0].headers["authorization"] == f"Bearer {sl.APP_TOKEN}"
    assert call.params["channel"] == "D0ALICE"
    assert call.params["text"] == "You said: over the socket"


async def test_socket_mode_button_presses_are_acknowledged_and_decide_like_the_request_url(
    serve: ServeApp, tmp_path: Path
) -> None:
    """`interactive` envelopes (block_actions) reach the same handler as the HTTP Request URL:
    a press by someone not allowed gets an ephemeral refusal and runs nothing; the approver's
    press approves, and Slack's redelivery of that envelope does not run the tool twice."""
    async with FakeOpenAI() as model, FakeSlack() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "s.txt", "content": "sock"})), text("Saved."))
        settings = slack_settings(
            fake,
            mode="socket",
            app_token=sl.APP_TOKEN,
            signing_secret=None,
            streaming="off",
            approvers=["UBOSS"],
        )
        async with serve(
            channel_settings={"slack": settings}, **openai_settings(model, workspace_root=str(tmp_path))
        ) as srv:
            await fake.wait_for_socket()
            await fake.push_envelope(sl.event_callback(sl.dm("write s.txt", user="UBOSS")), "env-1")
            [prompt] = await fake.wait_for("chat.postMessage", 1)
            value = prompt.params["blocks"][1]["elements"][0]["value"]
            [ts] = [ts for ts, t in fake.texts.items() if "/approve" in t]

            refused = sl.block_action("approve", value, on_ts=ts, channel="D0ALICE", user="UMALLORY")
            await fake.push_envelope(refused, "env-2", kind="interactive")
            assert await fake.wait_for_acks(2) == ["env-1", "env-2"]
            assert await count(srv.runtime, inbox) == 2  # the press was stored before its ack
            [refusal] = await fake.wait_for("chat.postEphemeral", 1)
            await wait_inbox_done(srv.runtime)
            assert not (tmp_path / "s.txt").exists()

            approved = sl.block_action("approve", value, on_ts=ts, channel="D0ALICE", user="UBOSS")
            await fake.push_envelope(approved, "env-3", kind="interactive")
            await fake.wait_for_acks(3)
            await fake.push_envelope(approved, "env-3", kind="interactive")  # redelivered
            await fake.wait_for_acks(4)
            await eventually(lambda: "Saved." in fake.texts.values())
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 3
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
                [run] = (await conn.execute(select(runs))).mappings().all()
    assert (refusal.params["user"], refusal.params["channel"]) == ("UMALLORY", "D0ALICE")
    assert "not allowed" in refusal.params["text"]
    assert len(fake.calls_of("chat.postEphemeral")) == 1
    assert (decided["status"], decided["decided_by"]) == ("approved", "UBOSS")
    assert (tmp_path / "s.txt").read_text() == "sock"
    assert [c["decision"] for c in run["tool_calls"]] == ["approved"]  # ran once
