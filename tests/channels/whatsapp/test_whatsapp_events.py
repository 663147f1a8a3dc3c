"""WhatsApp Cloud API platform-native events end to end (docs/events.md): approval prompts
carry reply buttons whose presses decide them, ✅ on a prompt approves, other reactions are
notes for the model, and (Coexistence numbers) edits and revokes reach the history.

Webhooks are signed here by the published rule (`X-Hub-Signature-256`: hex HMAC-SHA256 of
the body with the app secret); answers go to a fake Graph API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox
from app.events import SessionScope, native_of
from channels.whatsapp.parse import parse
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count, settled_outbox, wait_inbox_done
from tests.channels.whatsapp.test_whatsapp import PHONE, SECRET, TOKEN, USER, wa_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.fakes.whatsapp import GraphAPI, native_message, signed_headers, text_message
from tests.support.timing import eventually

OTHER = "15557654321"
GROUP = "120363040000000001"


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def _post(client: httpx.AsyncClient, srv: Any, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    return await client.post(
        f"{srv.url}/channels/whatsapp", content=body, headers=signed_headers(SECRET, body)
    )


def _texts(graph: GraphAPI) -> list[str]:
    out = []
    for sent in graph.sent:
        if sent.body["type"] == "text":
            out.append(sent.body["text"]["body"])
        elif sent.body["type"] == "interactive":
            out.append(sent.body["interactive"]["body"]["text"])
    return out


def _user_texts(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


async def test_an_approval_prompt_has_reply_buttons_and_a_press_decides_it(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, GraphAPI(TOKEN, PHONE) as graph:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        settings = wa_settings(graph, approvers=[USER])
        async with (
            serve(
                channel_settings={"whatsapp": settings},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            asked = text_message(PHONE, USER, "@15550001111 write out.txt", group_id=GROUP)
            assert (await _post(client, srv, asked)).status_code == 200
            [prompt] = await graph.wait_for(1)
            assert prompt.body["recipient_type"] == "group" and prompt.body["to"] == GROUP
            assert (
                prompt.body["type"] == "interactive"
                and "/approve" in prompt.body["interactive"]["body"]["text"]
            )
            approve, deny = (b["reply"] for b in prompt.body["interactive"]["action"]["buttons"])
            assert approve["id"].startswith("approve:") and deny["id"].startswith("deny:")
            await settled_outbox(srv.runtime)

            # Another member of the group who may not approve: refused, nothing run.
            press = {"type": "button_reply", "button_reply": approve}
            refused = native_message(PHONE, OTHER, "interactive", press, context=prompt.wamid, group_id=GROUP)
            assert (await _post(client, srv, refused)).status_code == 200
            await wait_inbox_done(srv.runtime)
            await eventually(lambda: any("not allowed" in t for t in _texts(graph)))
            assert not (tmp_path / "out.txt").exists()

            pressed = native_message(PHONE, USER, "interactive", press, context=prompt.wamid, group_id=GROUP)
            assert (await _post(client, srv, pressed)).status_code == 200
            assert (await _post(client, srv, pressed)).status_code == 200  # redelivered: stored once
            await eventually(lambda: "Written." in _texts(graph))
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
            assert await count(srv.runtime, inbox) == 3
    assert (decided["status"], decided["decided_by"]) == ("approved", USER)
    assert (tmp_path / "out.txt").read_text() == "hi"


async def test_a_check_mark_reaction_approves_and_other_reactions_are_notes(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model, GraphAPI(TOKEN, PHONE) as graph:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = wa_settings(graph, approvers=[USER])
        async with (
            serve(
                channel_settings={"whatsapp": settings},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            assert (await _post(client, srv, text_message(PHONE, USER, "write r.txt"))).status_code == 200
            [prompt] = await graph.wait_for(1)
            await settled_outbox(srv.runtime)
            check = native_message(PHONE, USER, "reaction", {"message_id": prompt.wamid, "emoji": "✅"})
            assert (await _post(client, srv, check)).status_code == 200
            await eventually(lambda: "Written." in _texts(graph))
            await wait_inbox_done(srv.runtime)
            written = next(s.wamid for s in graph.sent if s.body.get("text", {}).get("body") == "Written.")
            fire = native_message(PHONE, USER, "reaction", {"message_id": written, "emoji": "🔥"})
            assert (await _post(client, srv, fire)).status_code == 200
            assert (await _post(client, srv, text_message(PHONE, USER, "thanks"))).status_code == 200
            await eventually(lambda: "echo thanks" in _texts(graph))
    assert (tmp_path / "r.txt").read_text() == "ok"
    seen = _user_texts(model.requests[-1])
    assert seen[-1] == "thanks"
    assert any('reacted with 🔥 to your answer "Written."' in t for t in seen)
    assert _texts(graph).count("echo thanks") == 1 and len(graph.sent) == 3  # reactions get no answer


async def test_an_edit_and_a_revoke_reach_the_history(serve: ServeApp) -> None:
    async with FakeOpenAI(default=echo) as model, GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            meet = text_message(PHONE, USER, "meet at 5", message_id="wamid.MEET")
            pin = text_message(PHONE, USER, "my pin is 1234", message_id="wamid.PIN")
            for payload in (meet, pin):
                assert (await _post(client, srv, payload)).status_code == 200
            await eventually(lambda: "echo my pin is 1234" in _texts(graph))
            await wait_inbox_done(srv.runtime)
            edit = {
                "original_message_id": "wamid.MEET",
                "message": {"type": "text", "text": {"body": "meet at 6"}},
            }
            revoke = {"original_message_id": "wamid.PIN"}
            for payload in (
                native_message(PHONE, USER, "edit", edit),
                native_message(PHONE, USER, "revoke", revoke),
            ):
                assert (await _post(client, srv, payload)).status_code == 200
            await wait_inbox_done(srv.runtime)
            assert (await _post(client, srv, text_message(PHONE, USER, "ok?"))).status_code == 200
            await eventually(lambda: "echo ok?" in _texts(graph))
    seen = _user_texts(model.requests[-1])
    assert seen[-1] == "ok?"
    assert any('edited an earlier message: "meet at 5" now reads "meet at 6"' in t for t in seen)
    assert not any("1234" in t for t in seen)
    assert any("recalled an earlier message" in t for t in seen)
    assert len(graph.sent) == 3  # the edit and the revoke are not answered; nothing deleted


async def test_a_reaction_without_its_message_is_refused(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            bad = native_message(PHONE, USER, "reaction", {"emoji": "👍"})
            del bad["entry"][0]["changes"][0]["value"]["messages"][0]["id"]
            resp = await _post(client, srv, bad)
            assert resp.status_code == 400, resp.text
            assert await count(srv.runtime, inbox) == 0


def test_other_buttons_are_actions_and_list_replies_stay_messages() -> None:
    pressed = native_message(
        PHONE,
        USER,
        "interactive",
        {"type": "button_reply", "button_reply": {"id": "size:L", "title": "Large"}},
    )
    listed = native_message(
        PHONE, USER, "interactive", {"type": "list_reply", "list_reply": {"id": "r1", "title": "Red"}}
    )
    taken_back = native_message(PHONE, USER, "reaction", {"message_id": "wamid.OUT1"})
    [press, pick, reaction] = [
        parse(p, phone_number_id=PHONE, scope=SessionScope.CHAT).messages[0].event
        for p in (pressed, listed, taken_back)
    ]
    native = native_of(press)
    assert native is not None and (native.kind, native.action, native.value) == ("action", "size", "L")
    assert native_of(pick) is None and pick.text == "Red"
    gone = native_of(reaction)
    assert gone is not None and gone.removed and gone.target == "wamid.OUT1" and gone.emoji is None
