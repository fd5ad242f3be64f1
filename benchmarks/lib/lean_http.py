"""A lean HTTP/1.1 keep-alive load generator for the serving benchmarks: it shares the cores
with the server it measures, so it must cost little."""

from __future__ import annotations

import asyncio
import json
import re

import httpx


class LeanClient:
    """A minimal HTTP/1.1 keep-alive client, one connection per in-flight request: the load
    generator shares the cores with the server, so it must cost little (httpx: ~5 ms of CPU
    per request here, a few % of the engine's own CPU per request)."""

    USAGE = re.compile(rb'"completion_tokens":(\d+)')

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        u = httpx.URL(url)
        self.host, self.port = u.host, u.port or 80
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post_json(self, path: str, body: dict) -> bytes:
        data = json.dumps(body).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: "
                f"application/json\r\nContent-Length: {len(data)}\r\n{self.extra}\r\n")
        request = head.encode() + data
        status = b""
        # a kept-alive connection that sat idle past uvicorn's keep-alive timeout (5 s: a long
        # engine phase in between) is closed by the server: retried on another one
        while self.idle and not status:
            reader, writer = self.idle.pop()
            status = await self._send(reader, writer, request)
            if not status:
                writer.close()
        if not status:  # a new connection (closed without an answer here: an error below)
            reader, writer = await asyncio.open_connection(self.host, self.port)
            writer.write(request)
            status = await reader.readline()
        length = 0
        while (line := await reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        payload = await reader.readexactly(length)
        self.idle.append((reader, writer))
        if b" 200 " not in status:
            raise RuntimeError(f"{status!r}: {payload[:300]!r}")
        return payload

    @staticmethod
    async def _send(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    request: bytes) -> bytes:
        """The status line of ``request`` on a reused connection; b"" if it was closed."""
        try:
            writer.write(request)
            return await reader.readline()
        except ConnectionError:
            return b""

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
