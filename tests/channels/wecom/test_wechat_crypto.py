"""The shared WXBizMsgCrypt against the platforms' published samples and the test's own
implementation of the rule (tests/fakes/wecom.py)."""

from __future__ import annotations

import base64

import pytest

from channels.common.wechat_crypto import (
    DecryptError,
    ReceiveIdMismatch,
    SignatureMismatch,
    WeChatCrypto,
    decode_aes_key,
    sha1_signature,
)
from channels.common.wechat_xml import MalformedXml, UnsafeXml, parse_flat_xml
from tests.fakes.wecom import WeChatPlatformCrypto, platform_signature

# The sample of WeCom's 加解密方案说明 / Sample.py (URL verification).
SAMPLE_TOKEN = "QDG6eK"
SAMPLE_KEY = "jWmYm7qr5nMoAUwZRjGtBxmz3KA1tkAj3ykkR6q2B2C"
SAMPLE_CORP_ID = "wx5823bf96d3bd56c7"
SAMPLE_TIMESTAMP = "1409659589"
SAMPLE_NONCE = "263014780"
SAMPLE_ECHOSTR = "P9nAzCzyDtyTWESHep1vC5X9xho/qYX3Zpb4yKa9SKld1DsH3Iyt3tP3zNdtp+4RPcs8TgAE7OaBO+FZXvnaqQ=="
SAMPLE_SIGNATURE = "5c45ff5e21c57e6ad56bac8758b79b1d9ac89fd3"
SAMPLE_ECHO_PLAIN = "1616140317555161061"

KEY = base64.b64encode(bytes(range(32, 64))).decode().rstrip("=")


def test_wecom_sample_url_verification_known_answer() -> None:
    assert (
        platform_signature(SAMPLE_TOKEN, SAMPLE_TIMESTAMP, SAMPLE_NONCE, SAMPLE_ECHOSTR) == SAMPLE_SIGNATURE
    )
    assert WeChatPlatformCrypto(SAMPLE_TOKEN, SAMPLE_KEY, SAMPLE_CORP_ID).open(SAMPLE_ECHOSTR) == (
        SAMPLE_ECHO_PLAIN,
        SAMPLE_CORP_ID,
    )
    crypto = WeChatCrypto(SAMPLE_TOKEN, SAMPLE_KEY, SAMPLE_CORP_ID)
    assert crypto.verify_and_decrypt(SAMPLE_SIGNATURE, SAMPLE_TIMESTAMP, SAMPLE_NONCE, SAMPLE_ECHOSTR) == (
        SAMPLE_ECHO_PLAIN
    )
    with pytest.raises(SignatureMismatch):
        crypto.verify_and_decrypt("0" * 40, SAMPLE_TIMESTAMP, SAMPLE_NONCE, SAMPLE_ECHOSTR)
    with pytest.raises(ReceiveIdMismatch):
        WeChatCrypto(SAMPLE_TOKEN, SAMPLE_KEY, "ww-someone-else").decrypt(SAMPLE_ECHOSTR)


def test_official_account_plaintext_signature_known_answer() -> None:
    # 公众号 消息加解密说明, 明文模式: Token "AAAAA".
    assert sha1_signature("AAAAA", "1714037059", "486452656") == "899cf89e464efb63f54ddac96b0a0a235f53aa78"


@pytest.mark.parametrize("message", ["", "hi", "<xml><Content><![CDATA[你好]]></Content></xml>", "x" * 1000])
def test_both_implementations_read_each_other(message: str) -> None:
    ours = WeChatCrypto("tok", KEY, "ww-corp")
    theirs = WeChatPlatformCrypto("tok", KEY, "ww-corp")
    sealed = ours.encrypt(message)
    assert len(base64.b64decode(sealed)) % 32 == 0  # PKCS#7 to 32-byte blocks
    assert theirs.open(sealed) == (message, "ww-corp")
    assert ours.decrypt(theirs.seal(message)) == message


def test_passive_reply_is_signed_by_the_published_rule() -> None:
    from channels.common.wechat_xml import parse_flat_xml

    reply = parse_flat_xml(WeChatCrypto("tok", KEY, "wx-app").encrypted_reply("<xml/>", "1700000000", "n1"))
    assert reply["MsgSignature"] == platform_signature("tok", "1700000000", "n1", reply["Encrypt"])
    assert WeChatPlatformCrypto("tok", KEY, "wx-app").open(reply["Encrypt"]) == ("<xml/>", "wx-app")


def test_wrong_key_fails_and_a_rotated_key_is_still_accepted() -> None:
    old_key = base64.b64encode(bytes(range(100, 132))).decode().rstrip("=")
    sealed_with_old = WeChatPlatformCrypto("tok", old_key, "wx-app").seal("hello")
    with pytest.raises(DecryptError):
        WeChatCrypto("tok", KEY, "wx-app").decrypt(sealed_with_old)
    rotated = WeChatCrypto("tok", KEY, "wx-app", previous_aes_keys=[old_key])
    assert rotated.decrypt(sealed_with_old) == "hello"


@pytest.mark.parametrize("key", ["", "short", KEY + "A", KEY[:-1] + "!"])
def test_malformed_encoding_aes_key_is_refused(key: str) -> None:
    with pytest.raises(ValueError):
        decode_aes_key(key)


def test_xml_parser_refuses_declarations_and_reads_cdata() -> None:
    assert parse_flat_xml("<xml><A><![CDATA[a <b> & c]]></A><N>1</N></xml>") == {"A": "a <b> & c", "N": "1"}
    with pytest.raises(UnsafeXml):
        parse_flat_xml('<!DOCTYPE xml [<!ENTITY e SYSTEM "file:///etc/passwd">]><xml><A>&e;</A></xml>')
    utf16 = '<?xml version="1.0" encoding="UTF-16"?><!DOCTYPE xml><xml/>'.encode("utf-16")
    with pytest.raises(UnsafeXml):
        parse_flat_xml(utf16)  # hidden from the byte scan, caught by the parser
    for bad in ("<xml><A></xml>", "<root/>", "", "<xml>&undefined;</xml>"):
        with pytest.raises(MalformedXml):
            parse_flat_xml(bad)
    with pytest.raises(MalformedXml):
        parse_flat_xml("<xml>" + "x" * 300_000 + "</xml>")
