"""A lean, auto-pipelining Redis connection for the store's hot path (rewards, records,
publication).

One TCP connection shared by every coroutine of the process: commands are encoded into one
buffer and written once per event-loop iteration, replies are parsed by hiredis and matched to
their callers in order; a MULTI ... EXEC block is written contiguously. A lost connection fails
every command in flight with ``ConnectionError`` and the next one reconnects (``call`` retries
with backoff: every store operation is idempotent); a reply later than ``timeout_s`` fails the
connection with ``TimeoutError``. Error replies become redis-py's exception types, so callers
handle both clients alike. Only for plain TCP (``redis://``); ``RolloutStore`` uses redis-py
for anything else. Why, with its measurements: docs/design/redis-protocol.md."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Sequence
from typing import Any, cast

import hiredis
import redis.asyncio as aioredis
import redis.asyncio.connection
import redis.exceptions as rexc
from redis._parsers.base import BaseParser
from redis.commands.core import AsyncScript

_RETRIES = 5
_FLUSH_BYTES = 256 * 1024


class Encoded(bytes):
    """Several arguments of a command already in RESP (``encode_args``): the constant arguments
    of a script call (key templates, settings) are encoded once, not on every call."""

    args: tuple[Any, ...]  # the arguments themselves (for a client that is not a RedisPipe)


def encode_args(*args: Any) -> Encoded:
    """``args`` as a piece of a command, encoded once (see ``Encoded``)."""
    out: list[bytes] = []
    _encode(args, out)
    enc = Encoded(b"".join(out).split(b"\r\n", 1)[1])  # without the "*<count>" header
    enc.args = args
    return enc


def expand(args: Sequence[Any]) -> list[Any]:
    """``args`` with every ``Encoded`` piece replaced by its arguments."""
    return [x for a in args for x in (a.args if type(a) is Encoded else (a,))]


_pack_command = getattr(hiredis, "pack_command", None)  # hiredis >= 2.1: C, ~2x faster


def _encode(args: Sequence[Any], out: list[bytes]) -> None:
    """RESP for one command, appended to ``out``; ``Encoded`` pieces go in as they are."""
    if _pack_command is None:
        _encode_py(args, out)
        return
    pieces: list[bytes] = []
    count = start = 0
    for i, a in enumerate(args):
        if type(a) is Encoded:
            if i > start:
                packed = _pack_command(tuple(args[start:i]))
                pieces.append(packed[packed.index(b"\r\n") + 2:])  # without its "*<n>"
                count += i - start
            pieces.append(a)
            count += len(a.args)
            start = i + 1
    if not pieces:
        out.append(_pack_command(tuple(args)))
        return
    if start < len(args):
        packed = _pack_command(tuple(args[start:]))
        pieces.append(packed[packed.index(b"\r\n") + 2:])
        count += len(args) - start
    out.append(b"*%d\r\n" % count)
    out.extend(pieces)


def _encode_py(args: Sequence[Any], out: list[bytes]) -> None:
    """``_encode`` in Python (large values as their own pieces, not copied)."""
    head = len(out)
    out.append(b"")  # the "*<count>" header, once ``Encoded`` pieces are counted
    count = len(args)
    small: list[bytes] = []
    for a in args:
        t = type(a)
        if t is bytes:
            b = a
        elif t is str:
            b = a.encode()
        elif t is int or t is float:
            b = repr(a).encode()
        elif t is Encoded:
            small.append(a)
            count += len(a.args) - 1
            continue
        else:
            raise TypeError(f"cannot send {t.__name__} to Redis")
        if len(b) < 4096:
            small.append(b"$%d\r\n%b\r\n" % (len(b), b))
        else:
            small.append(b"$%d\r\n" % len(b))
            out.append(b"".join(small))
            out.append(b)
            small = [b"\r\n"]
    out.append(b"".join(small))
    out[head] = b"*%d\r\n" % count


def as_exception(reply: Any) -> Exception | None:
    """redis-py's exception for an error reply (hiredis's, or one redis-py already made);
    None for any other reply."""
    if not isinstance(reply, hiredis.ReplyError):
        return reply if isinstance(reply, Exception) else None
    # redis-py's own mapping (LOADING, NOSCRIPT...)
    err: Exception = BaseParser.parse_error(str(reply))  # type: ignore[no-untyped-call]  # redis-py: unannotated
    return err


class _Call:
    """The replies one ``_Protocol.send`` waits for, and the future that gets them all."""

    __slots__ = ("future", "left", "replies")

    def __init__(self, future: asyncio.Future[list[Any]], wanted: int) -> None:
        self.future, self.left, self.replies = future, wanted, [None] * wanted

    def put(self, slot: int, reply: Any) -> None:
        if slot < 0:
            return
        self.replies[slot] = reply
        self.left -= 1
        if not self.left and not self.future.done():
            self.future.set_result(self.replies)


class _Protocol(asyncio.Protocol):
    def __init__(self, timeout_s: float) -> None:
        self.reader = hiredis.Reader()
        # one entry per command sent: (its call's _Call, the reply's slot there or -1 when
        # not wanted, when it was sent)
        self.waiting: collections.deque[tuple[_Call, int, float]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.timeout_s = timeout_s
        self._buf: list[bytes] = []
        self._buf_len = 0
        self._watchdog: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # create_connection's: a Transport

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            call, slot, _ = self.waiting.popleft()
            call.put(slot, reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(rexc.ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def fail(self, exc: Exception) -> None:
        self.transport = None
        while self.waiting:
            call, _, _ = self.waiting.popleft()
            if not call.future.done():
                call.future.set_exception(exc)
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, commands: list[tuple[Any, ...]], want: list[bool]) -> asyncio.Future[list[Any]]:
        """Queues ``commands`` (written together at the end of this loop iteration); returns
        one future for the list of the wanted replies, in order (one future per call, not
        per command: a MULTI/EXEC of 11 commands costs one)."""
        if self.transport is None:
            raise rexc.ConnectionError("not connected to Redis")
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        if not self._buf:
            loop.call_soon(self._flush)  # (a no-op if a large write flushed it already)
        call = _Call(loop.create_future(), sum(want))
        mark = len(self._buf)
        slot = 0
        for cmd, w in zip(commands, want, strict=True):
            _encode(cmd, self._buf)
            self.waiting.append((call, slot if w else -1, now))
            slot += w
        if not call.left:
            call.future.set_result([])
        self._buf_len += sum(len(b) for b in self._buf[mark:])
        if self._buf_len >= _FLUSH_BYTES:  # large records: hand them over now, in slices
            self._flush()              # a socket takes whole (a huge buffer is copied and
        if self._watchdog is None:     # shifted again on every partial send)
            self._watchdog = loop.call_later(self.timeout_s, self._check)
        return call.future

    def _flush(self) -> None:
        if self.transport is not None and self._buf:
            self.transport.write(b"".join(self._buf))
        self._buf, self._buf_len = [], 0

    def _check(self) -> None:
        self._watchdog = None
        if not self.waiting:
            return
        oldest = self.waiting[0][2]
        if time.monotonic() - oldest >= self.timeout_s:
            self.fail(rexc.TimeoutError(f"no reply from Redis in {self.timeout_s} s"))
            if self.transport is not None:
                self.transport.abort()
            return
        loop = asyncio.get_running_loop()
        self._watchdog = loop.call_later(self.timeout_s - (time.monotonic() - oldest),
                                         self._check)


class RedisPipe:
    """One auto-pipelined connection (module docstring). Connects on first use, and again
    after a failure or when used from another event loop."""

    def __init__(self, host: str, port: int, db: int = 0, username: str | None = None,
                 password: str | None = None, timeout_s: float = 10.0,
                 connect_timeout_s: float = 2.0) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password = username, password
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self._proto: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connected(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._proto, self._loop, self._connecting = None, loop, asyncio.Lock()
        current = self._proto
        if current is not None and current.transport is not None:
            return current
        assert self._connecting is not None
        async with self._connecting:
            if self._proto is not None and self._proto.transport is not None:
                return self._proto
            try:
                _, proto = await asyncio.wait_for(loop.create_connection(
                    lambda: _Protocol(self.timeout_s), self.host, self.port),
                    self.connect_timeout_s)
            except (TimeoutError, OSError) as e:
                raise rexc.ConnectionError(f"cannot connect to Redis: {e}") from e
            setup: list[tuple[Any, ...]] = []
            if self.password is not None:
                setup.append(("AUTH", *([self.username] if self.username else []),
                              self.password))
            if self.db:
                setup.append(("SELECT", self.db))
            if setup:
                for reply in await proto.send(setup, [True] * len(setup)):
                    if (err := as_exception(reply)) is not None:
                        raise err
            self._proto = proto
            return proto

    async def call(self, commands: list[tuple[Any, ...]], want: list[bool]) -> list[Any]:
        """Sends ``commands`` back to back and returns the wanted replies (error replies as
        ``hiredis.ReplyError``: see ``as_exception``). Retried on connection errors."""
        delay = 0.02
        for attempt in range(_RETRIES + 1):
            try:
                proto = await self._connected()
                return list(await proto.send(commands, want))
            except (rexc.ConnectionError, rexc.TimeoutError):
                if attempt == _RETRIES:
                    raise
                await asyncio.sleep(delay)
                delay = min(0.5, delay * 2)
        raise AssertionError("unreachable")

    async def execute(self, *command: Any) -> Any:
        """One command; an error reply is raised."""
        (reply,) = await self.call([command], [True])
        if (err := as_exception(reply)) is not None:
            raise err
        return reply

    async def transaction(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """MULTI, ``commands``, EXEC: the EXEC reply (one reply per command; errors as
        ``hiredis.ReplyError``). A refused transaction is raised (the refusal's cause when a
        command was refused while queued)."""
        replies = await self.call([("MULTI",), *commands, ("EXEC",)],
                                  [True] * (len(commands) + 2))
        for reply in replies:  # the first error: its cause (e.g. LOADING), not EXECABORT
            if (err := as_exception(reply)) is not None:
                raise err
        return list(replies[-1])

    async def aclose(self) -> None:
        proto, self._proto = self._proto, None
        if proto is not None and proto.transport is not None:
            proto.transport.close()
            with contextlib.suppress(asyncio.TimeoutError, RuntimeError):
                await asyncio.wait_for(asyncio.shield(proto.closed), 2.0)


def pipe_for(client: aioredis.Redis) -> RedisPipe | None:
    """A ``RedisPipe`` to the server ``client`` talks to (plain TCP only; else None)."""
    pool = client.connection_pool
    kw = pool.connection_kwargs
    if pool.connection_class is not redis.asyncio.connection.Connection or "host" not in kw:
        return None
    return RedisPipe(kw["host"], int(kw.get("port", 6379)), int(kw.get("db") or 0),
                     kw.get("username"), kw.get("password"),
                     timeout_s=float(kw.get("socket_timeout") or 10.0),
                     connect_timeout_s=float(kw.get("socket_connect_timeout") or 2.0))


async def run_script(pipe: RedisPipe | None, client: aioredis.Redis, script: AsyncScript,
                     keys: Sequence[Any], args: Sequence[Any],
                     before: Sequence[tuple[Any, ...]] = ()) -> Any:
    """EVALSHA ``script`` (loaded again if Redis forgot it: a restart), after the commands
    ``before`` in the same MULTI/EXEC when there are any; through ``pipe`` when there is one,
    else ``client``. ``args`` may hold ``Encoded`` pieces. An error reply is raised."""
    call = ("EVALSHA", script.sha, len(keys), *keys, *args)
    delay = 0.02
    for _ in range(_RETRIES + 1):
        if pipe is None:
            async with client.pipeline(transaction=bool(before)) as p:
                for cmd in before:
                    p.execute_command(*cmd)
                p.execute_command(*expand(call))
                out = (await p.execute(raise_on_error=False))[-1]
        elif before:
            try:
                out = (await pipe.transaction([*before, call]))[-1]
            except rexc.BusyLoadingError as e:
                out = e
        else:
            (out,) = await pipe.call([call], [True])
        err = as_exception(out)
        if isinstance(err, rexc.NoScriptError):
            await client.script_load(script.script)
        elif isinstance(err, rexc.BusyLoadingError):  # restarted, reading its AOF: wait
            await asyncio.sleep(delay)
            delay = min(0.5, delay * 2)
        else:
            break
    if err is not None:
        raise err
    return out
