"""The transport-level decode relay (relay.py): chunk framing, event boundaries, failures; metrics batching."""

from __future__ import annotations

import asyncio
import math

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from ascend_runtime.perf import proxy_capacity as capacity
from ascend_runtime.proxy.metrics import ITL_BUCKETS, BatchHistogram
from ascend_runtime.proxy.relay import DecodeConnection, RelayError, StreamStats, deframe, parse_head

EVENTS = [b'data: {"choices":[{"index":0,"text":" w%d"}]}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunked(parts: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closing = False
        self.protocol: object = None

    def set_protocol(self, protocol: object) -> None:
        self.protocol = protocol

    def get_protocol(self) -> object:
        return self.protocol

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None:
        self.closing = True


def dechunk_writes(writes: list[bytes]) -> list[bytes]:
    """Each client write must be whole chunk frames; returns the payload of each write."""
    out = []
    for w in writes:
        payload = b""
        while w:
            size, _, rest = w.partition(b"\r\n")
            n = int(size, 16)
            assert n > 0 and rest[n:n + 2] == b"\r\n", w
            payload += rest[:n]
            w = rest[n + 2:]
        out.append(payload)
    return out


async def drive(pieces: list[bytes], lost: BaseException | None = None,
                on_recompute=None) -> tuple[str | RelayError, list[bytes], list[bytes], DecodeConnection]:
    """Feed ``pieces`` (the whole answer, split anywhere) to a connection and relay it to a fake client."""
    conn = DecodeConnection(None, ("h", 1))
    up = FakeTransport()
    up.protocol = conn
    conn.connection_made(up)  # type: ignore[arg-type]
    client = FakeTransport()

    def feed(piece: bytes) -> None:  # as the event loop does: to the transport's current protocol
        up.protocol.data_received(piece)  # type: ignore[attr-defined]

    history: list[bytes] = []
    stats = StreamStats(ITL_BUCKETS)
    it = iter(pieces)

    async def until(task: asyncio.Future) -> None:
        while not task.done():
            piece = next(it, None)
            if piece is None:
                if lost is not None:
                    up.protocol.connection_lost(lost)  # type: ignore[attr-defined]
                    lost_done.append(True)
                await asyncio.sleep(0)
                if not task.done():
                    break
                return
            feed(piece)
            await asyncio.sleep(0)

    lost_done: list[bool] = []
    req = asyncio.ensure_future(conn.request(b"POST / HTTP/1.1\r\n\r\n"))
    await until(req)
    head = req.result()
    assert head.status == 200 and head.chunked
    first_task = asyncio.ensure_future(conn.first_payload())
    await until(first_task)
    first = first_task.result()

    def default_recompute(blob: bytes, hist: list[bytes]) -> tuple[bytes, bool]:
        return blob, False

    relay = asyncio.ensure_future(conn.relay(first, client, True, history, on_recompute or default_recompute,  # type: ignore[arg-type]
                                             stats, 10.0))
    await asyncio.sleep(0)
    for piece in it:
        feed(piece)
    if lost is not None and not lost_done:
        up.protocol.connection_lost(lost)  # type: ignore[attr-defined]
    try:
        outcome: str | RelayError = await asyncio.wait_for(relay, 5)
    except RelayError as exc:
        outcome = exc
    assert sum(stats.gap_counts) == stats.chunks
    return outcome, dechunk_writes(client.out), history, conn


async def test_every_split_of_the_body_relays_the_same_whole_events():
    body = chunked([EVENTS[0], EVENTS[1][:10], EVENTS[1][10:] + EVENTS[2], EVENTS[3] + EVENTS[4][:5],
                    EVENTS[4][5:], EVENTS[5]])
    raw = HEAD + body
    cases = [[raw]] + [[raw[:i], raw[i:]] for i in range(1, len(raw))] + [[raw[i:i + 1] for i in range(len(raw))]]
    for pieces in cases:
        outcome, payloads, history, conn = await drive(pieces)
        assert outcome == "done", pieces
        assert b"".join(payloads) == b"".join(EVENTS)
        assert all(p.endswith(b"\n\n") for p in payloads)  # never half an event
        assert b"".join(deframe(history)) == b"".join(EVENTS)  # what was written, kept for a recompute
        assert conn.body_done


async def test_one_event_per_chunk_is_forwarded_with_its_framing():
    outcome, payloads, _, _ = await drive([HEAD] + [b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS] + [b"0\r\n\r\n"])
    assert outcome == "done" and payloads == EVENTS


async def test_reads_of_several_frames_relay_whole_events_only():
    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in (EVENTS[0], EVENTS[1][:10], EVENTS[1][10:] + EVENTS[2],
                                                         EVENTS[3], EVENTS[4], EVENTS[5])]
    pieces = [HEAD, frames[0], frames[1] + frames[2], frames[3] + frames[4], frames[5], b"0\r\n\r\n"]
    outcome, payloads, history, _ = await drive(pieces)
    assert outcome == "done"
    assert payloads == [EVENTS[0], EVENTS[1] + EVENTS[2], EVENTS[3] + EVENTS[4], EVENTS[5]]
    assert b"".join(deframe(history)) == b"".join(EVENTS)


async def test_broken_stream_keeps_back_the_incomplete_event():
    raw = HEAD + b"%x\r\n%b\r\n" % (len(EVENTS[0]) + 7, EVENTS[0] + EVENTS[1][:7])
    outcome, payloads, _, _ = await drive([raw], lost=ConnectionResetError())
    assert isinstance(outcome, RelayError) and outcome.hard and "ConnectionResetError" in outcome.reason
    assert payloads == [EVENTS[0]]


async def test_malformed_chunk_size_is_a_hard_error():
    outcome, payloads, _, _ = await drive([HEAD + b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0]) + b"zz\r\nxx"])
    assert isinstance(outcome, RelayError) and "malformed chunked body" in outcome.reason
    assert payloads == [EVENTS[0]]


async def test_recompute_hook_sees_the_event_and_stops_the_relay():
    rec = b'data: {"choices":[{"index":0,"text":" x","stop_reason":"recomputed"}]}\n\n'
    seen: list[bytes] = []

    def hook(blob: bytes, hist: list[bytes]) -> tuple[bytes, bool]:  # as Forwarder._split_recompute answers
        seen.append(blob)
        assert b"".join(hist) + blob.split(rec)[0] == EVENTS[0]  # the events so far, unframed
        return blob[:blob.index(rec)], True

    raw = HEAD + chunked([EVENTS[0], rec, EVENTS[1]])
    for pieces in ([raw], [raw[:len(HEAD) + 60], raw[len(HEAD) + 60:]]):
        seen.clear()
        outcome, payloads, _, _ = await drive(pieces, on_recompute=hook)
        assert outcome == "recompute" and b"".join(payloads) == EVENTS[0]
        assert len(seen) == 1 and rec in seen[0] and EVENTS[1] not in payloads


def test_parse_head():
    h = parse_head(b"HTTP/1.1 404 Not Found\r\nContent-Length: 12\r\nConnection: close")
    assert (h.status, h.length, h.chunked, h.keep_alive) == (404, 12, False, False)
    h = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked")
    assert (h.chunked, h.keep_alive, h.length) == (True, True, None)
    assert parse_head(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream").keep_alive is False  # until close
    with pytest.raises(ValueError):
        parse_head(b"SSH-2.0 nope")


def test_batch_histogram_matches_prometheus_histogram():
    values = [0.0001, 0.0005, 0.0007, 0.02, 0.02000001, 0.3, 7.0, 0.0]
    ref_reg, reg = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("ascend_proxy_itl_seconds", "d", buckets=ITL_BUCKETS, registry=ref_reg)
    batch = BatchHistogram("ascend_proxy_itl_seconds", "d", ITL_BUCKETS, reg)
    stats = StreamStats(ITL_BUCKETS)
    for v in values:
        ref.observe(v)
    for v in values[:3]:
        batch.observe(v)
    from bisect import bisect_left

    for v in values[3:]:
        stats.gap_counts[bisect_left(stats.bounds, v)] += 1
        stats.gap_sum += v
    batch.add(stats.gap_counts, stats.gap_sum)

    def samples(text: bytes) -> dict[str, float]:
        return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.decode().splitlines()
                if ln.startswith("ascend_proxy_itl_seconds_") and "_created" not in ln}

    got, want = samples(generate_latest(reg)), samples(generate_latest(ref_reg))
    assert got.keys() == want.keys()
    assert all(math.isclose(got[k], want[k]) for k in want)


def test_workers_needed():
    per = capacity.tokens_per_worker()
    assert capacity.workers_needed(0) == 1
    assert capacity.workers_needed(per) == 1
    assert capacity.workers_needed(per * 1.01) == 2
    assert capacity.workers_needed(64 * 1920) == math.ceil(64 * 1920 / per)
    assert capacity.replicas_needed(per * 5, workers_per_replica=2) == 3
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError):
            capacity.workers_needed(bad)
    with pytest.raises(ValueError):
        capacity.replicas_needed(1.0, 0)


async def test_http10_client_gets_the_raw_stream_and_a_closed_connection(stubs, proxy):
    import json

    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    body = json.dumps({"model": "m", "prompt": "a b c", "max_tokens": 3, "stream": True}).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", px.port)
    writer.write(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                 % (len(body), body))
    answer = await asyncio.wait_for(reader.read(), 10)  # until the proxy closes the connection
    writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    assert rest == d.engine.sent[0]  # byte for byte, no chunk framing


async def test_streams_reuse_engine_connections(stubs, proxy, http):
    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0")
    px = await proxy(p, d)
    for _ in range(5):
        async with http.post(px.url + "/v1/completions",
                             json={"model": "m", "prompt": "a b", "max_tokens": 2, "stream": True}) as r:
            assert (await r.read()).endswith(b"data: [DONE]\n\n")
    idle = px.proxy.forwarder.relay_pool._idle  # noqa: SLF001 - white-box: one kept-alive connection per engine
    assert sorted(len(v) for v in idle.values()) == [1, 1]
    assert all(c.uses == 5 for v in idle.values() for c in v)


async def test_stalled_stream_ends_with_an_error_event(stubs, proxy, http):
    import json

    p = await stubs("prefill", "p0")
    d = await stubs("decode", "d0", token_interval_s=0.6)
    px = await proxy(p, d, stream_idle_timeout_s=0.2)
    async with http.post(px.url + "/v1/completions",
                         json={"model": "m", "prompt": "a b", "max_tokens": 5, "stream": True}) as r:
        events = [e for e in (await r.read()).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    err = json.loads(events[-2][len("data: "):])["error"]
    assert err["code"] == 502 and "stalled" in err["message"] and "d0" in err["message"]
    assert events[0].startswith("data: ") and '"text"' in events[0]  # the first token was relayed


class BufferingClient(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.buffered = 0

    def get_write_buffer_size(self) -> int:
        return self.buffered


class PausableUpstream(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


async def test_slow_client_pauses_the_decode_until_it_drains():
    conn = DecodeConnection(None, ("h", 1))
    up = PausableUpstream()
    up.protocol = conn
    conn.connection_made(up)  # type: ignore[arg-type]
    client = BufferingClient()
    req = asyncio.ensure_future(conn.request(b"x"))
    conn.data_received(HEAD + b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0]))
    await req
    first = await conn.first_payload()
    relay = asyncio.ensure_future(conn.relay(first, client, True, [], lambda b, h: (b, False),  # type: ignore[arg-type]
                                             StreamStats(ITL_BUCKETS), 10.0))
    await asyncio.sleep(0)
    client.buffered = 10 * 1024 * 1024
    up.protocol.data_received(b"%x\r\n%b\r\n" % (len(EVENTS[1]), EVENTS[1]))  # type: ignore[attr-defined]
    assert up.paused
    await asyncio.sleep(0.03)
    assert up.paused  # still too much waiting for the client
    client.buffered = 0
    await asyncio.sleep(0.03)
    assert not up.paused
    up.protocol.data_received(b"0\r\n\r\n")  # type: ignore[attr-defined]
    assert await asyncio.wait_for(relay, 2) == "done"
    assert up.protocol is conn  # given back after the stream
    assert dechunk_writes(client.out) == [EVENTS[0], EVENTS[1]]


# ---- the per-read fast path (relay.py ``fast``) and its helpers ---------------------------------------------
def test_single_chunk_head_names_the_only_size_a_frame_length_can_have():
    from ascend_runtime.proxy.relay import _single_chunk_head

    for size in list(range(1, 300)) + [4095, 4096, 65535, 65536, 1 << 20]:
        frame = b"%x\r\n%b\r\n" % (size, b"x" * size)
        assert _single_chunk_head(len(frame)) == b"%x\r\n" % size, size
    for n in (0, 1, 4, 5):  # too short to be a frame with a payload
        assert _single_chunk_head(n) == b"\x00"
    # 20 bytes: "f\r\n" + 15 + CRLF; 21 bytes would need a 16-byte payload with a 1-digit size: no such frame
    assert _single_chunk_head(20) == b"f\r\n" and _single_chunk_head(21) == b"\x00"


def test_whole_event_chunks_accepts_only_whole_frames_ending_on_an_event():
    from ascend_runtime.proxy.relay import _whole_event_chunks

    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS]
    assert _whole_event_chunks(b"".join(frames))
    assert _whole_event_chunks(frames[0])
    mid = b"%x\r\n%b\r\n" % (10, EVENTS[0][:10])
    for bad in (b"", frames[0][:-1], frames[0] + frames[1][:5], mid, frames[0] + mid, b"zz\r\n" + EVENTS[0] + b"\r\n",
                b"%x;ext\r\n%b\r\n" % (len(EVENTS[0]) + 1, EVENTS[0])):
        assert not _whole_event_chunks(bad), bad


def test_add_gaps_matches_bisecting_every_gap():
    import random
    from bisect import bisect_left

    from ascend_runtime.proxy.relay import add_gaps

    rng = random.Random(7)
    for n in (0, 1, 2, 3, 50, 400):
        stamps = [100.0]
        for _ in range(n):  # gaps on, just below and above the bounds, and random ones
            stamps.append(stamps[-1] + rng.choice([*ITL_BUCKETS, 0.0, 0.00049, 0.0201, 3.0, rng.random() / 10]))
        stats, ref = StreamStats(ITL_BUCKETS), StreamStats(ITL_BUCKETS)
        add_gaps(stats, stamps)
        for a, b in zip(stamps, stamps[1:]):
            ref.gap_counts[bisect_left(ref.bounds, b - a)] += 1
            ref.gap_sum += b - a
        assert stats.gap_counts == ref.gap_counts, n
        assert math.isclose(stats.gap_sum, ref.gap_sum, abs_tol=1e-9)


def test_count_events_over_batches():
    from ascend_runtime.proxy.relay import count_events

    history = [b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS] * 700 + [b"4\r\nx\n\n\r\n" * 2]
    assert count_events(history) == len(EVENTS) * 700 + 2
    assert count_events(history, batch=3) == count_events(history, batch=100000)
    assert count_events([]) == 0


async def test_fast_path_mixes_single_chunk_reads_with_split_and_merged_ones():
    """Single-frame reads (fast path), a frame split over reads (general path until whole again), reads of
    several frames and a frame whose length has no single-chunk head all relay exactly the whole events."""
    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS]
    odd = b"%X\r\n%b\r\n" % (len(EVENTS[2]), EVENTS[2])  # upper-case size: parsed, not looked up
    pieces = [HEAD, frames[0], frames[1][:3], frames[1][3:], odd, frames[3] + frames[4], frames[0][:-2],
              frames[0][-2:], frames[5], b"0\r\n\r\n"]
    outcome, payloads, history, _ = await drive(pieces)
    assert outcome == "done"
    want = [EVENTS[0], EVENTS[1], EVENTS[2], EVENTS[3] + EVENTS[4], EVENTS[0], EVENTS[5]]
    assert payloads == want
    assert b"".join(deframe(history)) == b"".join(want)


async def test_recompute_marker_in_a_single_frame_read_goes_to_the_hook():
    rec = b'data: {"choices":[{"index":0,"text":" x","stop_reason":"recomputed"}]}\n\n'
    seen: list[bytes] = []

    def hook(blob: bytes, hist: list[bytes]) -> tuple[bytes, bool]:
        seen.append(blob)
        return b"", True

    frames = [b"%x\r\n%b\r\n" % (len(e), e) for e in (EVENTS[0], EVENTS[1], rec, EVENTS[2])]
    outcome, payloads, history, _ = await drive([HEAD, *frames, b"0\r\n\r\n"], on_recompute=hook)
    assert outcome == "recompute" and payloads == [EVENTS[0], EVENTS[1]] and seen == [rec]
    assert deframe(history) == [EVENTS[0], EVENTS[1]]


async def test_stop_relay_keeps_exactly_the_events_written_for_the_migration_text():
    """A migration reads the text so far from the raw frames kept per write (migrate.py ``relayed_events``)."""
    from ascend_runtime.proxy.migrate import MigrationTracker, account, relayed_events

    conn = DecodeConnection(None, ("h", 1))
    up, client = FakeTransport(), FakeTransport()
    up.protocol = conn
    conn.connection_made(up)  # type: ignore[arg-type]
    req = asyncio.ensure_future(conn.request(b"POST / HTTP/1.1\r\n\r\n"))
    conn.data_received(HEAD + b"%x\r\n%b\r\n" % (len(EVENTS[0]), EVENTS[0]))
    await req
    first = await conn.first_payload()
    history: list[bytes] = []
    stats = StreamStats(ITL_BUCKETS)
    relay = asyncio.ensure_future(conn.relay(first, client, True, history, lambda b, h: (b, False),  # type: ignore[arg-type]
                                             stats, 10.0))
    await asyncio.sleep(0)
    for e in EVENTS[1:3]:
        up.protocol.data_received(b"%x\r\n%b\r\n" % (len(e), e))  # type: ignore[attr-defined]
    partial = (b"%x\r\n%b\r\n" % (len(EVENTS[3]), EVENTS[3]))[:12]
    up.protocol.data_received(partial)  # type: ignore[attr-defined]
    assert conn.stop_relay()
    assert await asyncio.wait_for(relay, 5) == "migrate"
    events = relayed_events(history, True)
    assert [c.get("text") for e in events for c in e["choices"]] == [" w0", " w1", " w2"]  # not the partial 4th
    tracker = MigrationTracker.for_request({"prompt": "p", "max_tokens": 9})
    assert account(tracker, events) == 3 and tracker.generated == " w0 w1 w2"  # the continuation's prompt tail
    assert dechunk_writes(client.out) == EVENTS[:3] and stats.events == 3 and sum(stats.gap_counts) == 3
