"""PD KV transfer: the prefill side's block store and TCP server, the decode side's client.

Wire protocol (one request per connection, all on TCP):

    decode -> prefill   {"op": "pull", "engine_id": str, "block_ids": [int, ...]}\\n
    prefill -> decode   {"ok": true, "tokens": T, "modelled_bytes": B, "wire_bytes": W,
                         "modelled_seconds": s}\\n  followed by exactly W payload bytes
                   or   {"ok": false, "error": "..."}\\n

B = T x KV bytes per token (the model's, e.g. 70,272 B for DeepSeek-V3);
W = ceil(B x kv_wire_scale) bytes really cross the socket. The payload is paced
so that it ends ``B / link rate / speedup`` seconds after the link is free;
transfers from one prefill instance share its link first-come first-served.
Blocks are freed once pulled, or ``kv_timeout_s / speedup`` wall seconds after
the prefill finished, whichever comes first (then their ids are unknown).
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field

CHUNKS = 16
MAX_LINE = 1 << 20


@dataclass
class KVEntry:
    """KV of one prefilled request held for a remote decode."""

    block_ids: list[int]
    tokens: int
    modelled_bytes: int
    expires_at: float  # loop time


class KVPullError(Exception):
    """A pull that failed; ``status`` is the HTTP status the decode answers with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class KVStats:
    """Modelled and wire bytes moved by this instance (either direction)."""

    sent_modelled: int = 0
    received_modelled: int = 0
    sent_wire: int = 0
    received_wire: int = 0
    transfers_out: int = 0
    transfers_in: int = 0
    expired_blocks: int = 0
    transfer_seconds: list[float] = field(default_factory=list)  # modelled seconds, recent


class KVStore:
    """Blocks held for remote decodes, keyed by block id; expiry and link pacing."""

    def __init__(
        self, engine_id: str, bytes_per_token: int, block_size: int, timeout_s: float, link_bytes_per_s: float,
        speedup: float, wire_scale: float,
    ) -> None:
        self.engine_id = engine_id
        self.bytes_per_token, self.block_size = bytes_per_token, block_size
        self.timeout_wall = timeout_s / speedup
        self.link_bytes_per_s, self.speedup, self.wire_scale = link_bytes_per_s, speedup, wire_scale
        self._next_block = 0
        self._by_block: dict[int, KVEntry] = {}
        self._link_free_at = 0.0
        self.stats = KVStats()

    @property
    def retained_tokens(self) -> int:
        """Tokens of KV held for remote decodes (count against the KV cache)."""
        self.expire()
        return sum(e.tokens for e in {id(e): e for e in self._by_block.values()}.values())

    def hold(self, tokens: int) -> KVEntry:
        """Keep ``tokens`` of KV for a remote decode; returns the entry with fresh block ids."""
        n = max(1, math.ceil(tokens / self.block_size))
        ids = list(range(self._next_block, self._next_block + n))
        self._next_block += n
        entry = KVEntry(ids, tokens, tokens * self.bytes_per_token, asyncio.get_running_loop().time() + self.timeout_wall)
        for b in ids:
            self._by_block[b] = entry
        return entry

    def expire(self) -> None:
        """Free entries past their timeout."""
        now = asyncio.get_running_loop().time()
        dead = [b for b, e in self._by_block.items() if e.expires_at <= now]
        for b in dead:
            del self._by_block[b]
        self.stats.expired_blocks += len(dead)

    def take(self, engine_id: str, block_ids: list[int]) -> KVEntry:
        """Remove and return the entry owning exactly ``block_ids``; KVPullError otherwise."""
        if engine_id != self.engine_id:
            raise KVPullError(f"remote_engine_id {engine_id!r} is not this prefill engine ({self.engine_id!r})")
        self.expire()
        unknown = [b for b in block_ids if b not in self._by_block]
        if unknown or not block_ids:
            raise KVPullError(f"unknown or expired block ids {unknown[:8] or block_ids[:8]} at engine {self.engine_id}")
        entry = self._by_block[block_ids[0]]
        if entry.block_ids != list(block_ids):
            raise KVPullError("block ids do not name the blocks of one prefilled request")
        for b in entry.block_ids:
            del self._by_block[b]
        return entry

    def reserve_link(self, modelled_bytes: int) -> tuple[float, float]:
        """Book the link for a transfer; returns (wall start, wall end) in loop time."""
        now = asyncio.get_running_loop().time()
        start = max(now, self._link_free_at)
        end = start + modelled_bytes / self.link_bytes_per_s / self.speedup
        self._link_free_at = end
        return start, end

    # ---- server ----------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one pull request on a connection."""
        try:
            line = await reader.readline()
            try:
                req = json.loads(line)
                entry = self.take(str(req.get("engine_id")), [int(b) for b in req.get("block_ids") or []])
            except KVPullError as exc:
                writer.write(json.dumps({"ok": False, "error": str(exc)}).encode() + b"\n")
                await writer.drain()
                return
            except (ValueError, TypeError, AttributeError) as exc:
                writer.write(json.dumps({"ok": False, "error": f"bad pull request: {exc}"}).encode() + b"\n")
                await writer.drain()
                return
            wire = math.ceil(entry.modelled_bytes * self.wire_scale)
            modelled_s = entry.modelled_bytes / self.link_bytes_per_s
            head = {"ok": True, "tokens": entry.tokens, "modelled_bytes": entry.modelled_bytes,
                    "wire_bytes": wire, "modelled_seconds": modelled_s}
            writer.write(json.dumps(head).encode() + b"\n")
            start, end = self.reserve_link(entry.modelled_bytes)
            loop = asyncio.get_running_loop()
            sent = 0
            for i in range(1, CHUNKS + 1):
                target = start + (end - start) * i / CHUNKS
                delay = target - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                n = wire * i // CHUNKS - sent
                writer.write(b"\0" * n)
                sent += n
                await writer.drain()
            self.stats.sent_modelled += entry.modelled_bytes
            self.stats.sent_wire += wire
            self.stats.transfers_out += 1
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@dataclass
class PullResult:
    """Outcome of a successful pull."""

    tokens: int
    modelled_bytes: int
    wire_bytes: int
    modelled_seconds: float
    wall_seconds: float


async def pull(host: str, port: int, engine_id: str, block_ids: list[int], timeout: float) -> PullResult:
    """Pull KV blocks from a prefill instance's KV port; raises KVPullError (400 refused, 502 transport)."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=MAX_LINE), timeout)
    except (OSError, asyncio.TimeoutError) as exc:
        raise KVPullError(f"cannot connect to KV port {host}:{port}: {exc!r}", status=502) from exc
    try:
        writer.write(json.dumps({"op": "pull", "engine_id": engine_id, "block_ids": block_ids}).encode() + b"\n")
        await writer.drain()
        head = json.loads(await asyncio.wait_for(reader.readline(), timeout) or b"null")
        if not isinstance(head, dict):
            raise KVPullError(f"KV port {host}:{port} closed without answering", status=502)
        if not head.get("ok"):
            raise KVPullError(str(head.get("error", "KV pull refused")), status=400)
        await asyncio.wait_for(reader.readexactly(int(head["wire_bytes"])), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        raise KVPullError(f"KV transfer from {host}:{port} failed: {exc!r}", status=502) from exc
    finally:
        writer.close()
    return PullResult(int(head["tokens"]), int(head["modelled_bytes"]), int(head["wire_bytes"]),
                      float(head["modelled_seconds"]), loop.time() - t0)
