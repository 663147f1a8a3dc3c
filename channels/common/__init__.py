"""Code shared by platform adapters (never a channel of its own).

`chunks` splits long replies within a platform's limit and delivers the chunks once
each across outbox retries (Slack, Telegram, WeCom, Official Account).

`wechat_crypto`, `wechat_xml`, `wechat_callback` and `wechat_api` hold what WeCom
(企业微信) and the WeChat Official Account (公众号) have in common: the WXBizMsgCrypt
callback encryption, the callback XML format and its checks, and the access-token based
HTTP API.
"""
