"""Gateway tokens: scope, signature and expiry, checked from the published format."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from app.config import GatewayTokenSpec
from app.gateway.tokens import GatewayGrant, TokenExpired, TokenInvalid, TokenVerifier, issue_token

SECRET = "s" * 32


def sign_by_hand(claims: dict[str, object], secret: str = SECRET) -> str:
    """`cg1.<b64url(claims)>.<b64url(HMAC-SHA256(secret, "cg1.<claims part>"))>` (docs/gateway.md)."""
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    mac = hmac.new(secret.encode(), f"cg1.{body}".encode(), hashlib.sha256).digest()
    return f"cg1.{body}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def test_scope_is_exact_keys_or_the_prefix() -> None:
    grant = GatewayGrant("alice", ("web:alice",), "web:alice:")
    assert grant.allows("web:alice") and grant.allows("web:alice:work")
    assert not grant.allows("web:alicex") and not grant.allows("web:bob") and not grant.allows("web:ali")
    assert GatewayGrant("ops", (), "").allows("anything")
    assert not GatewayGrant("nobody").allows("web:alice")
    assert grant.default_key == "web:alice"


def test_static_tokens() -> None:
    verifier = TokenVerifier([GatewayTokenSpec(token="t" * 20, subject="alice", session_keys=["k"])], None)
    assert verifier.verify("t" * 20) == GatewayGrant("alice", ("k",), None)
    for bad in ("t" * 19, "t" * 21, "", "cg1.x.y"):
        with pytest.raises(TokenInvalid):
            verifier.verify(bad)


def test_signed_tokens_verify_by_the_published_rule() -> None:
    verifier = TokenVerifier([], SECRET)
    token = sign_by_hand({"sub": "carol", "keys": ["web:carol"], "prefix": None, "exp": 2_000, "iat": 1_000})
    grant = verifier.verify(token, now=1_500)
    assert grant.subject == "carol" and grant.session_keys == ("web:carol",) and grant.expires_at == 2_000
    with pytest.raises(TokenExpired):
        verifier.verify(token, now=2_000)
    # Our issuer produces tokens the rule accepts, and the rule rejects other secrets.
    issued, _ = issue_token(SECRET, subject="dave", key_prefix="web:dave:", ttl_seconds=60, now=1_000)
    assert verifier.verify(issued, now=1_030).key_prefix == "web:dave:"
    with pytest.raises(TokenInvalid):
        TokenVerifier([], "other-secret").verify(issued, now=1_030)
    with pytest.raises(TokenInvalid):  # signed tokens are off without a secret
        TokenVerifier([], None).verify(issued, now=1_030)


def test_an_issued_token_lives_at_least_its_ttl() -> None:
    # Issued late in a second, a one-second token must not expire within that same second.
    verifier = TokenVerifier([], SECRET)
    token, grant = issue_token(SECRET, subject="erin", session_keys=["web:erin"], ttl_seconds=1, now=1_000.99)
    assert grant.expires_at is not None and grant.expires_at >= 1_001.99
    assert verifier.verify(token, now=1_001.9).subject == "erin"
    with pytest.raises(TokenExpired):
        verifier.verify(token, now=1_002.0)


def test_forged_and_malformed_signed_tokens() -> None:
    verifier = TokenVerifier([], SECRET)
    good = sign_by_hand({"sub": "carol", "keys": ["web:carol"], "exp": 2_000})
    head, _body, sig = good.split(".")
    widened = sign_by_hand({"sub": "carol", "keys": [], "prefix": "", "exp": 2_000}).split(".")[1]
    for bad in (
        f"{head}.{widened}.{sig}",  # claims changed, signature kept
        good + "x",
        "cg1.only-two",
        sign_by_hand({"sub": "carol"}),  # no expiry
        sign_by_hand({"sub": 7, "exp": 2_000}),
        sign_by_hand({"sub": "x", "keys": [1], "exp": 2_000}),
        "cg1.!!!.!!!",
    ):
        with pytest.raises(TokenInvalid):
            verifier.verify(bad, now=1_000)
