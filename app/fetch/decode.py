"""Content decoding that counts what it produces, so a small body cannot expand unchecked.

httpx decodes a whole network chunk at once: a 64 KiB gzip chunk of zeros becomes 64 MB
before any caller can count it. Here zlib is asked for at most `STEP` bytes at a time
(`max_length`, the rest stays in `unconsumed_tail`), and `TooLarge` is raised as soon as
the decoded total passes the limit, so memory stays near the limit however the body was
compressed. Only `gzip`, `deflate` and `identity` are accepted (the fetcher asks for no
others); any other coding, or several stacked, is an error rather than bytes we cannot
bound.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

STEP = 64 * 1024


class TooLarge(Exception):
    """More than `limit` bytes (decoded, or raw on the wire)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


class UnsupportedEncoding(Exception):
    pass


class BoundedDecoder:
    """Feed raw chunks, get decoded pieces; `TooLarge` once more than `limit` came out."""

    def __init__(self, content_encoding: str | None, limit: int) -> None:
        coding = (content_encoding or "identity").strip().lower()
        if coding not in ("identity", "gzip", "x-gzip", "deflate", ""):
            raise UnsupportedEncoding(f"content-encoding {content_encoding!r} is not accepted")
        self.limit = limit
        self.total = 0
        self._gzip = coding in ("gzip", "x-gzip")
        self._deflate = coding == "deflate"
        self._inflater = self._new() if self._gzip or self._deflate else None
        self._first = True  # deflate: zlib-wrapped, or raw when the first bytes say so

    def _new(self, raw: bool = False) -> zlib._Decompress:
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else (16 if self._gzip else 0) + zlib.MAX_WBITS)

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        if self._inflater is None:
            yield self._count(chunk)
            return
        yield from self._inflate(chunk)

    def flush(self) -> Iterator[bytes]:
        if self._inflater is not None:
            yield from self._inflate(b"")
            rest = self._inflater.flush()
            if rest:
                yield self._count(rest)

    def _inflate(self, data: bytes) -> Iterator[bytes]:
        assert self._inflater is not None
        while True:
            if self._inflater.eof:
                tail = self._inflater.unused_data
                if not (self._gzip and tail):
                    return  # trailing bytes after the stream are ignored, as httpx does
                self._inflater, data = self._new(), tail + data  # a further gzip member
            try:
                out = self._inflater.decompress(data, STEP)
            except zlib.error:
                if not (self._deflate and self._first):
                    raise
                self._inflater = self._new(raw=True)  # servers that send raw deflate
                out = self._inflater.decompress(data, STEP)
            self._first = False
            data = self._inflater.unconsumed_tail
            if out:
                yield self._count(out)
            elif not data:
                return

    def _count(self, piece: bytes) -> bytes:
        self.total += len(piece)
        if self.total > self.limit:
            raise TooLarge(self.limit)
        return piece
