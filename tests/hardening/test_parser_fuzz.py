"""hypothesis over every channel's parser, after a valid signature (issue 16): random and
mutated platform payloads, each answered 2xx or 4xx, never a 5xx; the server keeps serving.

The server runs in this event loop; hypothesis drives it from a thread with a blocking
client, so each example is a real signed HTTP request.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from xml.sax.saxutils import escape

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channels.wechat_mp import WeChatMpSettings
from channels.wecom import WeComSettings
from tests.conftest import ServeApp
from tests.fakes.wechat_mp import FakeWeChatMpApi, WeChatMpCallbacks
from tests.fakes.wecom import FakeWeComApi, WeComCallbacks, cdata_xml
from tests.hardening.channels import JSON_CHANNELS, PLACEHOLDER, json_channel_settings

EXAMPLES = 60
NASTY = ["", "\x00", "\ud800", "\udfff", "\n", "a\r\nb", "%3A", ":", "/", "💥" * 50, "9" * 40, " "]

texts = st.one_of(st.text(max_size=40), st.sampled_from(NASTY))
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, payload: dict[str, Any]) -> Any:
    """A valid payload with some of its values replaced or removed, or any JSON at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)
    data = json.loads(json.dumps(payload))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return data


async def test_every_json_parser_answers_2xx_or_4xx(serve: ServeApp) -> None:
    async with json_channel_settings() as channel_settings, serve(channel_settings=channel_settings) as srv:
        seen: list[tuple[str, int]] = []

        def run() -> None:
            with httpx.Client(timeout=30) as http:
                for channel in JSON_CHANNELS:
                    fuzz_channel(http, channel)

        def fuzz_channel(http: httpx.Client, channel: Any) -> None:
            base_with_text = json.loads(json.dumps(channel.payload(1)).replace(PLACEHOLDER, "hello"))

            @settings(
                max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
            )
            @given(data=mutated(base_with_text))
            def check(data: Any) -> None:
                body = json.dumps(data).encode()
                resp = http.post(f"{srv.url}{channel.path}", content=body, headers=channel.headers(body))
                seen.append((channel.name, resp.status_code))
                assert resp.status_code < 500, (channel.name, data, resp.text)

            check()

        await asyncio.to_thread(run)
        assert {name for name, _ in seen} == {c.name for c in JSON_CHANNELS}
        assert all(status < 500 for _, status in seen)
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{srv.url}/healthz")).status_code == 200


# XML travels as UTF-8: a lone surrogate cannot be sent at all (NUL can, as bytes).
xml_texts = st.one_of(
    st.text(max_size=40), st.sampled_from([t for t in NASTY if "\ud800" not in t and "\udfff" not in t])
)
XML_FIELDS = ["ToUserName", "FromUserName", "CreateTime", "MsgType", "Content", "MsgId", "AgentID", "Event"]


@st.composite
def xml_messages(draw: st.DrawFn, valid: dict[str, Any]) -> str:
    """A message XML with some fields replaced, dropped or added, or any text at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(xml_texts)
    fields = dict(valid)
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(XML_FIELDS))
        if draw(st.booleans()) and name in fields:
            del fields[name]
        else:
            fields[name] = draw(st.one_of(xml_texts, st.integers(-(2**70), 2**70)))
    if draw(st.booleans()):
        return cdata_xml(fields)
    return "<xml>" + "".join(f"<{k}>{escape(str(v))}</{k}>" for k, v in fields.items()) + "</xml>"


async def test_wecom_and_wechat_mp_parsers_answer_2xx_or_4xx(serve: ServeApp) -> None:
    import base64

    wecom_key = base64.b64encode(bytes(range(32))).decode().rstrip("=")
    async with FakeWeComApi(corp_id="ww-corp") as wecom_api, FakeWeChatMpApi(app_id="wx-app") as mp_api:
        channel_settings = {
            "wecom": WeComSettings(
                _env_file=None,  # type: ignore[call-arg]
                corp_id="ww-corp",
                corp_secret=wecom_api.corp_secret,
                agent_id=1000002,
                token="wecom-token",
                encoding_aes_key=wecom_key,
                api_base_url=wecom_api.url,
            ),
            "wechat-mp": WeChatMpSettings(
                _env_file=None,  # type: ignore[call-arg]
                app_id="wx-app",
                app_secret=mp_api.app_secret,
                token="mp-token",
                api_base_url=mp_api.url,
            ),
        }
        wecom = WeComCallbacks("wecom-token", wecom_key, "ww-corp", 1000002)
        mp = WeChatMpCallbacks("mp-token", "wx-app")
        async with serve(channel_settings=channel_settings) as srv:
            seen: list[int] = []

            def run() -> None:
                with httpx.Client(timeout=30) as http:
                    valid = {
                        "ToUserName": "ww-corp",
                        "FromUserName": "alice",
                        "CreateTime": 1,
                        "MsgType": "text",
                        "Content": "hi",
                        "MsgId": 1,
                        "AgentID": 1000002,
                    }

                    @settings(
                        max_examples=EXAMPLES,
                        deadline=None,
                        database=None,
                        suppress_health_check=list(HealthCheck),
                    )
                    @given(xml=xml_messages(valid))
                    def check_wecom(xml: str) -> None:
                        cb = wecom.post(xml)
                        resp = http.post(
                            f"{srv.url}/channels/wecom",
                            params=cb.query,
                            content=cb.body,
                            headers={"Content-Type": "text/xml"},
                        )
                        seen.append(resp.status_code)
                        assert resp.status_code < 500, (xml, resp.text)

                    @settings(
                        max_examples=EXAMPLES,
                        deadline=None,
                        database=None,
                        suppress_health_check=list(HealthCheck),
                    )
                    @given(xml=xml_messages({**valid, "ToUserName": "gh_test_account"}))
                    def check_mp(xml: str) -> None:
                        cb = mp.plaintext(xml, openid="alice")
                        resp = http.post(
                            f"{srv.url}/channels/wechat-mp",
                            params=cb.query,
                            content=xml.encode("utf-8"),
                            headers={"Content-Type": "text/xml"},
                        )
                        seen.append(resp.status_code)
                        assert resp.status_code < 500, (xml, resp.text)

                    check_wecom()
                    check_mp()

            await asyncio.to_thread(run)
            assert len(seen) >= 2 * EXAMPLES // 2
            async with httpx.AsyncClient(timeout=30) as http:
                assert (await http.get(f"{srv.url}/healthz")).status_code == 200
