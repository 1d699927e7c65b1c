"""KV-cache-affinity routing of prefill requests: which instance is expected to hold the longest prefix.

vLLM's automatic prefix cache (vllm/v1/core/kv_cache_utils.py and block_pool.py,
vLLM 0.23.0) keeps a prompt's full KV blocks after the request, keyed by chained
block hashes, and evicts least recently used blocks when room is needed. A
prefill instance that already computed a prompt's prefix computes only the rest,
so routing a request where its prefix is cached saves prefill work and time to
first token.

What the proxy knows: its own routing history. For every prefill it routes, it
records the prompt's block hashes for the chosen instance in a bounded LRU per
instance (``capacity_blocks``, about the instance's KV cache in blocks, so what
the proxy remembers is roughly what the engine can still hold). The expected
cached prefix of an instance is the number of leading blocks of the new prompt
found in its set. Blocks are the proxy's own: ``block_tokens`` whitespace
words (chat: 4 role-marker words per message, then its content's words) hashed
in a chain with BLAKE2b, so a hash names the whole prefix up to its block. They
need not line up with the engine's token blocks; they estimate how much of the
prompt the engine will find cached.

Why not the engine's KV events: vLLM 0.23.0 publishes ``BlockStored`` /
``BlockRemoved`` events over ZMQ when started with ``--kv-events-config``
(vllm/distributed/kv_events.py ``ZmqEventPublisher``, published by
``Scheduler.update_from_output`` in vllm/v1/core/sched/scheduler.py), and
vllm-ascend 0.23.0's own schedulers publish them the same way
(vllm_ascend/core/recompute_scheduler.py, scheduler_dynamic_batch.py). But the
event hashes are SHA-256 over the engine's token ids with a seed from
``PYTHONHASHSEED`` (``init_none_hash``), so matching a new request against them
needs the model's tokenizer and chat template in the proxy; and consuming them
means one ZMQ subscription per instance and DP rank (the publisher offsets its
port by the DP rank). The history-based estimate needs neither; the per-instance
sets here are the structure such events would update.

Score (lower wins), for prefill instance ``i`` of weight ``w_i``::

    score_i = (load_i - prefill_token_weight * prefill_affinity_weight * E_i) / w_i

``load_i`` is the pool's load score: outstanding *uncached* prompt tokens
(each routed prefill is charged its prompt minus the tokens expected cached on
the instance that got it: the work it will actually do), KV usage and waiting
requests. ``E_i`` is the number of prompt tokens expected in ``i``'s prefix
cache, block-aligned and at most ``prompt - 1`` (the engine always computes the
last token). A cached token is worth ``prefill_affinity_weight`` queued
tokens (default 1: a token not computed is a token of queue not waited for, so
the score is the expected uncached work ahead of and in the request).
``prefill_affinity_weight = 0`` gives load-only routing. A prompt with
``E_i = 0`` everywhere (nobody shares it) is scored, charged and tie-broken
exactly as under load-only routing.

Where ``E_i`` comes from:

- *history*: the leading blocks of the prompt in ``i``'s routing history;
- *home guess*, for a chat turn that continues a conversation (it has an
  assistant message): the previous turn's prompt (every message before the
  last assistant message; in PD the prefill instance caches the prompt only,
  the answer is produced on the decode) is expected at the conversation's
  *home*, times ``prefill_affinity_home_weight`` (default 1), when the history
  knows no instance holding that much of the prompt. So a proxy that routed
  the previous turn itself trusts its history; a worker or replica that did
  not (``--workers``, several replicas: each keeps its own history) assumes
  the conversation is at home, as every other router does.

The home is the instance that wins rendezvous (highest-random-weight) hashing
of the conversation key (the prompt through the end of its first non-system
message: every turn of a conversation shares it) among the routable
candidates: every worker and replica computes the same home with no
communication, and it moves only for the keys of an instance that leaves.
The first turn of a conversation is routed by history and load; a later turn
whose router has no history of it goes home unless home is busier by more
than the previous prompt. Completions have no turn structure: history only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Role and template marker words per chat message (the engine simulator counts 4 tokens per message).
CHAT_MARKERS = 4
_SEP = b"\x1f"


def _h(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p)
    return h.digest()


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return [str(v) for v in value]  # token ids
        return [w for v in value for w in _words(v)]
    if isinstance(value, dict):
        return _words(value.get("text"))  # a content part
    return []


def prompt_words(req: dict[str, Any]) -> tuple[list[str], int, int]:
    """(the prompt's words, words through the end of the first non-system chat message, words before the last
    assistant message); both counts are 0 for completions, the last one also for a chat without an answer."""
    if "prompt" in req:
        p = req["prompt"]
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            p = p[0]  # several prompts: the first one is the one whose KV goes to the decode
        return _words(p), 0, 0
    out: list[str] = []
    home_end = resume_end = 0
    messages = req.get("messages")
    for m in messages if isinstance(messages, list) else []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role", ""))
        if role == "assistant" and home_end:
            resume_end = len(out)  # the previous turn's prompt ends here
        out.extend(f"\x00<{role}|{i}>" for i in range(CHAT_MARKERS))
        out.extend(_words(m.get("content")))
        if not home_end and role not in ("system", "developer"):
            home_end = len(out)
    return out, home_end, resume_end


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt as the affinity router sees it.

    ``hashes``: chained hashes of its full blocks of ``block_tokens`` words; ``tokens``: its word count;
    ``home_key``: the conversation's rendezvous key (None for completions and prompts shorter than a block);
    ``resume_tokens``: tokens of the previous turn's prompt (before the last assistant message; 0 if none).
    """

    hashes: tuple[bytes, ...]
    tokens: int
    home_key: bytes | None
    resume_tokens: int = 0


def prompt_blocks(req: dict[str, Any], block_tokens: int) -> PromptBlocks:
    """Block hashes, size, home key and previous-turn size of request body ``req`` (completions or chat)."""
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    words, home_end, resume_end = prompt_words(req)
    salt = req.get("cache_salt")
    parent = _h(b"salt", str(salt).encode()) if isinstance(salt, str) and salt else b""
    hashes = []
    for start in range(0, len(words) - block_tokens + 1, block_tokens):
        parent = _h(parent, _SEP.join(w.encode("utf-8", "surrogatepass") for w in words[start:start + block_tokens]))
        hashes.append(parent)
    home: bytes | None = None
    if hashes and home_end:
        salted = str(salt).encode() if isinstance(salt, str) and salt else b""
        home = _h(b"home", salted, _SEP, _SEP.join(w.encode("utf-8", "surrogatepass") for w in words[:home_end]))
    return PromptBlocks(tuple(hashes), max(1, len(words)), home, resume_end)


def rendezvous(key: bytes, names: Iterable[str]) -> str | None:
    """Highest-random-weight winner among ``names`` for ``key`` (None if there are none); the same answer in
    every process for the same key and names."""
    best, best_w = None, b""
    for n in names:
        w = _h(key, b"\x00", n.encode())
        if best is None or w > best_w:
            best, best_w = n, w
    return best


class BlockLRU:
    """Block hashes the proxy expects one instance to hold, least recently routed first (at most ``capacity``)."""

    __slots__ = ("_lru", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = max(0, int(capacity))
        self._lru: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._lru

    def match(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` in the set."""
        n = 0
        while n < len(hashes) and hashes[n] in self._lru:
            n += 1
        return n

    def add(self, hashes: Sequence[bytes]) -> None:
        """Record a routed prompt's blocks (its first block the most recent) and evict beyond ``capacity``."""
        lru = self._lru
        for h in reversed(hashes):  # the engine frees a request's tail first, so it evicts it first
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity:
            lru.popitem(last=False)


@dataclass(slots=True)
class AffinitySettings:
    """The affinity router's knobs (defaults as in ``RoutingWeights``; see the module docstring).

    ``weight``: queued prompt tokens one expected cached token is worth (0 = load-only routing);
    ``home_weight``: the share of the previous turn's prompt expected at the conversation's home when the
    history does not know where it is (0 = history only); ``block_tokens``: words per block;
    ``capacity_blocks``: blocks remembered per instance.
    """

    weight: float = 1.0
    home_weight: float = 1.0
    block_tokens: int = 128
    capacity_blocks: int = 4096

    @property
    def enabled(self) -> bool:
        return self.weight > 0


class PrefixAffinity:
    """Per-instance routing history and the expected cached prefix of each candidate.

    :meth:`expected` gives, per candidate, the prompt tokens expected in its prefix cache (the pool subtracts
    them, times the weights, from the load score, and charges the chosen instance the rest of the prompt);
    :meth:`record` is called for the chosen instance. Subclasses may override :meth:`expected_hit_tokens`
    (e.g. an oracle reading the engines' caches).
    """

    def __init__(self, settings: AffinitySettings | None = None) -> None:
        self.settings = settings or AffinitySettings()
        self._tables: dict[str, BlockLRU] = {}

    def blocks(self, req: dict[str, Any]) -> PromptBlocks:
        """The request's :class:`PromptBlocks` at this router's block size."""
        return prompt_blocks(req, self.settings.block_tokens)

    def home(self, blocks: PromptBlocks, names: Iterable[str]) -> str | None:
        """The rendezvous home of ``blocks`` among candidate ``names`` (None without a home key)."""
        return rendezvous(blocks.home_key, names) if blocks.home_key is not None else None

    def _cap(self, tokens: int, blocks: PromptBlocks) -> int:
        """``tokens`` rounded down to whole blocks, at most the blocks of ``prompt - 1`` tokens (the engine's
        lookup limit)."""
        bt = self.settings.block_tokens
        return min(tokens // bt, (blocks.tokens - 1) // bt) * bt

    def expected_hit_tokens(self, name: str, blocks: PromptBlocks) -> int:
        """Prompt tokens expected in ``name``'s prefix cache from routing history (block-aligned, < tokens)."""
        table = self._tables.get(name)
        if table is None or not blocks.hashes:
            return 0
        return self._cap(table.match(blocks.hashes) * self.settings.block_tokens, blocks)

    def expected(self, blocks: PromptBlocks, names: Sequence[str]) -> dict[str, int]:
        """Expected cached prompt tokens of each candidate in ``names``: its history, and for a conversation's
        later turn that no history locates, the previous turn's prompt at the conversation's home."""
        out = {n: self.expected_hit_tokens(n, blocks) for n in names}
        hw = self.settings.home_weight
        if hw > 0 and blocks.home_key is not None and blocks.resume_tokens and names:
            guess = self._cap(int(hw * blocks.resume_tokens), blocks)
            if guess > max(out.values()):
                home = self.home(blocks, names)
                if home is not None:
                    out[home] = guess
        return out

    def record(self, name: str, blocks: PromptBlocks) -> None:
        """``name`` was chosen for this prompt: it will hold its blocks."""
        if not blocks.hashes:
            return
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = BlockLRU(self.settings.capacity_blocks)
        table.add(blocks.hashes)

    def forget(self, name: str) -> None:
        """Drop the history of an instance that left the pool."""
        self._tables.pop(name, None)

    def known_blocks(self, name: str) -> int:
        """Blocks remembered for ``name``."""
        table = self._tables.get(name)
        return len(table) if table is not None else 0
