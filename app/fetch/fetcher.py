"""One guarded fetcher for every URL a payload or a model controls.

A OneBot segment's `url`, a QQ attachment's, an A2A caller's push URL: whoever sent
the payload chose where chatgate connects. `GuardedFetcher` is the only way such a URL
is fetched:

- the host is resolved once per hop and every address it has is judged
  (`app.fetch.addresses`); one refused address refuses the hop, so a name cannot
  mix a public and a private record;
- the connection goes to an address that was judged, never to a second resolution
  (a name that answers "public" to the check and "127.0.0.1" to the connect, DNS
  rebinding, gets nowhere): the network backend below connects to the pinned address,
  while TLS (SNI, certificate) and the Host header keep the name;
- redirects are followed here, at most `max_redirects`, each hop judged the same way,
  and credentials (`Authorization`, `Cookie`) are dropped when the origin changes;
- decoded bytes are counted while decoding and the fetch stops as soon as they pass the
  caller's limit (`app.fetch.decode`); raw bytes on the wire are capped as well;
- no proxy from the environment is used (the check must be about where we connect).

Two exceptions, both the operator's: hosts named in `MEDIA_ALLOW_PRIVATE_HOSTS` (a name,
an address, or a network such as `192.168.1.0/24`; e.g. a OneBot bridge serving files
on the LAN), and `trusted` URL prefixes a caller passes for URLs under a base URL the
operator configured (a platform's API or file base, which in tests is a fake on
127.0.0.1). A redirect away from a trusted prefix is judged like any other hop.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpcore
import httpx

from app.fetch.addresses import ambiguous_numeric_host, parse_ip, refusal
from app.fetch.decode import BoundedDecoder, TooLarge, UnsupportedEncoding

Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECTS = {301, 302, 303, 307, 308}
_CREDENTIALS = ("authorization", "cookie", "proxy-authorization")


class FetchError(httpx.HTTPError):
    """The fetch failed: unreachable, a non-2xx answer, a body that cannot be decoded."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class FetchRefused(FetchError):
    """The URL (or a redirect) leads somewhere a payload may not send us."""


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    status_code: int
    headers: httpx.Headers
    content: bytes

    @property
    def content_type(self) -> str | None:
        value = self.headers.get("content-type")
        return value.split(";")[0].strip() if value else None

    def as_response(self, method: str = "GET") -> httpx.Response:
        """The answer as an `httpx.Response` (for code that reads status, headers, text)."""
        request = httpx.Request(method, self.url)
        return httpx.Response(self.status_code, headers=self.headers, content=self.content, request=request)


async def system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=0, proto=0)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class GuardedFetcher:
    def __init__(
        self,
        *,
        allow_private_hosts: Iterable[str] = (),
        resolver: Resolver | None = None,
        network_backend: httpcore.AsyncNetworkBackend | None = None,
        max_redirects: int = 5,
        connect_timeout: float = 10.0,
        read_timeout: float = 30.0,
        total_timeout: float = 120.0,
    ) -> None:
        """`resolver(host, port)` answers the host's addresses (the system's by default);
        `network_backend` is httpcore's (tests put a recording one in front of it)."""
        self._names: set[str] = set()
        self._addresses: list[Any] = []  # ipaddress networks
        for entry in allow_private_hosts:
            _add_allowed(entry, self._names, self._addresses)
        self._resolve = resolver or system_resolver
        self._backend = network_backend or httpcore.AnyIOBackend()
        self.max_redirects = max_redirects
        self._timeouts = {
            "connect": connect_timeout,
            "read": read_timeout,
            "write": read_timeout,
            "pool": 5.0,
        }
        self.total_timeout = total_timeout
        self._ssl: ssl.SSLContext | None = None

    # --- the public calls ---------------------------------------------------------------

    async def get(
        self,
        url: str,
        *,
        limit: int,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        trusted: Sequence[str] = (),
    ) -> Fetched:
        """GET `url` following redirects; the body, at most `limit` bytes once decoded.

        Raises `FetchRefused` (an address a payload may not reach), `TooLarge`, or
        `FetchError` (unreachable, a non-2xx answer, a body that does not decode).
        """
        target = httpx.URL(url, params=params) if params else _parse(url)
        answer = await self._exchange("GET", target, headers, None, limit, trusted, follow=True)
        if not 200 <= answer.status_code < 300:
            raise FetchError(f"{_safe(answer.url)} answered {answer.status_code}", answer.status_code)
        return answer

    async def post(
        self,
        url: str,
        *,
        content: bytes,
        headers: Mapping[str, str] | None = None,
        limit: int = 64 * 1024,
        trusted: Sequence[str] = (),
        allow_private: bool = False,
    ) -> Fetched:
        """POST `content` to `url`; the answer whatever its status (redirects are not
        followed: a POST is not repeated elsewhere). `allow_private`: the operator allowed
        private addresses for this kind of call (e.g. `A2A_PUSH_ALLOW_PRIVATE_URLS`)."""
        everywhere = [url] if allow_private else []
        return await self._exchange("POST", _parse(url), headers, content, limit, [*trusted, *everywhere])

    async def check(self, url: str) -> None:
        """Raise `FetchRefused` now if `url` leads somewhere it may not (early validation of
        a URL kept for later, e.g. a push config; the fetch checks again)."""
        await self._admit(_parse(url), ())

    # --- one exchange, hop by hop ---------------------------------------------------------

    async def _exchange(
        self,
        method: str,
        url: httpx.URL,
        headers: Mapping[str, str] | None,
        content: bytes | None,
        limit: int,
        trusted: Sequence[str],
        *,
        follow: bool = False,
    ) -> Fetched:
        sent = httpx.Headers(headers)
        sent["accept-encoding"] = "gzip, deflate"
        first_origin = _origin(url)
        try:
            async with asyncio.timeout(self.total_timeout):
                for _hop in range(self.max_redirects + 1):
                    answer = await self._hop(method, url, sent, content, limit, trusted)
                    location = answer.headers.get("location")
                    if not (follow and answer.status_code in _REDIRECTS and location):
                        return answer
                    try:
                        url = url.join(location)
                    except httpx.InvalidURL as exc:
                        raise FetchRefused(f"redirect to an invalid URL: {exc}") from exc
                    if _origin(url) != first_origin:
                        for name in _CREDENTIALS:
                            sent.pop(name, None)
                    if answer.status_code == 303:
                        method, content = "GET", None
        except TimeoutError as exc:
            raise FetchError(f"{_safe(url)}: no answer within {self.total_timeout:g} s") from exc
        raise FetchRefused(f"more than {self.max_redirects} redirects")

    async def _hop(
        self,
        method: str,
        url: httpx.URL,
        headers: httpx.Headers,
        content: bytes | None,
        limit: int,
        trusted: Sequence[str],
    ) -> Fetched:
        pinned = await self._admit(url, trusted)
        host, port = url.raw_host.decode("ascii"), _port(url)
        backend = _PinnedBackend(self._backend, {(host, port): pinned})
        request_headers = [("Host", url.netloc.decode("ascii").rpartition("@")[2]), *headers.multi_items()]
        core_url = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path)
        extensions = {"timeout": self._timeouts}
        try:
            async with httpcore.AsyncConnectionPool(
                ssl_context=self._ssl_context(), network_backend=backend, max_connections=1
            ) as pool:
                async with pool.stream(
                    method, core_url, headers=request_headers, content=content, extensions=extensions
                ) as response:
                    answer_headers = httpx.Headers(response.headers)
                    if response.status in _REDIRECTS and answer_headers.get("location"):
                        body = b""  # not read: we are going elsewhere
                    else:
                        body = await _read(response, answer_headers, limit)
        except httpcore.TimeoutException as exc:
            raise FetchError(f"{_safe(url)}: timed out ({type(exc).__name__})") from exc
        except httpcore.ConnectError as exc:
            raise FetchError(f"{_safe(url)}: cannot connect ({exc})") from exc
        except (httpcore.ProtocolError, httpcore.NetworkError) as exc:
            raise FetchError(f"{_safe(url)}: {type(exc).__name__} {exc}") from exc
        return Fetched(str(url), response.status, answer_headers, body)

    async def _admit(self, url: httpx.URL, trusted: Sequence[str]) -> list[str]:
        """The addresses `url`'s host may be reached at, all judged; `FetchRefused` else."""
        if url.scheme not in ("http", "https") or not url.host:
            raise FetchRefused(f"only http(s) URLs with a host are fetched, not {_safe(url)}")
        host = url.host.lower().rstrip(".")
        if ambiguous_numeric_host(host):
            raise FetchRefused(f"{host} is an IPv4 address in an ambiguous spelling")
        literal = parse_ip(host)
        if literal is not None:
            addresses = [str(literal)]
        else:
            try:
                addresses = await self._resolve(url.raw_host.decode("ascii"), _port(url))
            except OSError as exc:
                raise FetchError(f"{host} does not resolve: {exc}") from exc
        if not addresses:
            raise FetchError(f"{host} does not resolve")
        if host in self._names or any(_under(url, prefix) for prefix in trusted):
            return addresses
        for text in addresses:
            ip = parse_ip(text)
            if ip is None:
                raise FetchRefused(f"{host} resolved to {text!r}, not an address")
            if any(ip in net for net in self._addresses if net.version == ip.version):
                continue
            why = refusal(ip)
            if why is not None:
                raise FetchRefused(f"{host}: {why} (MEDIA_ALLOW_PRIVATE_HOSTS names the exceptions)")
        return addresses

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:  # built once: loading the CA bundle is not free
            self._ssl = httpx.create_ssl_context()
        return self._ssl


class _PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects `(host, port)` only to the addresses judged for it, in order."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend, pins: dict[tuple[str, int], list[str]]) -> None:
        self._inner = inner
        self._pins = pins

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        addresses = self._pins.get((host, port))
        if not addresses:
            raise httpcore.ConnectError(f"{host}:{port} was not checked")
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("no unix sockets here")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


async def _read(response: httpcore.Response, headers: httpx.Headers, limit: int) -> bytes:
    """The decoded body, `TooLarge` as soon as more than `limit` bytes come out of the
    decoder or more than the raw cap come off the wire."""
    raw_limit = limit + limit // 2 + 64 * 1024  # compressed bodies are smaller; this bounds junk
    declared = headers.get("content-length", "")
    encoded = headers.get("content-encoding", "identity").lower() not in ("identity", "")
    if declared.isdigit() and int(declared) > (raw_limit if encoded else limit):
        raise TooLarge(limit)
    try:
        decoder = BoundedDecoder(headers.get("content-encoding"), limit)
    except UnsupportedEncoding as exc:
        raise FetchError(str(exc)) from exc
    body = bytearray()
    raw = 0
    try:
        async for chunk in response.aiter_stream():
            raw += len(chunk)
            if raw > raw_limit:
                raise TooLarge(limit)
            for piece in decoder.feed(chunk):
                body += piece
        for piece in decoder.flush():
            body += piece
    except zlib.error as exc:
        raise FetchError(f"the body does not decode: {exc}") from exc
    return bytes(body)


def _add_allowed(entry: str, names: set[str], networks: list[Any]) -> None:
    entry = entry.strip().lower().rstrip(".").strip("[]")
    if not entry:
        return
    try:
        networks.append(ipaddress.ip_network(entry, strict=False))
    except ValueError:
        names.add(entry)


def _parse(url: str) -> httpx.URL:
    try:
        return httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise FetchRefused(f"not a URL we fetch: {exc}") from exc


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _origin(url: httpx.URL) -> tuple[str, str, int]:
    return url.scheme, url.host.lower(), _port(url)


def _under(url: httpx.URL, prefix: str) -> bool:
    """Whether `url` is on `prefix`'s origin and under its path (a configured base URL)."""
    try:
        base = httpx.URL(prefix)
    except httpx.InvalidURL:
        return False
    if _origin(url) != _origin(base):
        return False
    root = base.path.rstrip("/")
    return not root or url.path == root or url.path.startswith(root + "/")


def _safe(url: httpx.URL | str) -> str:
    """The URL for a message: no query (tokens live there) and no user info."""
    parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
    port = f":{parsed.port}" if parsed.port else ""
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host
    return f"{parsed.scheme}://{host}{port}{parsed.path}"
