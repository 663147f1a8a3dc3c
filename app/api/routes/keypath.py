"""The `{key:key}` path convertor of admin routes: a session key, `/` and all.

`app.api.limits.UrlGuard` leaves `%2F` and `%25` encoded in admin paths, so a key with a
`/` in it does not reach a route meant for a shorter key; this convertor decodes them.
"""

from __future__ import annotations

from urllib.parse import unquote

from starlette.convertors import Convertor, register_url_convertor


class SessionKeyConvertor(Convertor[str]):
    regex = ".+"

    def convert(self, value: str) -> str:
        return unquote(value)

    def to_string(self, value: str) -> str:
        return value.replace("%", "%25").replace("/", "%2F")


register_url_convertor("key", SessionKeyConvertor())
