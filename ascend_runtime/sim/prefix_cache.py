"""The simulated engine's automatic prefix cache, as vLLM 0.23.0's v1 KV cache manager keeps it.

Block hashes (``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens`` and
``get_request_block_hasher``, vLLM 0.23.0): a prompt is cut into full blocks of
``block_size`` tokens (the engine's ``--block-size``; a partial last block has
no hash); block ``i``'s hash is ``H(hash of block i-1, tokens of block i, extra
keys)`` with a fixed seed standing for ``NONE_HASH`` before the first block, so
a hash names the whole prefix up to the end of its block. The only extra key
the simulator has is ``cache_salt`` (on the first block only, as
``generate_block_hash_extra_keys`` adds it). ``H`` is SHA-256
(``prefix_caching_hash_algo`` defaults to ``sha256`` in vllm/config/cache.py).

Tokens (the simulator has no tokenizer, docs/simulator.md "Token accounting"):
a completion prompt's tokens are its word pieces (``\\s*\\S+``, what ``echo``
returns) or its token ids; a chat prompt is, per message, 4 role-marker tokens
then the words of its content. So a later turn of a conversation, whose
messages start with the earlier turn's messages, shares that turn's full
blocks, as a chat template's output does.

Lookup (``KVCacheManager.get_computed_blocks``): the longest run of leading
blocks that are cached, capped at ``prompt - 1`` tokens (the last prompt token
is always computed, to get logits). ``vllm:prefix_cache_queries`` counts the
prompt tokens looked up and ``vllm:prefix_cache_hits`` the tokens found
(``PrefixCacheStats.record``, vllm/v1/metrics/stats.py).

Capacity and eviction (``vllm/v1/core/block_pool.py``): cached blocks live in
the DP rank's KV cache; a block nobody uses stays cached until its room is
needed, least recently used first. A request's blocks are freed tail first
(``free_blocks(reversed(req_blocks))`` in single_type_kv_cache_manager.py), so
its first blocks are evicted last. Here each DP rank has one
:class:`PrefixCache` of at most ``capacity_blocks`` (the rank's KV tokens /
block size); an insertion evicts least recently used blocks until cached
blocks + blocks reserved by running sequences fit the rank (a block a running
sequence reuses counts twice: a conservative approximation).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

#: The seed of the first block's parent hash (vLLM's ``NONE_HASH``; fixed so runs are reproducible).
NONE_HASH = hashlib.sha256(b"ascend-sim prefix cache").digest()
#: Chat template tokens per message (role and markers), as the simulator's token accounting counts them.
CHAT_MARKERS_PER_MESSAGE = 4
_PIECE = re.compile(r"\s*\S+")
_SEP = "\x1f"


def hash_block(parent: bytes | None, tokens: Sequence[str], extra: Sequence[str] = ()) -> bytes:
    """SHA-256 of (parent hash or NONE_HASH, the block's tokens, extra keys): 32 bytes."""
    h = hashlib.sha256(parent or NONE_HASH)
    h.update(_SEP.join(tokens).encode("utf-8", "surrogatepass"))
    if extra:
        h.update(b"\x1e" + _SEP.join(extra).encode("utf-8", "surrogatepass"))
    return h.digest()


def block_hashes(tokens: Sequence[str], block_size: int, cache_salt: str | None = None) -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens`` (``len(tokens) // block_size`` of them)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    out: list[bytes] = []
    parent: bytes | None = None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra = (cache_salt,) if start == 0 and cache_salt else ()
        parent = hash_block(parent, tokens[start:start + block_size], extra)
        out.append(parent)
    return out


def _content_words(content: Any) -> list[str]:
    if isinstance(content, str):
        return content.split()
    if isinstance(content, list):  # content parts
        return [w for p in content if isinstance(p, dict) for w in str(p.get("text", "")).split()]
    return []


def chat_tokens(messages: Iterable[Any]) -> list[str]:
    """A chat prompt's tokens: per message 4 role markers, then the words of its content."""
    out: list[str] = []
    for m in messages:
        role = str(m.get("role", "")) if isinstance(m, dict) else ""
        out.extend(f"\x00<{role}|{i}>" for i in range(CHAT_MARKERS_PER_MESSAGE))
        out.extend(_content_words(m.get("content") if isinstance(m, dict) else None))
    return out


def completion_tokens(prompt: Any) -> list[str]:
    """One completion prompt's tokens: its word pieces (text) or its ids (a list of ints)."""
    if isinstance(prompt, str):
        return _PIECE.findall(prompt)
    if isinstance(prompt, list):
        return [str(i) for i in prompt]
    return []


def request_block_hashes(body: dict[str, Any], chat: bool, prompt_tokens: Sequence[int],
                         block_size: int) -> list[list[bytes]]:
    """Block hashes of every prompt of a parsed request body, in prompt order.

    ``prompt_tokens``: the engine's token count of each prompt (api.py); the token list is cut or padded to
    it so the hashes cover exactly the prompt the engine schedules.
    """
    salt = body.get("cache_salt")
    salt = salt if isinstance(salt, str) and salt else None
    if chat:
        lists = [chat_tokens(body.get("messages") or [])]
    else:
        p = body.get("prompt")
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            lists = [completion_tokens(x) for x in p]
        else:
            lists = [completion_tokens(p)]
    out = []
    for toks, n in zip(lists, prompt_tokens):
        toks = toks[:n] + [""] * max(0, n - len(toks))
        out.append(block_hashes(toks, block_size, salt))
    return out


class PrefixCache:
    """Cached block hashes of one DP rank, least recently used first.

    Units: blocks of ``block_size`` tokens. ``capacity_blocks``: the rank's KV cache in blocks.
    """

    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        if capacity_blocks < 0 or block_size < 1:
            raise ValueError(f"capacity_blocks >= 0 and block_size >= 1 needed, got {capacity_blocks}, {block_size}")
        self.capacity_blocks, self.block_size = capacity_blocks, block_size
        self._lru: OrderedDict[bytes, None] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._lru

    def match(self, hashes: Sequence[bytes], max_tokens: int) -> int:
        """Leading blocks of ``hashes`` that are cached, at most ``max_tokens`` tokens' worth; no side effect."""
        limit = min(len(hashes), max(0, max_tokens) // self.block_size)
        n = 0
        lru = self._lru
        while n < limit and hashes[n] in lru:
            n += 1
        return n

    def lookup(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Cached prompt tokens for a request being scheduled (at most ``prompt_tokens - 1``); the hit
        blocks become the most recently used."""
        n = self.match(hashes, prompt_tokens - 1)
        self._touch(hashes[:n])
        return n * self.block_size

    def insert(self, hashes: Sequence[bytes], reserved_blocks: int = 0) -> int:
        """Cache a computed prompt's blocks, its first block the most recently used; evict least recently
        used blocks until cached + ``reserved_blocks`` fit ``capacity_blocks``. Returns blocks evicted."""
        self._touch(hashes)
        room = max(0, self.capacity_blocks - max(0, reserved_blocks))
        evicted = 0
        lru = self._lru
        while len(lru) > room:
            lru.popitem(last=False)
            evicted += 1
        self.evictions += evicted
        return evicted

    def _touch(self, hashes: Sequence[bytes]) -> None:
        lru = self._lru
        for h in reversed(hashes):  # freed tail first: the tail is evicted before the head
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None

    def clear(self) -> None:
        """Forget every cached block (``reset_prefix_cache``)."""
        self._lru.clear()
