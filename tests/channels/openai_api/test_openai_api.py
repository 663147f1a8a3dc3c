"""The OpenAI-compatible API, end to end: the official `openai` SDK (sync and async, stream
and not) against a running server, on both stores."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from sqlalchemy import select

from app.db.models import inbox, messages, sessions
from channels.openai_api import OpenAIApiSettings
from tests.agents.test_agents import AGENTS_YAML, system_text
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, calls, text
from tests.pipeline.test_approvals import approval_id, write_call

TOKEN_A = "openai-token-of-caller-one-0123"
TOKEN_B = "openai-token-of-caller-two-0123"


def api_settings(**overrides: Any) -> OpenAIApiSettings:
    values: dict[str, Any] = {"tokens": {TOKEN_A: "caller-one", TOKEN_B: "caller-two"}}
    values.update(overrides)
    return OpenAIApiSettings(_env_file=None, **values)  # type: ignore[call-arg]


def channels(**overrides: Any) -> dict[str, Any]:
    return {"openai": api_settings(**overrides), "webhook": webhook_settings()}


def sync_client(url: str, token: str = TOKEN_A) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=30)


def async_client(url: str, token: str = TOKEN_A) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=30)


def session(name: str) -> dict[str, str]:
    return {"X-Chatgate-Session": name}


async def history(runtime: Any, key: str) -> list[tuple[str, str]]:
    async with runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(messages.c.role, messages.c.content)
            .join(sessions, sessions.c.id == messages.c.session_id)
            .where(sessions.c.key == key)
            .order_by(messages.c.seq)
        )
        return [(str(r[0]), str(r[1])) for r in rows]


async def keys(runtime: Any) -> list[str]:
    async with runtime.engine.connect() as conn:
        return [str(r[0]) for r in await conn.execute(select(inbox.c.session_key).order_by(inbox.c.id))]


# --- sync SDK (in a thread: the server runs in this test's event loop) ----------------------


async def test_sync_client_lists_models_and_completes(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        client = sync_client(srv.url)

        def run() -> tuple[list[str], Any]:
            models = [m.id for m in client.models.list()]
            done = client.chat.completions.create(
                model="chatgate", messages=[{"role": "user", "content": "hello there"}]
            )
            return models, done

        models, done = await asyncio.to_thread(run)
        assert models == ["chatgate"]
        assert done.object == "chat.completion"
        assert done.model == "chatgate"
        assert done.choices[0].message.role == "assistant"
        assert done.choices[0].message.content == "You said: hello there"
        assert done.choices[0].finish_reason == "stop"
        assert done.usage is not None
        [key] = await keys(srv.runtime)
        assert key.startswith("openai:caller-one:once-")  # one-off: a session of its own
        assert await history(srv.runtime, key) == [
            ("user", "hello there"),
            ("assistant", "You said: hello there"),
        ]


async def test_sync_client_streams_until_done_with_usage(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        client = sync_client(srv.url)

        def run() -> list[Any]:
            stream = client.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "stream me"}],
                stream=True,
                stream_options={"include_usage": True},
            )
            return list(stream)

        chunks = await asyncio.to_thread(run)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "You said: stream me"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # the usage chunk ends it
    assert all(c.usage is None for c in chunks[:-1])


async def test_wrong_or_missing_token_is_401_in_openai_shape_and_never_echoed(serve: ServeApp) -> None:
    wrong = "sk-this-is-someone-elses-secret-key"
    async with serve(channel_settings=channels()) as srv:
        with pytest.raises(openai.AuthenticationError) as caught:
            await async_client(srv.url, wrong).models.list()
        assert caught.value.status_code == 401
        assert wrong not in str(caught.value.body) and wrong not in caught.value.message
        assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "invalid_request_error"
        async with httpx.AsyncClient(timeout=30) as http:
            bare = await http.post(f"{srv.url}/v1/chat/completions", json={"model": "chatgate"})
        assert bare.status_code == 401
        assert set(bare.json()["error"]) == {"message", "type", "param", "code"}
        assert await count(srv.runtime, inbox) == 0


async def test_bad_requests_are_4xx_and_store_nothing(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        client = async_client(srv.url)
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert unknown.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model="chatgate", messages=[])
        with pytest.raises(openai.BadRequestError, match="last message"):
            await client.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            )
        with pytest.raises(openai.BadRequestError, match="text content"):
            await client.chat.completions.create(
                model="chatgate",
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}],
                    }
                ],
            )
        assert await count(srv.runtime, inbox) == 0


# --- async SDK, sessions ---------------------------------------------------------------------


async def test_a_session_header_keeps_the_conversation_per_caller(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Nice to meet you, Ada."), text("Your name is Ada."), text("I don't know."))
        async with serve(channel_settings=channels(), **openai_settings(fake)) as srv:
            one, two = async_client(srv.url), async_client(srv.url, TOKEN_B)
            first = await one.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "I am Ada."}],
                extra_headers=session("s1"),
            )
            assert first.choices[0].message.content == "Nice to meet you, Ada."
            # Only the new message is sent: the server keeps the rest.
            second = await one.chat.completions.with_raw_response.create(
                model="chatgate",
                messages=[{"role": "user", "content": "What is my name?"}],
                extra_headers=session("s1"),
            )
            assert second.headers["x-chatgate-session"] == "s1"
            assert second.parse().choices[0].message.content == "Your name is Ada."
            other = await two.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "What is my name?"}],
                extra_headers=session("s1"),
            )
            assert other.choices[0].message.content == "I don't know."
            seen = [r.messages for r in await fake.wait_requests(3)]
        said = [[(m["role"], m.get("content")) for m in ms if m["role"] != "system"] for ms in seen]
        assert said[1] == [
            ("user", "I am Ada."),
            ("assistant", "Nice to meet you, Ada."),
            ("user", "What is my name?"),
        ]
        assert said[2] == [("user", "What is my name?")]  # caller two's s1 is another session
        assert await keys(srv.runtime) == [
            "openai:caller-one:s1",
            "openai:caller-one:s1",
            "openai:caller-two:s1",
        ]


async def test_async_stream_in_a_session_and_a_client_resending_everything(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        client = async_client(srv.url)
        stream = await client.chat.completions.create(
            model="chatgate",
            messages=[{"role": "user", "content": "one"}],
            stream=True,
            extra_headers=session("s"),
        )
        chunks = [c async for c in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "You said: one"
        assert all(c.usage is None for c in chunks)  # not asked for
        # A client that sends the whole conversation again: only the new user message is added.
        again = await client.chat.completions.create(
            model="chatgate",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "You said: one"},
                {"role": "user", "content": "two"},
            ],
            extra_headers=session("s"),
        )
        assert again.choices[0].message.content == "You said: two"
        assert await history(srv.runtime, "openai:caller-one:s") == [
            ("user", "one"),
            ("assistant", "You said: one"),
            ("user", "two"),
            ("assistant", "You said: two"),
        ]


async def test_one_off_request_gives_the_model_all_its_messages(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Paris."))
        async with serve(channel_settings=channels(), **openai_settings(fake)) as srv:
            done = await async_client(srv.url).chat.completions.create(
                model="chatgate",
                messages=[
                    {"role": "system", "content": "Answer in one word."},
                    {"role": "user", "content": "Capital of Italy?"},
                    {"role": "assistant", "content": "Rome."},
                    {"role": "user", "content": "And of France?"},
                ],
            )
            [request] = await fake.wait_requests(1)
        assert done.choices[0].message.content == "Paris."
        [user] = [m["content"] for m in request.messages if m["role"] == "user"]
        assert "[system] Answer in one word." in user
        assert "[user] Capital of Italy?" in user and "[assistant] Rome." in user
        assert user.endswith("And of France?")


async def test_same_idempotency_key_is_one_turn_and_the_same_answer(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Only once."), text("A second turn!"))
        async with serve(channel_settings=channels(), **openai_settings(fake)) as srv:
            client = async_client(srv.url)
            headers = {"Idempotency-Key": "req-42"}
            ask: list[ChatCompletionMessageParam] = [{"role": "user", "content": "do it"}]
            first = await client.chat.completions.create(
                model="chatgate", messages=ask, extra_headers=headers
            )
            second = await client.chat.completions.create(
                model="chatgate", messages=ask, extra_headers=headers
            )
            stream = await client.chat.completions.create(
                model="chatgate", messages=ask, extra_headers=headers, stream=True
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert await count(srv.runtime, inbox) == 1
            assert len(fake.requests) == 1
        assert first.id == second.id
        assert (
            first.choices[0].message.content == second.choices[0].message.content == streamed == "Only once."
        )


async def test_a_busy_session_answers_in_turn_order(serve: ServeApp) -> None:
    async with serve(channel_settings=channels(), offline_latency_ms=600) as srv:
        client = async_client(srv.url)

        async def ask(word: str) -> str:
            done = await client.chat.completions.create(
                model="chatgate", messages=[{"role": "user", "content": word}], extra_headers=session("busy")
            )
            return str(done.choices[0].message.content)

        first = asyncio.create_task(ask("first"))
        async with asyncio.timeout(10):  # the first is stored (and running) before the second is sent
            while await count(srv.runtime, inbox) < 1:
                await asyncio.sleep(0.02)
        second = asyncio.create_task(ask("second"))
        assert await asyncio.gather(first, second) == ["You said: first", "You said: second"]
        assert await history(srv.runtime, "openai:caller-one:busy") == [
            ("user", "first"),
            ("assistant", "You said: first"),
            ("user", "second"),
            ("assistant", "You said: second"),
        ]


async def test_a_request_that_outlasts_the_wait_is_504_and_answered_on_retry(serve: ServeApp) -> None:
    async with serve(channel_settings=channels(wait_max_seconds=0.3), offline_latency_ms=1500) as srv:
        client = async_client(srv.url)
        headers = {"Idempotency-Key": "slow-1"}
        with pytest.raises(openai.APIStatusError) as slow:
            await client.chat.completions.create(
                model="chatgate", messages=[{"role": "user", "content": "slow"}], extra_headers=headers
            )
        assert slow.value.status_code == 504
        assert "Idempotency-Key" in slow.value.message
        async with asyncio.timeout(20):
            while True:
                try:
                    done = await client.chat.completions.create(
                        model="chatgate",
                        messages=[{"role": "user", "content": "slow"}],
                        extra_headers=headers,
                    )
                    break
                except openai.APIStatusError as exc:
                    assert exc.status_code == 504
        assert done.choices[0].message.content == "You said: slow"
        assert await count(srv.runtime, inbox) == 1


async def test_tool_progress_stays_out_of_the_content(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv:
        client = async_client(srv.url)
        done = await client.chat.completions.create(
            model="chatgate",
            messages=[{"role": "user", "content": "what time is it?"}],
            extra_headers=session("t"),
        )
        stream = await client.chat.completions.create(
            model="chatgate",
            messages=[{"role": "user", "content": "what time is it?"}],
            extra_headers=session("t"),
            stream=True,
        )
        streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        roles = [role for role, _ in await history(srv.runtime, "openai:caller-one:t")]
    for content in (str(done.choices[0].message.content), streamed):
        assert content.startswith("It is ") and "\n" not in content
    assert "tool" in roles  # the tool ran, in the history only


async def test_a_risky_tool_is_refused_unless_the_caller_approves(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(write_call(), content="I'll write it."),
            text("I could not write the file."),
            calls(write_call("call_2"), content="Writing."),
            text("Written."),
        )
        settings = openai_settings(fake, workspace_root=str(tmp_path))
        async with serve(channel_settings=channels(approvers=["caller-two"]), **settings) as srv:
            refused = await async_client(srv.url).chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "write out.txt"}],
                extra_headers=session("w"),
            )
            assert refused.choices[0].message.content == "I could not write the file."
            assert not (tmp_path / "out.txt").exists()
            tool_results = [c for r, c in await history(srv.runtime, "openai:caller-one:w") if r == "tool"]
            assert tool_results and "approve" in tool_results[0].lower()

            approver = async_client(srv.url, TOKEN_B)
            asked = await approver.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": "write out.txt"}],
                extra_headers=session("w"),
            )
            number = approval_id(str(asked.choices[0].message.content))  # answered, not hanging
            assert not (tmp_path / "out.txt").exists()
            done = await approver.chat.completions.create(
                model="chatgate",
                messages=[{"role": "user", "content": f"/approve {number}"}],
                extra_headers=session("w"),
            )
            assert "Written." in str(done.choices[0].message.content)
            assert (tmp_path / "out.txt").read_text() == "hello"


async def test_a_stream_that_outlasts_the_wait_ends_with_an_error_event(serve: ServeApp) -> None:
    async with serve(channel_settings=channels(wait_max_seconds=0.3), offline_latency_ms=1500) as srv:
        stream = await async_client(srv.url).chat.completions.create(
            model="chatgate", messages=[{"role": "user", "content": "slow"}], stream=True
        )
        seen = []
        with pytest.raises(openai.APIError, match="Idempotency-Key"):
            async for chunk in stream:
                seen.append(chunk)
        assert [c.choices[0].delta.role for c in seen] == ["assistant"]  # the role, then the error


async def test_the_model_picks_the_agent(serve: ServeApp, tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS_YAML.replace("    users: [boss]\n", "    users: [caller-two]\n"))
    async with FakeOpenAI() as fake:
        fake.default = text("ok")
        settings = openai_settings(fake, agents_file=str(path))
        async with serve(channel_settings=channels(), **settings) as srv:
            one, two = async_client(srv.url), async_client(srv.url, TOKEN_B)
            assert [m.id async for m in one.models.list()] == [
                "chatgate",
                "support",
            ]  # ops: not for caller-one
            assert [m.id async for m in two.models.list()] == ["chatgate", "support", "ops"]
            for model in ("chatgate", "support"):
                await one.chat.completions.create(
                    model=model,
                    messages=[{"role": "user", "content": "who are you?"}],
                    extra_headers=session("s"),
                )
            with pytest.raises(openai.NotFoundError):
                await one.chat.completions.create(model="ops", messages=[{"role": "user", "content": "hi"}])
            default, support = await fake.wait_requests(2)
            assert await keys(srv.runtime) == ["openai:caller-one:s", "openai:%agent=support:caller-one:s"]
    assert "You are Ada" in system_text(default)
    assert "You are Sam from support" in system_text(support)
    assert support.body["model"] == "support-model"
