"""The guarded fetcher against real local servers: 20 SSRF URLs (and redirects to each)
reach nothing, a name is resolved once and the connection goes to the address judged,
credentials stay behind on a cross-origin redirect, a gzip bomb is stopped while decoding.

A "public" host needs the internet; instead a resolver (a constructor argument) maps
`public.example` to a documentation-free public address, and a network backend that
records each connection sends it to the local counting server. Everything the fetcher
decides, it decides on the addresses it was given; the backend only stands in for the
route to them, and records that no refused address was ever connected to.
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
from collections.abc import Iterable
from typing import Any

import httpcore
import pytest

from app.errors import ChannelRejected
from app.fetch import FetchError, FetchRefused, GuardedFetcher, TooLarge
from app.fetch.addresses import ambiguous_numeric_host, parse_ip, refusal
from app.signed_callback import post_signed
from tests.fakes.counting_server import BODY, CountingServer, gzip_bomb

PUBLIC = "93.184.215.14"  # a globally routed address: what public.example "resolves" to
OTHER = "93.184.215.15"


def ssrf_urls(port: int) -> list[str]:
    """Twenty ways to name an address a payload must not reach."""
    return [
        f"http://127.0.0.1:{port}/file",
        f"http://10.0.0.1:{port}/file",
        f"http://172.16.0.1:{port}/file",
        f"http://192.168.1.1:{port}/file",
        "http://169.254.169.254/latest/meta-data/",
        f"http://[::1]:{port}/file",
        f"http://[fe80::1]:{port}/file",
        f"http://[fc00::1]:{port}/file",
        f"http://[::ffff:127.0.0.1]:{port}/file",
        f"http://0.0.0.0:{port}/file",
        f"http://2130706433:{port}/file",
        f"http://0177.0.0.1:{port}/file",
        f"http://0x7f.1:{port}/file",
        f"http://127.1:{port}/file",
        f"http://localhost:{port}/file",
        f"http://[2002:7f00:1::]:{port}/file",  # 6to4 around 127.0.0.1
        f"http://[64:ff9b::7f00:1]:{port}/file",  # NAT64 around 127.0.0.1
        f"http://100.64.0.1:{port}/file",  # carrier-grade NAT
        f"http://224.0.0.1:{port}/file",  # multicast
        f"http://[::]:{port}/file",  # unspecified IPv6
    ]


class RoutedBackend(httpcore.AsyncNetworkBackend):
    """Every connection, to whatever address, goes to the counting server; each recorded."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connects: list[tuple[str, int]] = []
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self.connects.append((host, port))
        return await self._inner.connect_tcp("127.0.0.1", self.port, timeout, local_address, socket_options)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise AssertionError("no unix sockets")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class Names:
    """A resolver with fixed answers (a list per name: successive answers), counting lookups."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        answers = self.answers.get(host)
        if not answers:
            raise OSError(f"{host}: no such name")
        return answers.pop(0) if len(answers) > 1 else answers[0]


def routed(
    server: CountingServer, names: dict[str, list[list[str]]] | None = None
) -> tuple[GuardedFetcher, RoutedBackend, Names]:
    backend = RoutedBackend(server.port)
    known = {"public.example": [[PUBLIC]], "other.example": [[OTHER]], "localhost": [["127.0.0.1", "::1"]]}
    resolver = Names(names or known)
    return GuardedFetcher(resolver=resolver, network_backend=backend), backend, resolver


async def test_twenty_ssrf_urls_are_refused_and_nothing_is_connected_to() -> None:
    async with CountingServer() as server:
        fetcher, backend, _ = routed(server, {"localhost": [["127.0.0.1", "::1"]]})
        urls = ssrf_urls(server.port)
        assert len(urls) == 20
        for url in urls:
            with pytest.raises(FetchRefused):
                await fetcher.get(url, limit=1000)
    assert backend.connects == []
    assert server.hits == []


async def test_the_real_network_does_not_reach_the_loopback_forms_either() -> None:
    """The system resolver and network: every spelling that would land on the server fails."""
    async with CountingServer() as server:
        fetcher = GuardedFetcher()
        for url in ssrf_urls(server.port):
            with pytest.raises(FetchRefused):
                await fetcher.get(url, limit=1000)
        # The control: the same server is reachable when the operator names it.
        allowed = GuardedFetcher(allow_private_hosts=["127.0.0.2"])
        answer = await allowed.get(server.url("127.0.0.2"), limit=1000)
    assert answer.content == BODY
    assert [h for h, _, _ in server.hits] == [f"127.0.0.2:{server.port}"]


async def test_redirects_from_an_allowed_host_to_each_ssrf_url_are_refused() -> None:
    async with CountingServer() as server:
        fetcher = GuardedFetcher(allow_private_hosts=["127.0.0.2"])
        for target in ssrf_urls(server.port):
            with pytest.raises(FetchRefused):
                await fetcher.get(server.url("127.0.0.2", "/hop"), params={"to": target}, limit=1000)
        # The control: a redirect to the allowed host itself is followed.
        answer = await fetcher.get(
            server.url("127.0.0.2", "/hop"), params={"to": server.url("127.0.0.2")}, limit=1000
        )
    assert answer.content == BODY
    assert server.hits_on("127.0.0.2") == 22  # 20 refused redirects + the control's two hops
    assert len(server.hits) == 22  # not one on any other spelling


async def test_redirects_from_a_public_host_are_judged_per_hop_and_connected_only_to_it() -> None:
    async with CountingServer() as server:
        fetcher, backend, _ = routed(server)
        for target in ssrf_urls(server.port):
            with pytest.raises(FetchRefused):
                await fetcher.get(
                    f"http://public.example:{server.port}/hop", params={"to": target}, limit=1000
                )
        answer = await fetcher.get(f"http://public.example:{server.port}/file", limit=1000)
    assert answer.content == BODY
    assert backend.connects == [(PUBLIC, server.port)] * 21
    assert [h for h, _, _ in server.hits] == [f"public.example:{server.port}"] * 21


async def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_connected() -> None:
    """DNS rebinding: the second answer would be 127.0.0.1; it is never asked for."""
    async with CountingServer() as server:
        fetcher, backend, names = routed(server, {"rebind.example": [[PUBLIC], ["127.0.0.1"]]})
        answer = await fetcher.get(f"http://rebind.example:{server.port}/file", limit=1000)
    assert answer.content == BODY
    assert names.lookups == ["rebind.example"]
    assert backend.connects == [(PUBLIC, server.port)]
    assert server.hits[0][0] == f"rebind.example:{server.port}"  # the Host header keeps the name


async def test_a_name_with_one_private_address_among_public_ones_is_refused() -> None:
    async with CountingServer() as server:
        fetcher, backend, _ = routed(server, {"mixed.example": [[PUBLIC, "10.1.2.3"]]})
        with pytest.raises(FetchRefused, match=r"10\.1\.2\.3 is private"):
            await fetcher.get(f"http://mixed.example:{server.port}/file", limit=1000)
    assert backend.connects == []


async def test_credentials_are_dropped_when_a_redirect_changes_origin() -> None:
    async with CountingServer() as server:
        fetcher, _, _ = routed(server)
        same = f"http://public.example:{server.port}/file"
        other = f"http://other.example:{server.port}/file"
        auth = {"Authorization": "Bearer xoxb-secret"}
        await fetcher.get(
            f"http://public.example:{server.port}/hop", params={"to": same}, headers=auth, limit=100
        )
        await fetcher.get(
            f"http://public.example:{server.port}/hop", params={"to": other}, headers=auth, limit=100
        )
    assert [a for _, _, a in server.hits] == ["Bearer xoxb-secret"] * 3 + [None]


async def test_a_trusted_base_is_reachable_but_a_redirect_out_of_it_is_judged() -> None:
    """An operator-configured base URL (a platform API on 127.0.0.1 in tests) is trusted;
    its redirect to another place on the same host is not."""
    async with CountingServer() as server:
        fetcher = GuardedFetcher()
        base = server.url(path="/file/bot123")
        answer = await fetcher.get(base + "/photo.jpg", limit=100, trusted=[base])
        assert answer.content == BODY
        with pytest.raises(FetchRefused):
            await fetcher.get(
                base + "/x", params={"to": server.url(path="/admin")}, limit=100, trusted=[base]
            )
        with pytest.raises(FetchRefused):  # the prefix is a path, not a string prefix of the host
            await fetcher.get(server.url(path="/file/bot1234/x"), limit=100, trusted=[base])
    assert [p for _, p, _ in server.hits] == ["/file/bot123/photo.jpg", "/file/bot123/x"]


async def test_too_many_redirects_and_non_http_schemes_are_refused() -> None:
    async with CountingServer() as server:
        fetcher = GuardedFetcher(allow_private_hosts=["127.0.0.2"], max_redirects=2)
        loop = server.url("127.0.0.2", "/loop")
        url = loop
        for _ in range(3):
            url = f"{loop}?to={url}"
        with pytest.raises(FetchRefused, match="redirects"):
            await fetcher.get(url, limit=100)
        for bad in ("file:///etc/passwd", "ftp://127.0.0.2/x", "gopher://127.0.0.2:70/_x", "http:///x"):
            with pytest.raises(FetchRefused):
                await fetcher.get(bad, limit=100)
    assert len(server.hits) == 3


async def test_a_gzip_body_is_decoded_and_a_declared_length_over_the_limit_is_not_read() -> None:
    async with CountingServer() as server:
        fetcher = GuardedFetcher(allow_private_hosts=["127.0.0.1"])
        server.bomb = gzip.compress(b"hello " * 1000)
        answer = await fetcher.get(server.url(path="/bomb"), limit=6000)
        assert answer.content == b"hello " * 1000
        with pytest.raises(TooLarge):
            await fetcher.get(server.url(path="/bomb"), limit=5999)
        with pytest.raises(TooLarge):
            await fetcher.get(server.url(), limit=len(BODY) - 1)  # Content-Length says so


async def test_a_body_that_does_not_decode_is_an_error() -> None:
    async with CountingServer() as server:
        server.bomb = b"not gzip at all"
        with pytest.raises(FetchError, match="does not decode"):
            await GuardedFetcher(allow_private_hosts=["127.0.0.1"]).get(server.url(path="/bomb"), limit=100)


BOMB_DECODED = 200 * 1024 * 1024
LIMIT = 10_000_000
# Stated bound: a refused bomb costs at most the limit's buffer plus a few 64 KiB steps;
# 16 MiB of traced allocations per fetch (measured: 10.3 MiB for one, 40.6 MiB for four at
# once; before the guard one cost +127 MiB of RSS, four +385 MiB).
BOUND_PER_FETCH = 16 * 1024 * 1024


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return gzip_bomb(BOMB_DECODED)


async def test_a_gzip_bomb_is_stopped_while_decoding_with_bounded_memory(bomb: bytes) -> None:
    assert len(bomb) < 300_000  # ~200 KB on the wire
    async with CountingServer() as server:
        server.bomb = bomb
        fetcher = GuardedFetcher(allow_private_hosts=["127.0.0.1"])
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            base, _ = tracemalloc.get_traced_memory()
            with pytest.raises(TooLarge):
                await fetcher.get(server.url(path="/bomb"), limit=LIMIT)
            _, one_peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            results = await asyncio.gather(
                *(fetcher.get(server.url(path="/bomb"), limit=LIMIT) for _ in range(4)),
                return_exceptions=True,
            )
            _, four_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert all(isinstance(r, TooLarge) for r in results)
    assert one_peak - base < BOUND_PER_FETCH, (one_peak - base) / 2**20
    assert four_peak - base < 4 * BOUND_PER_FETCH, (four_peak - base) / 2**20


async def test_a_push_style_post_is_refused_to_private_addresses_unless_allowed() -> None:
    async with CountingServer() as server:
        fetcher = GuardedFetcher()
        with pytest.raises(FetchRefused):
            await fetcher.post(server.url(path="/push"), content=b"{}")
        with pytest.raises(FetchRefused):
            await fetcher.check(server.url(path="/push"))
        answer = await fetcher.post(server.url(path="/push"), content=b"{}", allow_private=True)
    assert answer.status_code == 200
    assert [p for _, p, _ in server.hits] == ["/push"]


REFUSED = (
    "127.0.0.1 10.9.8.7 172.31.255.255 192.168.0.1 169.254.169.254 100.100.100.200 0.0.0.0 224.0.0.251 "
    "240.0.0.1 255.255.255.255 198.18.0.1 ::1 :: fe80::1 fc00::1 fd12::1 fec0::1 ff02::1 ::ffff:10.0.0.1 "
    "::ffff:169.254.169.254 2002:a00:1:: 64:ff9b::a9fe:a9fe 64:ff9b:1::1 2001::1 2001:db8::1 ::a00:1"
).split()


@pytest.mark.parametrize("address", REFUSED)
def test_addresses_a_payload_may_not_reach(address: str) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert refusal(ip) is not None


@pytest.mark.parametrize(
    "address", ["93.184.215.14", "8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "2a00:1450::1"]
)
def test_public_addresses_are_fine(address: str) -> None:
    ip = parse_ip(address)
    assert ip is not None
    assert refusal(ip) is None


@pytest.mark.parametrize(
    "host", ["2130706433", "0177.0.0.1", "0x7f.1", "127.1", "0x7f000001", "017700000001"]
)
def test_numeric_hosts_in_other_spellings_are_ambiguous(host: str) -> None:
    assert ambiguous_numeric_host(host)
    assert not ambiguous_numeric_host("127.0.0.1") and not ambiguous_numeric_host("cafe.example")


async def test_a_signed_callback_to_a_refused_url_is_rejected_not_retried() -> None:
    """An A2A push URL that resolves somewhere private at send time: the outbox row fails
    without retries (ChannelRejected), and the receiver gets nothing."""
    async with CountingServer() as server:
        with pytest.raises(ChannelRejected, match="refused"):
            await post_signed(
                GuardedFetcher(), server.url(path="/hook"), b"{}", secret="s", what="push receiver"
            )
        answer = await post_signed(
            GuardedFetcher(), server.url(path="/hook"), b"{}", secret="s", allow_private=True
        )
    assert answer.status_code == 200
    assert [p for _, p, _ in server.hits] == ["/hook"]
