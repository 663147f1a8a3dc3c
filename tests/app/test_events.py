"""Session keys: one key per event, and distinct tuples never collide."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.events import InboundEvent, SessionScope, TextPart, build_session_key

ids = st.text(min_size=1, max_size=12, alphabet=st.characters(codec="utf-8"))
tuples = st.tuples(ids, ids, st.sampled_from(list(SessionScope)), st.none() | ids, ids)


def _key(t: tuple[str, str, SessionScope, str | None, str]) -> str:
    channel, chat, scope, thread, sender = t
    return build_session_key(channel, chat, scope, thread_id=thread, sender_id=sender)


def _identity(t: tuple[str, str, SessionScope, str | None, str]) -> tuple[object, ...]:
    """What a key is supposed to distinguish under its scope."""
    channel, chat, scope, thread, sender = t
    if scope is SessionScope.THREAD and thread:
        return ("thread", channel, chat, thread)
    if scope is SessionScope.USER_IN_CHAT:
        return ("user", channel, chat, sender)
    return ("chat", channel, chat)


@given(tuples, tuples)
def test_distinct_tuples_never_share_a_key(a, b) -> None:
    if _identity(a) != _identity(b):
        assert _key(a) != _key(b)
    else:
        assert _key(a) == _key(b)


@given(ids, ids, ids)
def test_separators_inside_components_are_escaped(channel, chat, sender) -> None:
    key = build_session_key(channel, chat, SessionScope.USER_IN_CHAT, sender_id=sender)
    assert key.count(":") == 3  # channel:chat:user:sender, whatever the ids contain


def test_scopes() -> None:
    base = dict(channel="slack", chat_id="C1", sender_id="U1", parts=(TextPart(text="hi"),))
    assert InboundEvent(**base).session_key == "slack:C1"
    assert InboundEvent(**base, thread_id="17.5", session_scope=SessionScope.THREAD).session_key == (
        "slack:C1:17.5"
    )
    assert InboundEvent(**base, session_scope=SessionScope.THREAD).session_key == "slack:C1"  # no thread
    assert InboundEvent(**base, session_scope=SessionScope.USER_IN_CHAT).session_key == "slack:C1:user:U1"
    assert InboundEvent(**base, session_key_override="shared").session_key == "shared"
    assert InboundEvent(**base, source_session_key="telegram:42").session_key == "telegram:42"


def test_event_round_trips_through_json() -> None:
    event = InboundEvent(
        channel="webhook", chat_id="c", sender_id="u", parts=(TextPart(text="x"),), metadata={"a": 1}
    )
    again = InboundEvent.model_validate(event.model_dump(mode="json"))
    assert again == event
    assert again.session_key == event.session_key
