"""Where expert load comes from: plug-in sources, one per engine instance.

A source's ``collect(session)`` returns the load routed since its previous
call as a :class:`LoadWindow` (``expert_load [L, E]`` token counts), or None
when nothing new arrived.

- :class:`HttpLoadSource`: the simulator's (or an adapter's)
  ``GET {url}/admin/expert_load?since=SEQ`` ->
  ``{"seq", "layers", "experts", "ranks", "expert_load": [[L x E]], "rank_load": [[L x R]]}``.
- :class:`DirLoadSource`: a directory of per-rank dump files (format below).

Dump directory format (one directory per instance)::

    DIR/rank_<r>.json   one file per EP rank r, rewritten atomically (temp + rename) by the dumper:
    {"rank": r, "seq": <int, increases with every dump>, "layers": L, "experts": E,
     "expert_load": [[L x E cumulative tokens this rank routed to each logical expert]]}

Counts are cumulative since the rank started; the source keeps the last dump of
each rank and returns the difference. The first dump seen, a smaller ``seq``, or any
count going down (the rank restarted) counts in full. A file that is
missing, partial, of the wrong shape or with counts that are not finite and
non-negative is skipped for this round (logged, and listed in ``skipped`` of the
source, which offline readers such as ``balance plan --history`` refuse).

Every field is checked exactly (:func:`parse_rank_dump`): ``rank``, ``seq``, ``layers`` and
``experts`` are JSON integers (not booleans, text or floats), ``rank`` equals the ``<r>`` of the
file name, ``expert_load`` is a rectangular ``layers x experts`` array of whole, finite,
non-negative numbers (``12`` or ``12.0``; token counts). A document with the engine's expert-map
keys (``moe_layer_count``/``layer_list``) is named as a map, not load.

What the engines themselves write (checked in the released code)::

    vLLM-Ascend v0.23.0  no expert-load file. Heat stays in the process: each MoE layer's
        ``moe_load`` (vllm_ascend/ops/fused_moe/fused_moe.py) is int64 ``[local slots]``, or int32
        ``[expert_heat_collection_interval, local slots]`` when that interval is > 1, tokens per
        *physical slot* of this rank; vllm_ascend/eplb/eplb_updator.py ``compute_and_set_moe_load``
        all-gathers it over the EP group into ``shared_dict["moe_load"]`` ``[L, ranks, local slots]``
        (``[interval, L, ranks, local slots]``), read by the EPLB worker process, never written out.
        The only file is the expert *map* record (``eplb_config.expert_map_record_path``, ``.json``,
        vllm_ascend/eplb/adaptor/vllm_adaptor.py ``_export_tensor_to_file``, rank 0, ``json.dump(...,
        indent=4)``, rewritten in place after every EPLB cycle): the static map format that
        :mod:`ascend_runtime.balancer.expert_map` reads.
    vLLM-Ascend v0.11.0  the same: per-layer ``moe_load`` int64 ``[local slots]``
        (vllm_ascend/ops/common_fused_moe.py), gathered to ``[L, ranks, local slots]``
        (vllm_ascend/eplb/eplb_updator.py), and the same map record
        (``additional_config.expert_map_record_path``, vllm_ascend/eplb/adaptor/vllm_adaptor.py).
    vLLM 0.23.0          no file either: ``EplbState`` (vllm/distributed/eplb/eplb_state.py) keeps
        ``expert_load_pass`` int32 ``[L, physical experts]`` and ``expert_load_window`` int32
        ``[window_size, L, physical experts]`` on the device; ``EPLBConfig`` (vllm/config/parallel.py)
        has ``window_size``, ``step_interval``, ``num_redundant_experts``, ``log_balancedness``,
        ``log_balancedness_interval``, ``use_async``, ``policy``, ``communicator`` and no key that
        saves or loads load records; ``log_balancedness`` logs only avg/max tokens per rank.

So ``rank_<r>.json`` is this kit's own format (written by ``ascend-deploy balance record`` from running
simulators, :mod:`ascend_runtime.balancer.record`, by :func:`ascend_runtime.sim.experts.record_dumps`, and by an
adapter an operator runs beside an engine); it is per *logical* expert, where the engines
count per physical slot.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import numpy as np

from ascend_runtime.files.jsondoc import parse_json
from ascend_runtime.files.read import EXPERT_DUMP, FileRefused, read_bytes

log = logging.getLogger(__name__)


@dataclass
class LoadWindow:
    """Tokens per (layer, logical expert) ``[L, E]`` from one instance since its last window."""

    instance: str
    expert_load: np.ndarray
    ranks: int | None = None


class LoadSource(Protocol):
    name: str

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None: ...


class HttpLoadSource:
    """Polls ``GET {url}/admin/expert_load?since=SEQ``; remembers the returned seq."""

    def __init__(self, name: str, url: str, timeout_s: float = 5.0) -> None:
        self.name, self.url, self.timeout_s = name, url.rstrip("/"), timeout_s
        self.seq = 0

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None:
        async with session.get(
            f"{self.url}/admin/expert_load", params={"since": str(self.seq)},
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        ) as resp:
            resp.raise_for_status()
            body: dict[str, Any] = await resp.json()
        load = np.asarray(body["expert_load"], dtype=np.float64)
        if load.shape != (int(body["layers"]), int(body["experts"])):
            raise ValueError(f"{self.name}: expert_load shape {load.shape} != layers x experts")
        self.seq = int(body["seq"])
        if load.sum() <= 0:
            return None
        return LoadWindow(self.name, load, int(body["ranks"]) if body.get("ranks") else None)


_RANK_FILE = re.compile(r"^rank_(\d+)\.json$")


def count_array(data: Any) -> np.ndarray:
    """``data`` (nested lists of JSON numbers) as a float64 array; ValueError for text, booleans, nulls or ragged lists."""
    try:
        array = np.asarray(data)
    except ValueError:
        raise ValueError("expert_load is not a rectangular array") from None
    if array.dtype.kind not in "iuf":
        raise ValueError(f"expert_load holds {'booleans' if array.dtype.kind == 'b' else 'values other than numbers'}"
                         " (ragged rows, text or nulls)")
    return array.astype(np.float64)


class DumpFormatError(ValueError):
    """A rank dump that does not follow the format; ``field`` is the key at fault ("" for the whole document)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}" if field else message)


_HEADER = ("rank", "seq", "layers", "experts")


def _json_int(doc: dict[str, Any], key: str, minimum: int) -> int:
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise DumpFormatError(key, f"must be a JSON integer, got {type(value).__name__} {str(value)[:20]!r}")
    if value < minimum:
        raise DumpFormatError(key, f"must be >= {minimum}, got {value}")
    return value


def parse_rank_dump(doc: Any, file_rank: int | None = None) -> tuple[int, int, np.ndarray]:
    """One decoded ``rank_<r>.json`` -> ``(rank, seq, expert_load [L, E] float64 cumulative tokens)``.

    Raises :class:`DumpFormatError` naming the field: not an object, an expert map instead of load,
    a missing key, a header value that is not a JSON integer (or below its minimum: rank and seq 0,
    layers and experts 1), ``rank`` other than ``file_rank``, ``expert_load`` not a rectangular
    ``layers x experts`` array of whole, finite, non-negative numbers."""
    if not isinstance(doc, dict):
        raise DumpFormatError("", f"must be a JSON object with {', '.join(_HEADER)} and expert_load, "
                                  f"got a JSON {type(doc).__name__}")
    if "layer_list" in doc or "moe_layer_count" in doc:
        raise DumpFormatError("", "is an expert map (vLLM-Ascend expert_map_record_path / expert_map_path: "
                                  "moe_layer_count, layer_list), not expert load; the engine writes no load file "
                                  "(docs/balancer.md, input formats)")
    missing = [k for k in (*_HEADER, "expert_load") if k not in doc]
    if missing:
        raise DumpFormatError(missing[0], "missing; a rank dump has rank, seq, layers, experts and expert_load")
    rank, seq = _json_int(doc, "rank", 0), _json_int(doc, "seq", 0)
    layers, experts = _json_int(doc, "layers", 1), _json_int(doc, "experts", 1)
    if file_rank is not None and rank != file_rank:
        raise DumpFormatError("rank", f"is {rank} but the file is rank_{file_rank}.json; the rank does not match "
                                      "the file name")
    try:
        cum = count_array(doc["expert_load"])
    except ValueError as exc:
        raise DumpFormatError("expert_load", str(exc).removeprefix("expert_load ")) from None
    if cum.shape != (layers, experts):
        raise DumpFormatError("expert_load", f"shape {list(cum.shape)} does not match the header layers x experts "
                                             f"[{layers}, {experts}]")
    if not np.isfinite(cum).all() or (cum < 0).any():
        raise DumpFormatError("expert_load", "holds counts that are not finite and non-negative")
    if (cum != np.floor(cum)).any():
        l, e = (int(i) for i in np.argwhere(cum != np.floor(cum))[0])
        raise DumpFormatError("expert_load", f"[{l}][{e}] = {cum[l, e]!r} is not a whole token count")
    return rank, seq, cum


class DirLoadSource:
    """Reads ``DIR/rank_<r>.json`` cumulative dumps and returns their summed deltas."""

    def __init__(self, name: str, directory: str | Path) -> None:
        self.name, self.directory = name, Path(directory)
        self._last: dict[int, tuple[int, np.ndarray]] = {}
        #: (file, reason) of every rank file the last :meth:`read` skipped
        self.skipped: list[tuple[Path, str]] = []
        #: ranks whose dump the last :meth:`read` used
        self.ranks_read: list[int] = []

    def read(self) -> LoadWindow | None:
        """Synchronous collect (the files are local)."""
        total: np.ndarray | None = None
        ranks = 0
        self.skipped, self.ranks_read = [], []
        for path in sorted(self.directory.glob("rank_*.json")):
            m = _RANK_FILE.match(path.name)
            if not m:
                continue
            try:
                try:  # the kit's reading door: a regular file of at most 64 MiB, never a FIFO or a device
                    text = read_bytes(path, EXPERT_DUMP).decode("utf-8")
                except FileRefused as exc:
                    raise DumpFormatError("", f"cannot be read: {exc}") from None
                except UnicodeDecodeError as exc:
                    raise DumpFormatError("", f"is not utf-8 text (byte {exc.start}); the dumper writes JSON") from None
                try:
                    doc = parse_json(text, path, "dump")
                except FileRefused as exc:  # a syntax error, a key twice, too deep, a number too long
                    raise DumpFormatError("", f"is not complete JSON ({exc.message}); a partial write?") from None
                rank, seq, cum = parse_rank_dump(doc, int(m.group(1)))
                if total is not None and cum.shape != total.shape:
                    raise DumpFormatError("expert_load", f"is layers x experts {list(cum.shape)}, the other ranks of "
                                                         f"{self.directory} have {list(total.shape)}")
            except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
                log.warning("%s: skipping %s: %s", self.name, path, exc)
                self.skipped.append((path, str(exc)))
                continue
            ranks += 1
            self.ranks_read.append(rank)
            prev = self._last.get(rank)
            if prev is None or seq < prev[0] or (prev[1].shape == cum.shape and (cum < prev[1]).any()):
                delta = cum  # first sight or restart: everything counted so far
            elif seq == prev[0]:
                delta = np.zeros_like(cum)
            else:
                delta = cum - prev[1] if prev[1].shape == cum.shape else cum
            self._last[rank] = (seq, cum)
            total = delta if total is None else total + delta
        if total is None or total.sum() <= 0:
            return None
        return LoadWindow(self.name, total, ranks or None)

    async def collect(self, session: aiohttp.ClientSession) -> LoadWindow | None:
        return self.read()
