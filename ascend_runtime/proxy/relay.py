"""Transport-level relay of a streamed (SSE) decode answer: bytes in, bytes out, no per-event parsing.

The same small HTTP/1.1 client also carries the prefill requests (one JSON
answer each), so both legs share kept-alive connections and skip aiohttp's
client machinery.

The decode leg of a streaming request does not go through aiohttp's client:
a small HTTP/1.1 client (:class:`DecodeConnection`, an ``asyncio.Protocol``)
sends the request, parses the answer head, and then, in ``data_received``
itself, strips the upstream chunk framing, cuts at the last SSE event
boundary (``\\n\\n``; an incomplete event is held back so a broken stream never
leaves half an event before the proxy's error event) and writes the complete
events to the client's transport in one chunk frame. No coroutine is woken per
event, no JSON is parsed, and each event is copied twice (out of the upstream
buffer and into the client's chunk frame). Events containing ``recomputed``
are handed to a callback that decides (by parsing them) whether the decode
asked for a recompute.

Per stream the relay counts the writes (``chunks``) and the SSE events
(``events``: one token per event at the engine's streaming granularity),
both at the end of the stream from the kept writes, and records one timestamp
per write; the gaps are histogrammed once at the end (:func:`add_gaps`) and
flushed to metrics.py ``BatchHistogram``. Why the per-read work is what it is:
docs/proxy.md, "Relay cost".

Connections are kept alive and reused per (host, port) (:class:`ConnectionPool`).
An idle connection is not reused after ``idle_ttl_s`` (default 4 s, below
vLLM 0.23.0's server keep-alive of ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` = 5 s,
vllm/envs.py, used by vllm/entrypoints/openai/api_server.py), and a reused
connection that fails before any answer byte is retried once on a fresh one,
so a keep-alive race is never blamed on the instance.

The client's answer must have been prepared by aiohttp (status and headers
sent, chunked encoding enabled for HTTP/1.1); the relay then writes to
``request.transport`` directly and the caller ends with ``write_eof()``.
"""

from __future__ import annotations

import asyncio
import operator
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

#: pause reading the decode when this many bytes wait for the client (the client is slow)
HIGH_WATER = 256 * 1024
#: resume once the client's buffer drained below this
LOW_WATER = 64 * 1024
#: longest answer head (status line and headers) accepted from an engine
MAX_HEAD = 64 * 1024


class RelayError(Exception):
    """A decode connection failed. ``hard``: refused / reset / broken (the instance looks down).
    ``before_head``: nothing of the answer arrived (safe to retry a reused connection)."""

    def __init__(self, reason: str, hard: bool = False, before_head: bool = False):
        super().__init__(reason)
        self.reason, self.hard, self.before_head = reason, hard, before_head


@dataclass(slots=True)
class Head:
    """The parsed answer head of a decode request."""

    status: int
    headers: dict[str, str]  # lower-cased names; repeated names joined with ", "
    chunked: bool
    length: int | None
    keep_alive: bool

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/json")


def parse_head(raw: bytes) -> Head:
    """Parse an HTTP/1.x status line and headers (``raw`` without the final blank line). ValueError if bad."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        key = name.strip().lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = None if chunked or "content-length" not in headers else int(headers["content-length"])
    conn = headers.get("connection", "").lower()
    keep_alive = ("close" not in conn) if version == "HTTP/1.1" else ("keep-alive" in conn)
    if status in (204, 304) or 100 <= status < 200:
        length = 0
    if not chunked and length is None:
        keep_alive = False  # body ends when the connection closes
    return Head(status, headers, chunked, length, keep_alive)


@dataclass
class StreamStats:
    """What one relayed stream did: client writes, SSE events, and the write gaps (seconds) by bucket."""

    bounds: tuple[float, ...]
    chunks: int = 0
    events: int = 0
    gap_counts: list[int] = field(default_factory=list)
    gap_sum: float = 0.0

    def __post_init__(self) -> None:
        self.gap_counts = [0] * (len(self.bounds) + 1)


class DecodeConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to a decode instance, reused for successive requests.

    Use: ``await conn.request(head_bytes, body)`` -> :class:`Head`; then either
    ``await conn.read_body()`` (whole body, for errors and JSON) or
    ``await conn.first_payload()`` followed by :meth:`relay`.
    """

    def __init__(self, pool: "ConnectionPool | None", key: tuple[str, int]):
        self.pool, self.key = pool, key
        self.loop = asyncio.get_running_loop()
        self._time = self.loop.time
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.uses = 0
        self.role = "decode"  # names the engine in error reasons; set by request()
        #: ends the running relay with outcome "migrate" (set while :meth:`relay` runs)
        self._stop: Callable[[str], None] | None = None
        self._stop_requested = False
        self._reset()

    def _reset(self) -> None:
        self.head: Head | None = None
        self._head_buf = b""
        self._waiter: asyncio.Future[Any] | None = None
        self._early: list[bytes] = []  # payload before a sink is attached
        self._sink: Callable[[bytes], None] | None = None
        self._cbuf = b""  # incomplete chunk-size line / CRLF
        self._left = 0  # payload bytes left in the current chunk (or of Content-Length)
        self._crlf = False  # the CRLF after a chunk's payload is due
        self.body_done = False
        self.error: RelayError | None = None
        self.last_data = 0.0

    # ---- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_data = self._time()
        if self.head is None:
            self._on_head_bytes(data)
        else:
            self._on_body(data)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.pool is not None:
            self.pool.forget(self)
        if self.body_done:
            return
        if self.head is not None and not self.head.chunked and self.head.length is None and exc is None:
            self._finish_body()  # close-delimited body ended normally
            return
        name = exc.__class__.__name__ if exc is not None else "connection closed"
        if self.head is None:
            self._fail(RelayError(f"{self.role} closed the connection before answering ({name})",
                                  hard=exc is not None, before_head=not self._head_buf))
        else:
            self._fail(RelayError(f"{self.role} stream broke: {name}", hard=True))

    # ---- parsing ------------------------------------------------------------------------
    def _on_head_bytes(self, data: bytes) -> None:
        buf = self._head_buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self._head_buf = buf
            if len(buf) > MAX_HEAD:
                self._fail(RelayError(f"{self.role} answer head too long"))
                self.close()
            return
        try:
            head = parse_head(buf[:end])
        except (ValueError, IndexError) as exc:
            self._fail(RelayError(f"{self.role} sent an invalid answer head: {exc}"))
            self.close()
            return
        self.head = head
        self._head_buf = b""
        if head.length is not None:
            self._left = head.length
        self._wake(head)
        rest = buf[end + 4:]
        if rest or head.length == 0:
            self._on_body(rest)

    def _on_body(self, data: bytes) -> None:
        head = self.head
        assert head is not None
        if self.body_done:
            return  # bytes after the end of the body: the connection is not reused (see release)
        if not head.chunked:
            if head.length is None:
                if data:
                    self._payload(data)
                return
            take = data[: self._left] if len(data) > self._left else data
            self._left -= len(take)
            if take:
                self._payload(take)
            if self._left == 0:
                self._finish_body()
            return
        buf = self._cbuf + data if self._cbuf else data
        pos, n = 0, len(buf)
        parts: list[bytes] = []
        try:
            while pos < n:
                left = self._left
                if left:
                    end = pos + left
                    if end <= n:
                        parts.append(buf[pos:end] if pos or end != n else buf)
                        self._left, self._crlf, pos = 0, True, end
                        continue
                    parts.append(buf[pos:])
                    self._left, pos = end - n, n
                    break
                if self._crlf:
                    if n - pos < 2:
                        break
                    if buf[pos:pos + 2] != b"\r\n":
                        raise ValueError("missing CRLF after a chunk")
                    self._crlf, pos = False, pos + 2
                    continue
                line_start = pos
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if n - pos > 1024:
                        raise ValueError("chunk size line too long")
                    break
                size = int(buf[pos:nl].split(b";", 1)[0], 16)
                if size < 0:
                    raise ValueError("negative chunk size")
                pos = nl + 2
                if size == 0:
                    tail = buf.find(b"\r\n", pos)  # trailers (none expected) end with an empty line
                    while tail > pos:
                        pos = tail + 2
                        tail = buf.find(b"\r\n", pos)
                    if tail < 0:
                        pos = line_start  # wait for the rest of the last chunk
                        break
                    pos = tail + 2
                    if parts:
                        self._payload(parts[0] if len(parts) == 1 else b"".join(parts))
                    self._cbuf = b""
                    if pos != n:
                        head.keep_alive = False
                    self._finish_body()
                    return
                self._left = size
            self._cbuf = buf[pos:] if pos < n else b""
        except ValueError as exc:
            if parts:  # the chunks before the bad one are good
                self._payload(parts[0] if len(parts) == 1 else b"".join(parts))
            self._fail(RelayError(f"{self.role} sent a malformed chunked body: {exc}", hard=True))
            self.close()
            return
        if parts:
            self._payload(parts[0] if len(parts) == 1 else b"".join(parts))

    def _payload(self, data: bytes) -> None:
        if self._sink is not None:
            self._sink(data)
            return
        self._early.append(data)
        self._wake(None)

    def _finish_body(self) -> None:
        self.body_done = True
        self._wake(None)

    def _fail(self, err: RelayError) -> None:
        if self.error is None:
            self.error = err
        self._wake(None)

    def _wake(self, value: Any) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(value)

    async def _wait(self) -> None:
        self._waiter = self.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # ---- the caller's side ----------------------------------------------------------------
    async def request(self, data: bytes, role: str = "decode") -> Head:
        """Send the serialized request ``data`` to a ``role`` engine; wait for the answer head."""
        assert self.transport is not None
        self.uses += 1
        self.role = role
        self.transport.write(data)
        while self.head is None:
            if self.error is not None:
                raise self.error
            await self._wait()
        return self.head

    async def read_body(self) -> bytes:
        """The whole answer body (an error answer or a JSON one)."""
        while not self.body_done:
            if self.error is not None:
                raise self.error
            await self._wait()
        body, self._early = b"".join(self._early), []
        return body

    async def first_payload(self) -> bytes:
        """The first non-empty body bytes; b"" if the body ended empty. Raises :class:`RelayError`."""
        while True:
            early = b"".join(self._early)
            if early or self.body_done:
                self._early = []
                return early
            if self.error is not None:
                raise self.error
            await self._wait()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def stop_relay(self) -> bool:
        """End the stream's relay at the last event boundary written to the client (outcome ``"migrate"``).

        Called from outside the relay (an evacuation, forward.py): nothing more is written to the
        client from this connection; an event that had only partly arrived is dropped. Before the
        relay runs, it stops right after relaying its first payload. The caller closes the
        connection afterwards (the engine aborts the request on disconnect). False (nothing done) once
        the body has ended or failed: the stream is finishing on its own.
        """
        if self.body_done or self.error is not None or self.closed:
            return False
        if self._stop is not None:
            self._stop("migrate")
        else:
            self._stop_requested = True
        return True

    def release(self) -> None:
        """Give the connection back to the pool if its answer ended cleanly and it may be kept."""
        head = self.head
        if (self.pool is None or self.closed or not self.body_done or self.error is not None or head is None
                or not head.keep_alive or self._cbuf or (self.transport is not None and self.transport.is_closing())):
            self.close()
            return
        if self.transport is not None:
            self.transport.resume_reading()
        self._reset()
        self.pool.put(self)

    # ---- the relay -------------------------------------------------------------------------
    async def relay(self, first: bytes, client: asyncio.Transport, chunked: bool, history: list[bytes],
                    on_recompute: Callable[[bytes, list[bytes]], tuple[bytes, bool]], stats: StreamStats,
                    idle_timeout_s: float, rewrite: Callable[[bytes], bytes] | None = None) -> str:
        """Relay the rest of the body to ``client``; ``first``: payload already received.

        Returns "done" (body ended; the caller writes the end of the client's
        answer), "recompute" (the events before the recomputed one were
        relayed), "migrate" (:meth:`stop_relay` was called; ``history`` holds
        exactly the complete events written) or "client_gone". Raises :class:`RelayError` if the decode
        broke (hard) or sent nothing for ``idle_timeout_s`` (soft).
        ``history`` collects what was written to the client (chunk frames when
        ``chunked``; :func:`deframe` gives the events). ``on_recompute(events,
        events so far)`` gets complete events that contain ``recomputed`` and
        returns (bytes to relay, recompute?). ``rewrite``: applied to every run of complete events before it is
        written (a continuation's: migrate.continuation_rewrite); it turns the pass-through fast path off.
        """
        loop = self.loop
        time_ = self._time
        if self._early:  # arrived while the client's answer was being prepared
            first, self._early = first + b"".join(self._early), []
        outcome: str | None = None
        pending = b""
        paused = False
        write = client.write
        is_closing = client.is_closing
        buffered = client.get_write_buffer_size
        keep = history.append
        bounds = stats.bounds
        start = time_()
        stamps = [start]  # the relay's start, then the time of each client write: gaps histogrammed at the end
        stamp = stamps.append
        transport = self.transport
        assert transport is not None

        def finish(result: str) -> None:
            nonlocal outcome
            if outcome is None:
                outcome = result
                transport.set_protocol(self)  # later reads (even in this loop iteration) take the general path
                self._wake(None)

        def resume_check() -> None:
            nonlocal paused
            if outcome is not None or is_closing():
                return
            if buffered() <= LOW_WATER:
                paused = False
                transport.resume_reading()
            else:
                loop.call_later(0.005, resume_check)

        def pause() -> None:
            nonlocal paused
            paused = True
            transport.pause_reading()
            loop.call_later(0.005, resume_check)

        def sink(data: bytes) -> None:
            """General path: payload bytes (framing stripped); relays the complete events."""
            nonlocal pending
            if outcome is not None:
                return
            if pending:
                data = pending + data
            if data.endswith(b"\n\n"):
                pending = b""
            else:
                cut = data.rfind(b"\n\n")
                if cut < 0:
                    pending = data
                    return
                data, pending = data[: cut + 2], data[cut + 2:]
            recompute = False
            if b"recomputed" in data:
                data, recompute = on_recompute(data, deframe(history) if chunked else list(history))
            if rewrite is not None and data:
                data = rewrite(data)
            if is_closing():
                finish("client_gone")
                return
            if data:
                out = b"%x\r\n%b\r\n" % (len(data), data) if chunked else data
                write(out)
                keep(out)
                stamp(time_())
                if not paused and buffered() > HIGH_WATER:
                    pause()
            if recompute:
                finish("recompute")

        general = self.data_received
        heads = _HEADS
        dirty = False  # True while a read left part of a chunk or event behind: reads take the general path

        def fast(data: bytes) -> None:
            """``data_received`` while relaying: a read of whole upstream chunks, each ending with a complete
            SSE event, nothing held back, is the client's chunk as it came, framing included (chunked clients);
            anything else takes the general path (``DecodeConnection.data_received``).

            This runs once per token, so it is kept to a few C calls: slice compares instead of
            ``endswith`` / ``in`` (which go through slower argument handling), the expected chunk-size line
            of a single-chunk read looked up by the read's length instead of parsed, no attribute reads on
            the connection (``dirty`` says when the general path left a partial chunk or event). A client
            that went away cancels the handler (aiohttp ``handler_cancellation``); the event counts are
            taken from ``history`` at the end of the stream.
            """
            nonlocal dirty
            if dirty or data[-4:] != b"\n\n\r\n" or data.find(RECOMPUTED_MARK) >= 0:
                general(data)
                dirty = bool(pending or self._left or self._cbuf or self._crlf)
                return
            n = len(data)
            head = heads.get(n) or _single_chunk_head(n)
            if data[:len(head)] != head and not _whole_event_chunks(data):
                general(data)
                dirty = bool(pending or self._left or self._cbuf or self._crlf)
                return
            write(data)
            keep(data)
            stamp(time_())
            if buffered() > HIGH_WATER and not paused:
                pause()

        self._sink = sink
        if chunked and self.head is not None and self.head.chunked and rewrite is None:
            transport.set_protocol(_Relaying(fast, self))  # uvloop then calls fast() per read, one frame
        self.last_data = start
        idle_handle: list[asyncio.TimerHandle | None] = [None]
        tick = idle_timeout_s / 4

        def idle_check() -> None:
            """Every quarter of the idle timeout: stalled if no byte arrived for ``idle_timeout_s``."""
            if outcome is not None or self.body_done:
                return
            now = time_()
            if paused:
                self.last_data = now  # waiting for the client, not for the decode
            if now - max(stamps[-1], self.last_data) >= idle_timeout_s:
                self._fail(RelayError(f"{self.role} stream stalled (idle timeout)"))
            else:
                idle_handle[0] = loop.call_at(now + tick, idle_check)

        try:
            sink(first)
            dirty = bool(pending or self._left or self._cbuf or self._crlf)
            self._stop = finish  # an evacuation ends the relay between two reads: no check per read or event
            if self._stop_requested:
                finish("migrate")
            idle_handle[0] = loop.call_at(start + tick, idle_check)
            while outcome is None and not self.body_done and self.error is None:
                await self._wait()
        finally:
            self._sink = None
            self._stop = None
            self._stop_requested = False
            if not self.closed:
                transport.set_protocol(self)
            if idle_handle[0] is not None:
                idle_handle[0].cancel()
            stats.chunks += len(history)
            stats.events += count_events(history)
            add_gaps(stats, stamps)
        if outcome is not None:
            return outcome
        if self.error is not None:
            raise self.error
        if pending:  # a last event without its blank line: relayed as it came
            if is_closing():
                return "client_gone"
            if rewrite is not None:
                pending = rewrite(pending)
            out = b"%x\r\n%b\r\n" % (len(pending), pending) if chunked else pending
            write(out)
            now = time_()
            stats.gap_counts[bisect_left(bounds, now - stamps[-1])] += 1
            stats.gap_sum += now - stamps[-1]
            stats.chunks += 1
            stats.events += 1
        return "done"


class _Relaying(asyncio.Protocol):
    """The protocol of a decode connection while its stream is relayed: reads go straight to the relay's
    fast path, everything else to the :class:`DecodeConnection`."""

    __slots__ = ("data_received", "conn")

    def __init__(self, on_data: Callable[[bytes], None], conn: DecodeConnection):
        self.data_received = on_data  # type: ignore[method-assign]
        self.conn = conn

    def eof_received(self) -> bool:
        return self.conn.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.conn.connection_lost(exc)


#: expected chunk-size line of a read that is exactly one chunk, by the read's length (filled as seen)
_HEADS: dict[int, bytes] = {}
_HEADS_MAX = 4096
#: what marks an event that may ask for a recompute (pd.py ``RECOMPUTED``, parsed only when present)
RECOMPUTED_MARK = b"recomputed"


def _single_chunk_head(n: int) -> bytes:
    """The chunk-size line (``<hex>\\r\\n``) of a chunk whose whole frame is ``n`` bytes long.

    A frame is ``<hex size>\\r\\n<payload>\\r\\n``, so its length grows with the size and one length
    belongs to at most one size; b"\\x00" (matches no read) if none. Cached in ``_HEADS``
    (at most ``_HEADS_MAX`` lengths).
    """
    head = b"\x00"
    for digits in range(1, 9):
        size = n - digits - 4
        if size > 0 and len(b"%x" % size) == digits:
            head = b"%x\r\n" % size
            break
    if len(_HEADS) < _HEADS_MAX:
        _HEADS[n] = head
    return head


def _whole_event_chunks(data: bytes) -> bool:
    """True if ``data`` is one or more whole chunk frames, each payload ending with ``\\n\\n``."""
    pos, n = 0, len(data)
    while pos < n:
        nl = data.find(b"\r\n", pos)
        if nl < 0:
            return False
        try:
            end = nl + 4 + int(data[pos:nl], 16)
        except ValueError:
            return False
        if end > n or data[end - 4:end] != b"\n\n\r\n":
            return False
        pos = end
    return pos == n > 0


def add_gaps(stats: StreamStats, stamps: list[float]) -> None:
    """Histogram the gaps between successive ``stamps`` (seconds) into ``stats``: a gap g counts in the first
    bucket whose bound is >= g, as ``bisect_left(bounds, g)`` places it, done in C for the whole stream
    (subtract, sort, one bisect per bound) instead of per write; ``gap_sum`` gets last - first."""
    if len(stamps) < 2:
        return
    gaps = sorted(map(operator.sub, islice(stamps, 1, None), stamps))
    counts = stats.gap_counts
    prev = 0
    for i, bound in enumerate(stats.bounds):
        upto = bisect_right(gaps, bound)
        counts[i] += upto - prev
        prev = upto
    counts[-1] += len(gaps) - prev
    stats.gap_sum += stamps[-1] - stamps[0]


def count_events(history: list[bytes], batch: int = 1024) -> int:
    """SSE events (``\\n\\n`` boundaries) in ``history``, counted over joined batches of items (one C count
    per batch instead of one call per event)."""
    return sum(b"".join(history[i:i + batch]).count(b"\n\n") for i in range(0, len(history), batch))


def deframe(chunks: list[bytes]) -> list[bytes]:
    """The payloads of chunk-framed writes (``<hex>\\r\\n<payload>\\r\\n`` each, several per item allowed)."""
    out = []
    for data in chunks:
        pos, n = 0, len(data)
        while pos < n:
            nl = data.find(b"\r\n", pos)
            end = nl + 2 + int(data[pos:nl], 16)
            out.append(data[nl + 2:end])
            pos = end + 2
    return out


class ConnectionPool:
    """Idle keep-alive decode connections per (host, port).

    ``connect_timeout_s``: TCP connect limit. ``idle_ttl_s``: an idle connection
    older than this is closed instead of reused. ``max_idle`` per (host, port).
    """

    def __init__(self, connect_timeout_s: float, idle_ttl_s: float = 4.0, max_idle: int = 512):
        self.connect_timeout_s = connect_timeout_s
        self.idle_ttl_s = idle_ttl_s
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int], list[DecodeConnection]] = {}

    async def connect(self, host: str, port: int, tls: bool = False, role: str = "decode") -> DecodeConnection:
        """A new connection, TLS if ``tls`` (RelayError hard on refusal, soft on connect timeout)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: DecodeConnection(self, (host, port)), host, port,
                                                        ssl=True if tls else None)
        except TimeoutError:
            raise RelayError(f"{role}: connect timed out", before_head=True) from None
        except OSError as exc:
            raise RelayError(f"{role}: unreachable ({exc.__class__.__name__})", hard=True, before_head=True) from None
        return proto

    def take_idle(self, host: str, port: int) -> DecodeConnection | None:
        """A reusable idle connection to (host, port), or None."""
        idle = self._idle.get((host, port))
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > self.idle_ttl_s:
                conn.close()
                continue
            return conn
        return None

    def put(self, conn: DecodeConnection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def forget(self, conn: DecodeConnection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def serialize_request(method: str, host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """An HTTP/1.1 request with ``Content-Length`` and keep-alive."""
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    lines = [f"{method} {path or '/'} HTTP/1.1", f"Host: {authority}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
