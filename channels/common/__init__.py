"""Code shared by platform adapters of one family (never a channel of its own).

`wechat_crypto`, `wechat_xml` and `wechat_api` hold what WeCom (企业微信) and the WeChat
Official Account (公众号) have in common: the WXBizMsgCrypt callback encryption, the
callback XML format and the access-token based HTTP API.
"""
