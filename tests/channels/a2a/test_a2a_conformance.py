"""A2A behaviour the conformance suite (TCK) checks: ListTasks scoped to the caller,
version negotiation, parameter validation, a public card that names no server setting.
The a2a-sdk client where it can send the request; raw JSON-RPC where the point is a
request the SDK would not send.

Source of the cases: the A2A project's TCK (github.com/a2aproject/a2a-tck), its ListTasks,
version-negotiation (`A2A-Version`, -32009), `historyLength` and agent-card checks — the
ones that failed against chatgate (issue 35). No release of the TCK is served by the
package registries these machines reach, so the cases that matter are kept here as tests
of our own, not the TCK itself."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import pytest
from a2a.types.a2a_pb2 import GetTaskRequest, ListTasksRequest, TaskState
from a2a.utils.errors import InvalidParamsError

from app.db.models import inbox
from tests.channels.a2a.test_a2a import TOKEN_A, TOKEN_B, channels, only_task, sdk_client, user_message
from tests.channels.support import count
from tests.conftest import ServeApp


async def rpc(
    url: str, method: str, params: dict[str, Any], version: str | None, *, in_query: bool = False
) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {TOKEN_A}"}
    if version is not None and not in_query:
        headers["A2A-Version"] = version
    query = {"A2A-Version": version} if in_query and version is not None else None
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(f"{url}/a2a", json=body, headers=headers, params=query)
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


def v1_message(text: str) -> dict[str, Any]:
    return {
        "message": {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}]},
        "configuration": {"returnImmediately": True},
    }


def v03_message(text: str) -> dict[str, Any]:
    return {
        "message": {
            "messageId": uuid.uuid4().hex,
            "role": "user",
            "kind": "message",
            "parts": [{"kind": "text", "text": text}],
        },
        "configuration": {"blocking": False},
    }


async def test_list_tasks_shows_only_the_callers_tasks_in_pages(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels()) as srv,
        sdk_client(srv.url, TOKEN_A) as one,
        sdk_client(srv.url, TOKEN_B) as two,
    ):
        mine = [
            await only_task(one, user_message(f"task {n}", "ctx-a" if n < 2 else "ctx-b")) for n in range(3)
        ]
        theirs = await only_task(two, user_message("not yours", "ctx-a"))

        first = await one.list_tasks(ListTasksRequest(page_size=2))
        assert [t.id for t in first.tasks] == [mine[2].id, mine[1].id]  # newest first
        assert first.total_size == 3 and first.page_size == 2 and first.next_page_token
        empty = await one.list_tasks(ListTasksRequest(context_id="no-such-context"))
        assert (list(empty.tasks), empty.total_size, empty.page_size, empty.next_page_token) == ([], 0, 0, "")
        rest = await one.list_tasks(ListTasksRequest(page_size=2, page_token=first.next_page_token))
        assert [t.id for t in rest.tasks] == [mine[0].id]
        assert rest.next_page_token == "" and rest.page_size == 1

        in_context = await one.list_tasks(ListTasksRequest(context_id="ctx-a"))
        assert {t.id for t in in_context.tasks} == {mine[0].id, mine[1].id}
        done = await one.list_tasks(ListTasksRequest(status=TaskState.TASK_STATE_COMPLETED, history_length=0))
        assert len(done.tasks) == 3 and all(len(t.history) == 0 for t in done.tasks)
        assert not any(t.artifacts for t in done.tasks)  # only with include_artifacts
        with_artifacts = await one.list_tasks(ListTasksRequest(page_size=1, include_artifacts=True))
        assert with_artifacts.tasks[0].artifacts[0].parts[0].text == "You said: task 2"

        others = await two.list_tasks(ListTasksRequest())
        assert [t.id for t in others.tasks] == [theirs.id]
        with pytest.raises(InvalidParamsError):
            await one.list_tasks(ListTasksRequest(page_size=0))
        with pytest.raises(InvalidParamsError):
            await one.list_tasks(ListTasksRequest(page_token="not-a-token"))


async def test_a_negative_history_length_is_refused(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        task = await only_task(client, user_message("hello", "c"))
        with pytest.raises(InvalidParamsError):
            await client.get_task(GetTaskRequest(id=task.id, history_length=-1))
        with pytest.raises(InvalidParamsError):
            await client.list_tasks(ListTasksRequest(history_length=-2))
        stored = await count(srv.runtime, inbox)
        refused = await rpc(
            srv.url, "SendMessage", {**v1_message("x"), "configuration": {"historyLength": -1}}, "1.0"
        )
        assert refused["error"]["code"] == -32602
        assert await count(srv.runtime, inbox) == stored  # nothing stored


async def test_an_unknown_status_filter_is_invalid_params(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        for status in ("INVALID_STATUS", 99, True):
            answer = await rpc(srv.url, "ListTasks", {"status": status}, "1.0")
            assert answer["error"]["code"] == -32602, answer
        ok = await rpc(srv.url, "ListTasks", {"status": "TASK_STATE_COMPLETED"}, "1.0")
        assert ok["result"]["totalSize"] == 0


async def test_version_negotiation(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        # No header: a request is read in its method's version, and served.
        assert "task" in (await rpc(srv.url, "SendMessage", v1_message("one"), None))["result"]
        assert (await rpc(srv.url, "message/send", v03_message("two"), None))["result"]["kind"] == "task"
        assert "task" in (await rpc(srv.url, "SendMessage", v1_message("three"), "1.0"))["result"]
        assert "task" in (await rpc(srv.url, "SendMessage", v1_message("four"), "1"))["result"]
        assert (await rpc(srv.url, "message/send", v03_message("five"), "0.3"))["result"]["kind"] == "task"
        assert (
            "task" in (await rpc(srv.url, "SendMessage", v1_message("six"), ""))["result"]
        )  # empty: unstated
        assert (
            "task" in (await rpc(srv.url, "SendMessage", v1_message("seven"), "1.0.3"))["result"]
        )  # patch ignored
        assert (await rpc(srv.url, "SendMessage", v1_message("x"), "99.0", in_query=True))["error"][
            "code"
        ] == -32009
        stored = await count(srv.runtime, inbox)
        for method, params, version in (
            ("message/send", v03_message("0.3 name, 1.0 header"), "1.0"),
            ("SendMessage", v1_message("unknown version"), "2.0"),
            ("message/send", v03_message("unknown version"), "0.1"),
            ("SendMessage", v1_message("not a version"), "latest"),
        ):
            answer = await rpc(srv.url, method, params, version)
            assert answer["error"]["code"] == -32009, (method, version, answer)
            assert answer["id"] == 7
        assert await count(srv.runtime, inbox) == stored


async def test_the_public_card_names_no_server_setting(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, httpx.AsyncClient(timeout=30) as http:
        card = (await http.get(f"{srv.url}/.well-known/agent-card.json")).text
    json.loads(card)
    for setting in ("A2A_TOKENS", "A2A_", "PUBLIC_BASE_URL", "AGENTS_FILE", "_TOKENS"):
        assert setting not in card
