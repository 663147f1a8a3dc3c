"""Which addresses a URL a payload or a model controls may reach, and why not.

Everything that is not a plain, globally routed unicast address is refused: loopback,
private (RFC 1918, unique-local), link-local (and the cloud metadata address
169.254.169.254 with it), multicast, unspecified, shared (100.64/10), reserved and
documentation ranges, site-local IPv6. IPv6 forms that carry an IPv4 address (mapped
`::ffff:a.b.c.d`, compatible `::a.b.c.d`, 6to4 `2002::/16`, NAT64 `64:ff9b::/96`,
Teredo) are judged by the IPv4 address inside as well, since a dual-stack host or a
relay delivers them there.

Numeric host spellings that are not canonical dotted quads (`2130706433`, `0177.0.0.1`,
`0x7f.1`, `127.1`) are refused before any resolution: resolvers and URL parsers disagree
on what they mean, which is exactly what filters get bypassed with.
"""

from __future__ import annotations

import ipaddress
import re
import socket

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215 local-use translation
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible IPv6
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")  # carrier-grade NAT
_NUMERIC = re.compile(r"^[0-9a-fx.]+$", re.IGNORECASE)


def parse_ip(text: str) -> IPAddress | None:
    """`text` as an IP address (IPv6 brackets and a `%zone` allowed), else None."""
    text = text.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def ambiguous_numeric_host(host: str) -> bool:
    """Whether `host` is an IPv4 address spelled other than as a canonical dotted quad."""
    if not _NUMERIC.match(host) or parse_ip(host) is not None:
        return False
    try:
        socket.inet_aton(host)  # the C library's lenient reading: decimal, octal, hex, short forms
    except OSError:
        return False
    return True


def refusal(ip: IPAddress) -> str | None:
    """Why `ip` may not be fetched from, or None when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            inner = refusal(embedded)
            if inner is not None:
                return f"{inner} (inside {ip})"
        if ip in _NAT64_LOCAL or ip.is_site_local:
            return f"{ip} is a local IPv6 address"
    reason = _kind(ip)
    return f"{ip} is {reason}" if reason else None


def _kind(ip: IPAddress) -> str | None:
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if isinstance(ip, ipaddress.IPv4Address) and ip in _SHARED:
        return "shared (carrier-grade NAT)"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not globally routed"
    return None


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]  # the client's address; the server's is public by definition
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None
