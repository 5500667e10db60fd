"""A lean HTTP/1.1 client for timing SSE streams: one keep-alive connection per stream, the
request written as one buffer, the response parsed by httptools (C). It exists so the bench can
measure a server's own overhead without a general-purpose client's cost (httpx, pure Python,
adds 3-5 ms per request on a small machine) in the number.

Plain `http://` only, JSON POST bodies, `data:` events; anything else belongs to httpx.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httptools


class SseError(Exception):
    """The connection failed or the server broke HTTP/1.1 framing."""


class HttpStatusError(Exception):
    """The server answered with a status other than 200; `body` is its response body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class _Response:
    """httptools callbacks for one response: status, body pieces and whether it is complete."""

    def __init__(self) -> None:
        self.parser: httptools.HttpResponseParser | None = None
        self.pieces: list[bytes] = []
        self.headers_done = False
        self.complete = False
        self.keep_alive = True

    def on_headers_complete(self) -> None:
        self.headers_done = True
        # asked here: once the message is complete the parser has reset and says False
        self.keep_alive = self.parser is not None and self.parser.should_keep_alive()

    def on_body(self, body: bytes) -> None:
        self.pieces.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class SseConnection:
    """One keep-alive connection to an HTTP server; `post_events` sends a JSON POST and yields
    each SSE `data:` payload as it arrives. One request at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"the lean SSE client speaks plain http:// only, not {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base_path = parts.path.rstrip("/")
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None or self._writer.is_closing():
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except OSError as e:
                raise SseError(f"cannot connect to {self.host}:{self.port}: {e}") from None
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader, self._writer = reader, writer
        return self._reader, self._writer

    async def post_events(self, path: str, body: dict[str, Any]) -> AsyncIterator[str]:
        """POSTs `body` to `path` (under the URL's path) and yields every `data:` payload of the
        SSE response; raises HttpStatusError for a status other than 200."""
        reader, writer = await self._connect()
        payload = json.dumps(body).encode()
        head = (
            f"POST {self.base_path}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        ).encode()
        writer.write(head + payload)
        response = _Response()
        parser = httptools.HttpResponseParser(response)
        response.parser = parser
        pending = b""
        try:
            while not response.complete:
                data = await reader.read(65536)
                if not data:
                    raise SseError("the server closed the connection mid-response")
                parser.feed_data(data)
                status = parser.get_status_code()
                if response.headers_done and status != 200:
                    while not response.complete:
                        more = await reader.read(65536)
                        if not more:
                            break
                        parser.feed_data(more)
                    raise HttpStatusError(status, b"".join(response.pieces))
                if not response.pieces:
                    continue
                pending += b"".join(response.pieces)
                response.pieces.clear()
                *events, pending = pending.split(b"\n\n")
                for event in events:
                    for line in event.split(b"\n"):
                        if line.startswith(b"data: "):
                            yield line[6:].decode()
        except httptools.HttpParserError as e:
            response.keep_alive = False
            raise SseError(f"bad HTTP response: {e}") from None
        except BaseException:
            response.keep_alive = False
            raise
        finally:
            if not (response.complete and response.keep_alive):
                self.close()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None


class SsePool:
    """Keep-alive connections to one server, reused one request at a time each."""

    def __init__(self, url: str) -> None:
        SseConnection(url)  # checks the URL now
        self.url = url
        self._idle: list[SseConnection] = []

    async def post_events(self, path: str, body: dict[str, Any]) -> AsyncIterator[str]:
        connection = self._idle.pop() if self._idle else SseConnection(self.url)
        async for data in connection.post_events(path, body):
            yield data
        self._idle.append(connection)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()
