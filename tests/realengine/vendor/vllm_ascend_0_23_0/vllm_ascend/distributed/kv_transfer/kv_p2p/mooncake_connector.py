# SPDX-License-Identifier: Apache-2.0
import contextlib
import copy
import hashlib
import logging
import math
import os
import queue
import random
import struct
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import msgspec
import numpy as np
import numpy.typing as npt
import torch
import torch_npu
import zmq
from mooncake.engine import TransferEngine  # type: ignore
from vllm import envs
from vllm.config import VllmConfig
from vllm.distributed import get_pcp_group
from vllm.distributed.kv_transfer.kv_connector.utils import BlockIds
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.parallel_state import (
    get_pp_group,
    get_tensor_model_parallel_rank,
    get_tensor_model_parallel_world_size,
    get_tp_group,
)
from vllm.distributed.utils import get_pp_indices
from vllm.logger import logger
from vllm.utils.math_utils import cdiv
from vllm.utils.network_utils import get_ip, make_zmq_path, make_zmq_socket
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.request import RequestStatus

from vllm_ascend import envs as ascend_envs
from vllm_ascend.ascend_config import get_ascend_config, init_ascend_config
from vllm_ascend.distributed.kv_transfer.utils.mooncake_transfer_engine import global_te
from vllm_ascend.distributed.kv_transfer.utils.utils import (
    RegisterRegions,
    collect_storage_merged_register_regions,
    get_transfer_timeout_value,
    validate_register_region_count,
)
from vllm_ascend.distributed.utils import (
    get_decode_context_model_parallel_rank,
    get_decode_context_model_parallel_world_size,
)
from vllm_ascend.utils import enable_custom_op, enable_sfa_dcp_replicated_indexer

# isort: off
if TYPE_CHECKING:
    from vllm.v1.attention.backend import AttentionMetadata  # type: ignore
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request
# isort: on

GET_META_MSG = b"get_meta_msg"
DONE_RECVING_MSG = b"done_recving_msg"


# A busy peer can otherwise keep a global executor worker forever when the
# number of peers is larger than max_workers. Yield after a small FIFO batch so
# other peers already waiting in the global executor queue can make progress.
MAX_REQUESTS_PER_PEER_HANDLER = 5


class RemotePortInfo(TypedDict):
    num: int
    host: str


class MooncakeAgentMetadata(msgspec.Struct, omit_defaults=True, dict=True):
    engine_id: str
    te_rpc_port: int
    kv_group2layeridx: dict[int, tuple[dict[str, Any], list[int]]]
    block_size: int
    kv_caches_base_addr: list[list[int]]
    block_size_scale: list[list[int]]
    num_blocks: int
    block_lens: list[list[int]]
    block_strides: list[list[int]]
    local_ip: str = ""
    handshake_port: int = 0


@dataclass
class ReqMeta:
    local_block_ids: BlockIds
    num_external_tokens: int
    num_computed_tokens: int
    remote_block_ids: BlockIds

    remote_host: str
    remote_port: int
    remote_engine_id: str
    remote_request_id: str
    remote_pcp_size: int
    remote_dcp_size: int
    remote_ptp_size: int | None
    remote_multi_nodes_meta_mapping: dict[str, dict[str, Any]]
    num_prompt_blocks: int
    remote_block_size: int
    local_full_block_ids: BlockIds = tuple()


@dataclass(frozen=True)
class GroupPull:
    group_id: int
    remote_tp_offset: int
    num_group_pulls: int
    prefill_pp_rank: int = 0
    is_group_transfer_end: bool = False


@dataclass(frozen=True)
class GroupTransferInfo:
    tokens_per_block: int
    blocks_per_window: int
    is_state_group: bool


@dataclass
class SizedDict(OrderedDict):
    def __init__(self, max_size=16000, *args, **kwargs):
        self.max_size = max_size
        super().__init__(*args, **kwargs)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if len(self) > self.max_size:
            self.popitem(last=False)

    def __getitem__(self, key):
        try:
            return super().__getitem__(key)
        except KeyError:
            value: dict[int, list[int]] = {}
            self[key] = value
            return value


class KVCacheTaskTracker:
    def __init__(self):
        super().__init__()

        self.done_task_lock = threading.Lock()
        self.finished_requests: set[str] = set()
        # Only used in prefill node. Tracks requests whose kv blocks freeing is
        # intentionally delayed. Each entry is a tuple of (request_id,
        # timestamp). If a request remains in this queue for too long, it will
        # be force-freed.
        self.delayed_free_requests: OrderedDict[str, float] = OrderedDict()
        self.reqs_to_process: set[str] = set()

    def add_req_to_process(self, request_id: str):
        self.reqs_to_process.add(request_id)

    def add_not_transfer_request(self, request_id: str):
        with self.done_task_lock:
            self.finished_requests.add(request_id)
            self.reqs_to_process.discard(request_id)

    def update_done_task_count(self, request_id: str):
        with self.done_task_lock:
            if request_id in self.reqs_to_process:
                self.finished_requests.add(request_id)
                self.reqs_to_process.discard(request_id)
                self.delayed_free_requests.pop(request_id, None)
            else:
                logger.warning(
                    "MooncakeConnector finish req not in reqs to process. "
                    "request_id=%s. "
                    "Possible cause: Request was already completed or not properly tracked. "
                    "Check: Verify request lifecycle and tracking logic.",
                    request_id,
                )

    def get_and_clear_finished_requests(self) -> set[str]:
        """
        Get and clear the requests that have been completed.
        Returns:
            A set of request IDs that have been completed.
        """
        with self.done_task_lock:
            finished_requests = self.finished_requests.copy()
            expired_requests = self._retrieve_expired_requests()
            finished_requests.update(expired_requests)
            self.finished_requests.clear()
        return finished_requests

    def add_delayed_request(self, request_id: str, delay_start_time: float):
        """Add a delayed free request."""
        with self.done_task_lock:
            if request_id in self.reqs_to_process:
                self.delayed_free_requests[request_id] = delay_start_time

    def _retrieve_expired_requests(self):
        """Retrieve all expired delayed requests."""
        expired_requests: set[str] = set()
        # Free delayed requests if they exceed the timeout
        current_time = time.time()
        while self.delayed_free_requests:
            request_id = next(iter(self.delayed_free_requests))
            delay_start_time = self.delayed_free_requests[request_id]
            if current_time - delay_start_time > envs.VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT:
                self.delayed_free_requests.popitem(last=False)
                self.reqs_to_process.discard(request_id)
                expired_requests.add(request_id)
                logger.error(
                    "Force freed expired request: %s. "
                    "Reason: Request exceeded timeout threshold (%s seconds). "
                    "Action: Resources have been forcibly released to prevent memory leak.",
                    request_id,
                    envs.VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT,
                )
            else:
                break
        return expired_requests


class KVCacheSendingThread(threading.Thread):
    def __init__(
        self,
        vllm_config: VllmConfig,
        tp_rank: int,
        prefill_tp_size: int,
        local_engine_id: str,
        side_channel_host: str,
        side_channel_port: int,
        metadata: MooncakeAgentMetadata,
        ready_event: threading.Event,
        kv_caches: dict[str, Any],
        pcp_rank: int,
    ):
        super().__init__(daemon=True, name="KVCacheSendingThread")
        self.tp_rank = tp_rank
        self.prefill_tp_size = prefill_tp_size
        self.pp_rank = get_pp_group().rank_in_group
        self.pcp_size = get_pcp_group().world_size
        self.pp_size = vllm_config.parallel_config.pipeline_parallel_size
        self.tp_size = get_tensor_model_parallel_world_size()
        self.local_engine_id = local_engine_id
        self.side_channel_host = side_channel_host
        self.side_channel_port = side_channel_port
        self.metadata = metadata
        self.ready_event = ready_event
        self.kv_caches = kv_caches
        self.pcp_rank = pcp_rank
        self.port_send_num: dict[str, int] = {}

        self.task_tracker = KVCacheTaskTracker()

    def get_and_clear_finished_requests(self) -> set[str]:
        """
        Get and clear the requests that have been completed.
        Returns:
            A set of request IDs that have been completed.
        """
        return self.task_tracker.get_and_clear_finished_requests()

    def add_not_transfer_request(self, request_id: str):
        self.task_tracker.add_not_transfer_request(request_id)

    def add_delayed_request(self, request_id: str, delay_start_time: float):
        return self.task_tracker.add_delayed_request(request_id, delay_start_time)

    def run(self):
        """Run the thread to handle KV cache transfer requests."""
        try:
            # Listen for new requests for metadata. NOTE(rob): we need each rank
            # to have a unique port. This hack to keeps us moving. We will
            # switch when moving to etcd or where we have a single ZMQ socket in
            # the scheduler.
            device_index = (self.pp_rank * self.pcp_size + self.pcp_rank) * self.tp_size + self.tp_rank
            handshake_port = self.side_channel_port + device_index
            path = make_zmq_path("tcp", self.side_channel_host, handshake_port)
            logger.info(
                "KVCacheSendingThread started listening on path: %s. Thread: tp_rank=%d, pp_rank=%d, pcp_rank=%d",
                path,
                self.tp_rank,
                self.pp_rank,
                self.pcp_rank,
            )
            with zmq_ctx(zmq.ROUTER, path) as sock:  # type: ignore
                self.ready_event.set()
                self.run_busy_loop(sock)
        except Exception as e:
            logger.exception(
                "Mooncake KVCacheSendingThread encountered exception. "
                "Thread: tp_rank=%d, pp_rank=%d, listening_path=%s. "
                "Error: %s",
                self.tp_rank,
                self.pp_rank,
                path,
                e,
            )

    def run_busy_loop(self, sock: zmq.Socket):  # type: ignore
        encoder = msgspec.msgpack.Encoder()
        encoded_data = encoder.encode(self.metadata)
        size_in_bytes = len(encoded_data)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("Size of encoded MooncakeAgentMetadata: %s bytes", str(size_in_bytes))

        decoder = msgspec.msgpack.Decoder(type=tuple)
        while True:
            try:
                frames = sock.recv_multipart()
                if len(frames) < 2:
                    logger.error(
                        "Invalid message format in KVCacheSendingThread. "
                        "Expected: at least 2 frames (identity + payload). "
                        "Actual: %d frames. "
                        "Frames: %s. "
                        "Check: Verify message sender implementation.",
                        len(frames),
                        frames,
                    )
                    continue

                identity = frames[0]
                payload = [f for f in frames[1:] if f != b""]
                if len(payload) != 1:
                    logger.error(
                        "Invalid message format in KVCacheSendingThread. "
                        "Expected: exactly 1 payload frame. "
                        "Actual: %d payload frames. "
                        "Frames: %s. "
                        "Check: Verify message sender removes empty frames correctly.",
                        len(payload),
                        frames,
                    )
                    continue

                msg = decoder.decode(payload[0])
                if msg[0] == GET_META_MSG:
                    sock.send_multipart((identity, b"", encoded_data))
                elif msg[0] == DONE_RECVING_MSG:
                    logger.debug("Got DONE_RECVING_MSG for request %s", msg[1])
                    request_id = msg[1]
                    remote_port_send_num = msg[2]
                    if remote_port_send_num:
                        if request_id not in self.port_send_num:
                            self.port_send_num[request_id] = 0
                        self.port_send_num[request_id] += 1
                        device_index = (self.pp_rank * self.pcp_size + self.pcp_rank) * self.tp_size + self.tp_rank
                        handshake_port = self.side_channel_port + device_index
                        if self.port_send_num[request_id] >= remote_port_send_num[handshake_port]["num"]:
                            self.task_tracker.update_done_task_count(request_id)
                            del self.port_send_num[request_id]
                    else:
                        self.task_tracker.update_done_task_count(request_id)
                    # Acknowledge the request completion.
                    while True:
                        try:
                            # Send ACK to the sender.
                            sock.send_multipart((identity, b"", b"ACK"), flags=zmq.NOBLOCK)  # type: ignore
                            break
                        except zmq.Again:  # type: ignore
                            # If the socket is not ready, retry sending.
                            logger.debug("Socket not ready, retrying to send ACK for request %s", msg[1])
                            time.sleep(0.01)
                else:
                    logger.error(
                        "Connection listener received unexpected message type. "
                        "Expected: GET_META_MSG or DONE_RECVING_MSG. "
                        "Actual: %s. "
                        "Full message: %s. "
                        "Check: Verify message protocol implementation.",
                        msg[0] if msg else "empty",
                        msg,
                    )
            except Exception as e:
                logger.error(
                    "Connection listener encountered exception during message processing. "
                    "Exception type: %s. "
                    "Error: %s. "
                    "Context: Processing frames from socket. "
                    "Check: Review message handling logic and socket state.",
                    type(e).__name__,
                    e,
                )


class KVCacheRecvingThread(threading.Thread):
    def __init__(
        self,
        tp_rank: int,
        tp_size: int,
        _prefill_pp_size: int,
        engine: TransferEngine,
        local_engine_id: str,
        local_handshake_port: int,
        side_channel_port: int,
        local_kv_caches_base_addr: list[list[int]],
        block_len_per_addr: list[list[int]],
        block_stride_per_addr: list[list[int]],
        is_hma_required=False,
        ready_event: threading.Event | None = None,
        vllm_config: VllmConfig | None = None,
        kv_caches: dict[str, Any] | None = None,
        prefill_pp_layer_partition: str | None = None,
        kv_group2layeridx: dict[int, tuple[dict[str, Any], list[int]]] | None = None,
        block_size_scale: list[list[int]] | None = None,
    ):
        super().__init__(daemon=True, name="KVCacheRecvingThread")
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self._prefill_pp_size = _prefill_pp_size
        self.local_engine_id = local_engine_id
        self.local_handshake_port = local_handshake_port
        self.side_channel_port = side_channel_port
        self.engine = engine
        if ready_event is None:
            ready_event = threading.Event()
        self.ready_event = ready_event

        if kv_caches is None:
            kv_caches = {}
        self.kv_caches = kv_caches
        self.kv_caches_base_addr: dict[str, dict[int, list[list[int]]]] = SizedDict()
        self.kv_caches_base_addr[local_engine_id][local_handshake_port] = local_kv_caches_base_addr
        self.block_len_per_addr = block_len_per_addr
        self.block_stride_per_addr = block_stride_per_addr
        if kv_group2layeridx is None:
            kv_group2layeridx = {}
        self.kv_group2layeridx = kv_group2layeridx
        self.group_compress_ratios: dict[int, int] = {}
        for group_id, (group_spec, _) in self.kv_group2layeridx.items():
            compress_ratio = 1
            kv_cache_spec = group_spec.get("kv_cache_spec")
            if isinstance(kv_cache_spec, dict):
                for spec in kv_cache_spec.values():
                    if isinstance(spec, dict) and isinstance(spec.get("compress_ratio"), int):
                        compress_ratio = max(1, spec["compress_ratio"])
                        break
            self.group_compress_ratios[group_id] = compress_ratio
        self.remote_te_port: dict[str, dict[int, int]] = SizedDict()
        self.remote_block_size_scale: dict[str, dict[int, list[list[int]]]] = SizedDict()
        self.remote_block_stride_per_addr: dict[str, dict[int, list[list[int]]]] = SizedDict()
        self.remote_kv_group2layeridx: dict[str, dict[int, dict[int, tuple[dict[str, Any], list[int]]]]] = SizedDict()
        self.remote_metadata_lock = threading.Lock()
        # Reformat metadata keyed by request_id then CP shard index. Populated by the
        # last TP-offset pull task for each shard; applied once all pull tasks finish.
        self.pending_reformat: defaultdict[str, dict[int, list[tuple[int, list[list[int]], int, list[int]]]]] = (
            defaultdict(dict)
        )
        self.pending_reformat_lock = threading.Lock()

        self.request_queue: queue.Queue[Any] = queue.Queue()
        first_kv_cache = next(iter(self.kv_caches.values()), None)
        if first_kv_cache is None:
            self.executor = ThreadPoolExecutor(max_workers=32)
        else:
            # NPU device selection is thread-local. Executor workers do not
            # inherit the device selected by the model worker thread and would
            # otherwise use device 0 on their first NPU operation.
            kv_cache_device = first_kv_cache[0].device
            self.executor = ThreadPoolExecutor(
                max_workers=32,
                initializer=torch.npu.set_device,
                initargs=(kv_cache_device,),
            )
        self.peer_request_queues: defaultdict[tuple[str, int], deque[dict[str, Any]]] = defaultdict(deque)
        self.active_peer_request_handlers: set[tuple[str, int]] = set()
        self.peer_request_queues_lock = threading.Lock()
        self.request_task_counts: defaultdict[str, int] = defaultdict(int)
        self.finished_request_markers: set[str] = set()
        self.request_task_counts_lock = threading.Lock()

        self.task_tracker = KVCacheTaskTracker()

        self.encoder = msgspec.msgpack.Encoder()
        self.decoder = msgspec.msgpack.Decoder(MooncakeAgentMetadata)
        self.remote_sockets_lock = threading.Lock()
        self.remote_sockets: dict[  # type: ignore
            str, deque[zmq.Socket]
        ] = defaultdict(  # type: ignore
            deque
        )
        self.timeout = 1.0  # seconds

        assert vllm_config is not None
        self.vllm_config: VllmConfig = vllm_config
        self.model_config = self.vllm_config.model_config
        self.num_speculative_tokens = (
            self.vllm_config.speculative_config.num_speculative_tokens
            if self.vllm_config.speculative_config is not None
            else 0
        )
        self.use_mla = self.model_config.is_deepseek_mla
        self.enable_sfa_dcp_replicated_indexer = enable_sfa_dcp_replicated_indexer(self.vllm_config)
        self.is_hma_required = is_hma_required
        self.block_size = self.vllm_config.cache_config.block_size
        try:
            hf_text_config = self.model_config.hf_text_config
            if hf_text_config is None:
                raise AttributeError
        except AttributeError:
            hf_text_config = self.model_config.hf_config
        self.num_layers = hf_text_config.num_hidden_layers
        if block_size_scale is None:
            block_size_scale = []
        self.block_size_scale = block_size_scale
        self.pp_layer_indices = {
            rank: get_prefill_pp_indices(self.num_layers, rank, self._prefill_pp_size, prefill_pp_layer_partition)
            for rank in range(self._prefill_pp_size)
        }
        self.proc_not_transfer_request: dict[str, bool] = {}
        self.proc_not_transfer_request_lock = threading.Lock()
        self.failed_recv_requests: set[str] = set()
        self.invalid_block_ids: set[int] = set()
        self.failed_recv_requests_lock = threading.Lock()

        self.num_draft_layers = 0
        if self.vllm_config.speculative_config is not None:
            if self.vllm_config.speculative_config.method == "mtp":
                # all MTP layer use the same kv cache layer, so only need to transfer once
                self.num_draft_layers = 1
            elif (
                hasattr(self.vllm_config.speculative_config.draft_model_config, "hf_config")
                and getattr(self.vllm_config.speculative_config.draft_model_config.hf_config, "num_hidden_layers", None)
                is not None
            ):
                self.num_draft_layers = (
                    self.vllm_config.speculative_config.draft_model_config.hf_config.num_hidden_layers
                )

    def add_request(
        self,
        request_id: str,
        remote_request_id: str,
        local_block_ids: BlockIds,
        remote_block_ids: BlockIds,
        group_pulls: list[GroupPull],
        remote_engine_id: str,
        remote_host: str,
        remote_handshake_port: int,
        remote_block_size=None,
        remote_port_send_num: dict[int, RemotePortInfo] | None = None,
        num_computed_tokens: int = 0,
        all_task_done: bool = False,
        shard_idx: int = 0,
        local_block_ids_replicate_k: BlockIds | None = None,
        remote_block_ids_replicate_k: BlockIds | None = None,
    ):
        """Add a new request to the queue for processing."""
        if remote_port_send_num is None:
            remote_port_send_num = {}
        trans_info = {
            "request_id": request_id,
            "local_block_ids": local_block_ids,
            "remote_block_ids": remote_block_ids,
            "local_block_ids_replicate_k": local_block_ids_replicate_k or tuple(),
            "remote_block_ids_replicate_k": remote_block_ids_replicate_k or tuple(),
            "group_pulls": group_pulls,
            "remote_engine_id": remote_engine_id,
            "remote_request_id": remote_request_id,
            "remote_host": remote_host,
            "remote_handshake_port": remote_handshake_port,
            "num_computed_tokens": num_computed_tokens,
            "remote_port_send_num": remote_port_send_num,
            "all_task_done": all_task_done,
            "shard_idx": shard_idx,
            "remote_block_size": remote_block_size,
        }
        logger.debug("Adding request %s to the queue.Trans info:%s", request_id, trans_info)
        self.request_queue.put(trans_info)

    def get_and_clear_finished_requests(self) -> set[str]:
        """
        Get and clear the requests that have been completed.
        Returns:
            A set of request IDs that have been completed.
        """
        return self.task_tracker.get_and_clear_finished_requests()

    def get_and_clear_invalid_block_ids(self) -> set[int]:
        """Get and clear block ids that failed to load."""
        with self.failed_recv_requests_lock:
            invalid_block_ids = self.invalid_block_ids
            self.invalid_block_ids = set()
        return invalid_block_ids

    def _is_failed_recv_request(self, request_id: str) -> bool:
        with self.failed_recv_requests_lock:
            return request_id in self.failed_recv_requests

    def _mark_failed_recv_request(self, request_id: str, local_block_ids: BlockIds) -> None:
        with self.failed_recv_requests_lock:
            self.failed_recv_requests.add(request_id)
            self.invalid_block_ids.update(local_block_ids[0])

    def _clear_failed_recv_request(self, request_id: str) -> None:
        with self.failed_recv_requests_lock:
            self.failed_recv_requests.discard(request_id)

    def run(self):
        """Run the thread to handle KV cache transfer requests."""
        self.ready_event.set()
        while True:
            try:
                request_data = self.request_queue.get()
                if request_data is None:
                    logger.warning("Received a None request. ")
                    self.request_queue.task_done()
                    continue
                self._submit_request(request_data)
            except Exception as e:
                logger.error("Error in KVCacheTransferThread. error=%s. ", e)

    def _submit_request(self, request_data: dict[str, Any]) -> None:
        peer_key = (request_data["remote_host"], request_data["remote_handshake_port"])
        self._mark_request_task_submitted(request_data)
        should_start_worker = False
        with self.peer_request_queues_lock:
            self.peer_request_queues[peer_key].append(request_data)
            if peer_key not in self.active_peer_request_handlers:
                self.active_peer_request_handlers.add(peer_key)
                should_start_worker = True

        if should_start_worker:
            self.executor.submit(self._handle_peer_requests, peer_key)

    def _handle_peer_requests(self, peer_key: tuple[str, int]) -> None:
        requests_handled = 0
        while requests_handled < MAX_REQUESTS_PER_PEER_HANDLER:
            with self.peer_request_queues_lock:
                peer_queue = self.peer_request_queues.get(peer_key)
                if not peer_queue:
                    self.peer_request_queues.pop(peer_key, None)
                    self.active_peer_request_handlers.discard(peer_key)
                    return
                req_meta = peer_queue.popleft()

            requests_handled += 1
            try:
                self._handle_request(req_meta)
            except Exception:
                logger.exception(
                    "Error handling KV cache transfer request for peer %s:%d.",
                    peer_key[0],
                    peer_key[1],
                )

        should_resubmit = False
        with self.peer_request_queues_lock:
            peer_queue = self.peer_request_queues.get(peer_key)
            if peer_queue:
                should_resubmit = True
            else:
                self.peer_request_queues.pop(peer_key, None)
                self.active_peer_request_handlers.discard(peer_key)

        if should_resubmit:
            self.executor.submit(self._handle_peer_requests, peer_key)

    def _mark_request_task_submitted(self, req_meta: dict[str, Any]) -> None:
        request_id = req_meta["request_id"]
        with self.request_task_counts_lock:
            self.request_task_counts[request_id] += 1
            if req_meta["all_task_done"]:
                self.finished_request_markers.add(request_id)

    def _mark_request_task_done(self, request_id: str, all_task_done: bool) -> bool:
        with self.request_task_counts_lock:
            pending_count = self.request_task_counts.get(request_id)
            if pending_count is None:
                return all_task_done

            pending_count -= 1
            if pending_count > 0:
                self.request_task_counts[request_id] = pending_count
                return False

            self.request_task_counts.pop(request_id, None)
            has_finished_marker = request_id in self.finished_request_markers
            self.finished_request_markers.discard(request_id)
            return has_finished_marker

    def _handle_request(self, req_meta: dict[str, Any]):
        request_id = req_meta["request_id"]
        remote_request_id = req_meta["remote_request_id"]
        remote_host = req_meta["remote_host"]
        remote_handshake_port = req_meta["remote_handshake_port"]
        remote_port_send_num = req_meta["remote_port_send_num"]
        all_task_done = req_meta["all_task_done"]
        transfer_failed = self._is_failed_recv_request(request_id)

        try:
            if transfer_failed:
                self._mark_failed_recv_request(request_id, req_meta["local_block_ids"])
                logger.warning("Skipping KV cache transfer for request. remote_request_id=%s. ", remote_request_id)
            else:
                try:
                    logger.debug("Starting to transfer KV cache for request %s.", remote_request_id)
                    self._transfer_kv_cache_all_groups(req_meta)
                    logger.debug("Finished transferring KV cache for request %s.", remote_request_id)
                except Exception as e:
                    transfer_failed = True
                    self._mark_failed_recv_request(request_id, req_meta["local_block_ids"])
                    logger.exception("Failed to transfer KV cache for request %s: %s", remote_request_id, e)
        finally:
            all_tasks_done = self._mark_request_task_done(request_id, all_task_done)
            if all_tasks_done:
                if transfer_failed or self._is_failed_recv_request(request_id):
                    with self.pending_reformat_lock:
                        self.pending_reformat.pop(request_id, None)
                else:
                    try:
                        self._reformat_pending_kv_caches(request_id)
                    except Exception as e:
                        transfer_failed = True
                        self._mark_failed_recv_request(request_id, req_meta["local_block_ids"])
                        with self.pending_reformat_lock:
                            self.pending_reformat.pop(request_id, None)
                        logger.exception(
                            "Failed to reformat KV cache after all pulls for request %s: %s",
                            remote_request_id,
                            e,
                        )
                self.task_tracker.update_done_task_count(request_id)
                with self.proc_not_transfer_request_lock:
                    self.proc_not_transfer_request.pop(remote_request_id, None)
                self._clear_failed_recv_request(request_id)
            self.request_queue.task_done()
            self._send_done_signal_to_free_remote_port(remote_request_id, remote_host, remote_port_send_num)
            # Always send the done signal to the remote host to ensure proper
            # resource cleanup. Failing to do so may cause a memory leak on the
            # remote host.
            self._send_done_recv_signal(remote_request_id, remote_host, remote_handshake_port, remote_port_send_num)

    def _send_done_signal_to_free_remote_port(
        self, request_id: str, remote_host: str, remote_port_send_num: dict[int, RemotePortInfo]
    ):
        if self.side_channel_port != self.local_handshake_port or not remote_port_send_num:
            return
        with self.proc_not_transfer_request_lock:
            if request_id not in self.proc_not_transfer_request:
                self.proc_not_transfer_request[request_id] = True
            should_send = self.proc_not_transfer_request[request_id]
            if should_send:
                self.proc_not_transfer_request[request_id] = False
        if should_send:
            for remote_port in remote_port_send_num:
                if remote_port_send_num[remote_port]["num"] == 0:
                    remote_host_ = remote_port_send_num[remote_port]["host"]
                    self._send_done_recv_signal(request_id, remote_host_, remote_port, remote_port_send_num)

    def _transfer_kv_cache_all_groups(self, req_meta: dict[str, Any]):
        """Handle a KV cache transfer request."""
        remote_request_id = req_meta["remote_request_id"]
        local_block_ids: BlockIds = req_meta["local_block_ids"]
        remote_block_ids: BlockIds = req_meta["remote_block_ids"]
        local_block_ids_replicate_k: BlockIds = req_meta.get("local_block_ids_replicate_k", tuple())
        remote_block_ids_replicate_k: BlockIds = req_meta.get("remote_block_ids_replicate_k", tuple())
        has_replicate_k_blocks = any(local_block_ids_replicate_k) and any(remote_block_ids_replicate_k)
        group_pulls: list[GroupPull] = req_meta["group_pulls"]
        remote_engine_id = req_meta["remote_engine_id"]
        remote_host = req_meta["remote_host"]
        remote_handshake_port = req_meta["remote_handshake_port"]
        # Full prefix cache hit: do not need to read remote blocks, just notify
        # P worker that we have the blocks we need.
        num_local_blocks = sum(len(group_block_ids) for group_block_ids in local_block_ids)
        if num_local_blocks == 0 and not has_replicate_k_blocks:
            return

        # Check if we have the remote metadata cached.
        with self.remote_metadata_lock:
            has_remote_metadata = (
                remote_engine_id in self.kv_caches_base_addr
                and remote_handshake_port in self.kv_caches_base_addr[remote_engine_id]
            )
        if not has_remote_metadata:
            self._get_remote_metadata(remote_host, remote_handshake_port)
        with self.remote_metadata_lock:
            remote_kv_caches_base_addrs = self.kv_caches_base_addr[remote_engine_id][remote_handshake_port]
            local_kv_caches_base_addrs = self.kv_caches_base_addr[self.local_engine_id][self.local_handshake_port]
            remote_transfer_port = self.remote_te_port[remote_engine_id][remote_handshake_port]
            remote_block_stride_per_addr = self.remote_block_stride_per_addr[remote_engine_id][remote_handshake_port]
        session_id = f"{remote_host}:{remote_transfer_port}"

        req_start_time = time.perf_counter()
        src_list: list[int] = []
        dst_list: list[int] = []
        length_list: list[int] = []
        attention_group_reformat_block_ids: list[tuple[tuple[int, list[list[int]], int, list[int]], bool]] = []
        grouped_remote_k_block_ids: list[list[int]] = []
        grouped_local_k_block_ids: list[list[int]] = []
        if self.enable_sfa_dcp_replicated_indexer and has_replicate_k_blocks:
            grouped_remote_k_block_ids, grouped_local_k_block_ids = group_concurrent_contiguous(
                remote_block_ids_replicate_k[0],
                local_block_ids_replicate_k[0],
            )

        def pp_layer_indices(layer_indices: list[int], prefill_pp_rank: int) -> list[int]:
            first_layer_index, end_layer_index = self.pp_layer_indices[prefill_pp_rank]
            if self.vllm_config.speculative_config is not None and prefill_pp_rank == self._prefill_pp_size - 1:
                end_layer_index += self.num_draft_layers
            return [layer_idx for layer_idx in layer_indices if first_layer_index <= layer_idx < end_layer_index]

        for group_pull in group_pulls:
            group_idx = group_pull.group_id
            group_spec, layer_indices = self.kv_group2layeridx[group_idx]
            kv_cache_group_id = group_spec.get("kv_cache_group_id", group_idx)
            layer_indices = pp_layer_indices(layer_indices, group_pull.prefill_pp_rank)
            if not layer_indices:
                continue
            tp_num_need_pulls = group_pull.num_group_pulls
            inner_offset = group_pull.remote_tp_offset
            is_mamba_group = group_spec["kv_cache_spec_type"] == "MambaSpec"
            local_group_block_ids = local_block_ids[kv_cache_group_id]
            remote_group_block_ids = remote_block_ids[kv_cache_group_id]
            has_group_blocks = bool(local_group_block_ids)
            if not has_group_blocks and (is_mamba_group or not has_replicate_k_blocks):
                continue
            if not is_mamba_group:
                grouped_remote_block_ids: list[list[int]] = []
                grouped_local_block_ids: list[list[int]] = []
                if has_group_blocks:
                    is_group_transfer_end = group_pull.is_group_transfer_end
                    # Block ids are already expanded to kernel granularity and truncated in
                    # _get_kv_split_metadata, so consume them directly here.
                    kernel_remote_block_ids = remote_group_block_ids
                    kernel_local_block_ids = local_group_block_ids

                    if tp_num_need_pulls == 1:
                        grouped_remote_block_ids, grouped_local_block_ids = group_concurrent_contiguous(
                            kernel_remote_block_ids, kernel_local_block_ids
                        )
                    else:
                        grouped_remote_block_ids = [[block_id] for block_id in kernel_remote_block_ids]
                        grouped_local_block_ids = [[block_id] for block_id in kernel_local_block_ids]
                    attention_group_reformat_block_ids.append(
                        (
                            (group_idx, grouped_local_block_ids, tp_num_need_pulls, layer_indices),
                            is_group_transfer_end,
                        )
                    )
            else:
                # When Prefix Caching is enabled on both P and D nodes, num_block should not be forced to match,
                # as the D-node requires dynamic allocation based on its specific cache hit rate.
                transfer_block_idx = len(remote_group_block_ids) - self.num_speculative_tokens - 1
                grouped_remote_block_ids = [[remote_group_block_ids[transfer_block_idx]]]
                grouped_local_block_ids = [[local_group_block_ids[0]]]

            if is_mamba_group:
                for layer_idx in layer_indices:
                    start_meta_idx = len(src_list)
                    self._append_mamba_transfer_meta(
                        src_list,
                        dst_list,
                        length_list,
                        group_spec=group_spec,
                        src_layer_base_addr=local_kv_caches_base_addrs[layer_idx],
                        dst_layer_base_addr=remote_kv_caches_base_addrs[layer_idx],
                        block_len=self.block_len_per_addr[layer_idx],
                        block_stride=self.block_stride_per_addr[layer_idx],
                        remote_block_stride=remote_block_stride_per_addr[layer_idx],
                        remote_block_id=grouped_remote_block_ids[0][0],
                        local_block_id=grouped_local_block_ids[0][0],
                        tp_num_need_pulls=tp_num_need_pulls,
                        remote_tp_offset=inner_offset,
                    )
                    if logger.isEnabledFor(logging.DEBUG):
                        for src, dst, length in zip(
                            src_list[start_meta_idx:], dst_list[start_meta_idx:], length_list[start_meta_idx:]
                        ):
                            logger.debug(
                                "Mooncake mamba transfer meta: request_id=%s group_idx=%s layer_idx=%s "
                                "local_block_id=%s remote_block_id=%s tp_num_need_pulls=%s "
                                "remote_tp_offset=%s  session_id=%s",
                                remote_request_id,
                                group_idx,
                                layer_idx,
                                grouped_local_block_ids[0][0],
                                grouped_remote_block_ids[0][0],
                                tp_num_need_pulls,
                                inner_offset,
                                session_id,
                            )
                continue

            for layer_idx in layer_indices:
                for cache_idx in range(len(local_kv_caches_base_addrs[layer_idx])):
                    src_layer_base_addr = local_kv_caches_base_addrs[layer_idx][cache_idx]
                    dst_layer_base_addr = remote_kv_caches_base_addrs[layer_idx][cache_idx]
                    block_len = self.block_len_per_addr[layer_idx][cache_idx]
                    block_stride = self.block_stride_per_addr[layer_idx][cache_idx]
                    remote_block_stride = remote_block_stride_per_addr[layer_idx][cache_idx]
                    inner_block_len = block_len // tp_num_need_pulls
                    if self.enable_sfa_dcp_replicated_indexer and self.block_size_scale[layer_idx][cache_idx] > 1:
                        if has_replicate_k_blocks:
                            transfer_remote_block_ids = grouped_remote_k_block_ids
                            transfer_local_block_ids = grouped_local_k_block_ids
                        else:
                            continue
                    else:
                        if not has_group_blocks:
                            continue
                        transfer_remote_block_ids, transfer_local_block_ids = split_if_not_byte_contiguous(
                            grouped_remote_block_ids,
                            grouped_local_block_ids,
                            src_block_stride=remote_block_stride,
                            dst_block_stride=block_stride,
                            block_len=inner_block_len,
                        )
                    for remote_block_id, local_block_id in zip(transfer_remote_block_ids, transfer_local_block_ids):
                        src = src_layer_base_addr + local_block_id[0] * block_stride + inner_offset * inner_block_len
                        dst = dst_layer_base_addr + remote_block_id[0] * remote_block_stride
                        length = inner_block_len * len(local_block_id)
                        src_list.append(src)
                        dst_list.append(dst)
                        length_list.append(length)
                    logger.debug(
                        "Mooncake kv transfer meta: request_id=%s group_idx=%s layer_idx=%s local_block_ids=%s "
                        "remote_block_ids=%s tp_num_need_pulls=%s remote_tp_offset=%s session_id=%s",
                        remote_request_id,
                        group_idx,
                        layer_idx,
                        grouped_local_block_ids,
                        grouped_remote_block_ids,
                        tp_num_need_pulls,
                        inner_offset,
                        session_id,
                    )
        if not src_list:
            return

        logger.debug(
            "Mooncake transfer request=%s session id=%s src=%s dst=%s length=%s",
            remote_request_id,
            session_id,
            src_list,
            dst_list,
            length_list,
        )
        ret = self.engine.batch_transfer_sync_read(session_id, src_list, dst_list, length_list)
        if ret < 0:
            logger.error(
                "Mooncake transfer failed for request. remote_request_id=%s, ret=%d. ",
                req_meta["remote_request_id"],
                ret,
            )
            raise RuntimeError(f"Mooncake transfer failed, ret: {ret}")

        req_end_time = time.perf_counter()
        req_transfer_elapsed = (req_end_time - req_start_time) * 1000
        logger.info(
            "KV cache transfer for request %s took %.2f ms. local_ip %s local_device_id %s remote_session_id %s",
            remote_request_id,
            req_transfer_elapsed,
            get_ip(),
            self.tp_rank,
            session_id,
        )

        ready_attention_group_reformat_block_ids = []
        for reformat_group, is_group_transfer_end in attention_group_reformat_block_ids:
            if is_group_transfer_end:
                ready_attention_group_reformat_block_ids.append(reformat_group)
        if ready_attention_group_reformat_block_ids:
            shard_idx = int(req_meta.get("shard_idx", 0))
            self._stash_pending_reformat(
                req_meta["request_id"],
                shard_idx,
                ready_attention_group_reformat_block_ids,
            )

    def _stash_pending_reformat(
        self,
        request_id: str,
        shard_idx: int,
        ready_attention_group_reformat_block_ids: list[tuple[int, list[list[int]], int, list[int]]],
    ) -> None:
        with self.pending_reformat_lock:
            self.pending_reformat[request_id][shard_idx] = ready_attention_group_reformat_block_ids

    def _reformat_pending_kv_caches(self, request_id: str) -> None:
        with self.pending_reformat_lock:
            shard_reformats = self.pending_reformat.pop(request_id, {})
        for shard_idx in sorted(shard_reformats):
            logger.debug(
                "Reformatting KV cache after all pulls completed. request_id=%s shard_idx=%s",
                request_id,
                shard_idx,
            )
            self._apply_kv_cache_reformat(shard_reformats[shard_idx])

    def _apply_kv_cache_reformat(
        self,
        ready_attention_group_reformat_block_ids: list[tuple[int, list[list[int]], int, list[int]]],
    ) -> None:
        if not ready_attention_group_reformat_block_ids:
            return

        gqa_reformat_groups = [
            (group_idx, grouped_local_block_ids, num_group_pulls, layer_indices)
            for (
                group_idx,
                grouped_local_block_ids,
                num_group_pulls,
                layer_indices,
            ) in ready_attention_group_reformat_block_ids
            if num_group_pulls > 1
        ]

        if self.is_hma_required:
            for group_idx, grouped_local_block_ids, num_group_pulls, layer_indices in gqa_reformat_groups:
                num_reformat_blocks = sum(len(block_ids) for block_ids in grouped_local_block_ids)
                logger.debug(
                    "Reformat hybrid linear KV cache for GQA attention group. "
                    "group_idx=%s, num_group_pulls=%s, num_block_groups=%s, num_reformat_blocks=%s, "
                    "layer_indices=%s",
                    group_idx,
                    num_group_pulls,
                    len(grouped_local_block_ids),
                    num_reformat_blocks,
                    layer_indices,
                )
                group_kv_caches = self._get_group_kv_caches(group_idx, layer_indices)
                if not group_kv_caches:
                    continue
                self.reformat_kv_cache_hybrid_linear_torch(grouped_local_block_ids, num_group_pulls, group_kv_caches)
            return

        uniform_num_pulls = {num_group_pulls for _, _, num_group_pulls, _ in ready_attention_group_reformat_block_ids}
        if len(uniform_num_pulls) != 1:
            raise RuntimeError(
                f"Non-hybrid Mooncake KV reformat expects uniform group pulls, but got {uniform_num_pulls}."
            )

        num_group_pulls = next(iter(uniform_num_pulls))
        need_cat_cache = num_group_pulls > 1
        need_nz_cache = get_ascend_config().enable_kv_nz
        if not (need_cat_cache or need_nz_cache):
            return

        use_fused_op = ascend_envs.VLLM_ASCEND_FUSION_OP_TRANSPOSE_KV_CACHE_BY_BLOCK
        for group_idx, reformat_block_ids, _, layer_indices in ready_attention_group_reformat_block_ids:
            group_kv_caches = self._get_group_kv_caches(group_idx, layer_indices)
            if not group_kv_caches:
                continue
            if use_fused_op and enable_custom_op():
                if need_cat_cache:
                    self.reformat_kv_cache_with_fused_op(reformat_block_ids, num_group_pulls, group_kv_caches)
                if need_nz_cache:
                    self.reformat_kv_cache(reformat_block_ids, num_group_pulls, False, need_nz_cache, group_kv_caches)
            else:
                self.reformat_kv_cache(
                    reformat_block_ids,
                    num_group_pulls,
                    need_cat_cache,
                    need_nz_cache,
                    group_kv_caches,
                )

    @torch.no_grad()
    def reformat_kv_cache_hybrid_linear_torch(
        self, block_ids: list[list[int]], tp_num_need_pulls: int, group_kv_caches
    ):
        flat_block_ids = [item for sublist in block_ids for item in sublist]
        if not flat_block_ids or tp_num_need_pulls == 1:
            return
        device = list(self.kv_caches.values())[0][0].device
        block_ids_tensor = torch.tensor(flat_block_ids, dtype=torch.long, device=device)
        num_blocks = block_ids_tensor.numel()

        def _transpose_cache_by_block(cache: torch.Tensor):
            # The transferred cache is laid out as
            # [block, split, token, head_per_split, dim]. Restore it to
            # [block, token, split, head_per_split, dim] in the selected blocks.
            selected = cache.index_select(0, block_ids_tensor)
            block_size = cache.shape[1]
            transposed = (
                selected.reshape(num_blocks, tp_num_need_pulls, block_size, -1)
                .transpose(1, 2)
                .contiguous()
                .reshape_as(selected)
            )
            cache.index_copy_(0, block_ids_tensor, transposed)

        for _, (k_cache_layer, v_cache_layer) in group_kv_caches.items():
            _transpose_cache_by_block(k_cache_layer)
            _transpose_cache_by_block(v_cache_layer)

    def _append_mamba_transfer_meta(
        self,
        src_list: list[int],
        dst_list: list[int],
        length_list: list[int],
        group_spec: dict[str, Any],
        src_layer_base_addr: list[int],
        dst_layer_base_addr: list[int],
        block_len: list[int],
        block_stride: list[int],
        remote_block_stride: list[int],
        remote_block_id: int,
        local_block_id: int,
        tp_num_need_pulls: int,
        remote_tp_offset: int,
    ) -> None:
        remote_tp_size = self.tp_size * tp_num_need_pulls
        assert remote_tp_size >= self.tp_size, "Mamba prefill TP size must be >= decode TP size."
        assert remote_tp_size % self.tp_size == 0, "Mamba prefill TP size must be divisible by decode TP size."

        remote_conv_addr, remote_ssm_addr = dst_layer_base_addr[:2]
        local_conv_addr, local_ssm_addr = src_layer_base_addr[:2]
        local_conv_len, local_ssm_len = block_len[:2]
        local_conv_stride, local_ssm_stride = block_stride[:2]
        remote_conv_stride, remote_ssm_stride = remote_block_stride[:2]

        tp_ratio = tp_num_need_pulls
        remote_conv_len = local_conv_len // tp_ratio
        remote_ssm_len = local_ssm_len // tp_ratio

        if tp_ratio == 1:
            src_list.extend(
                [
                    local_conv_addr + local_block_id * local_conv_stride,
                    local_ssm_addr + local_block_id * local_ssm_stride,
                ]
            )
            dst_list.extend(
                [
                    remote_conv_addr + remote_block_id * remote_conv_stride,
                    remote_ssm_addr + remote_block_id * remote_ssm_stride,
                ]
            )
            length_list.extend([remote_conv_len, remote_ssm_len])
            return

        conv_shape = group_spec["shapes"][0]
        conv_dtype_size = group_spec["dtype_sizes"][0]

        linear_key_head_dim = self.vllm_config.model_config.hf_text_config.linear_key_head_dim
        linear_num_key_heads = self.vllm_config.model_config.hf_text_config.linear_num_key_heads
        linear_value_head_dim = self.vllm_config.model_config.hf_text_config.linear_value_head_dim
        linear_num_value_heads = self.vllm_config.model_config.hf_text_config.linear_num_value_heads
        remote_num_key_heads = linear_num_key_heads // remote_tp_size
        remote_num_value_heads = linear_num_value_heads // remote_tp_size
        remote_conv_width = (
            remote_num_key_heads * 2 * linear_key_head_dim + remote_num_value_heads * linear_value_head_dim
        )
        remote_conv_offsets = [
            0,
            remote_num_key_heads * linear_key_head_dim,
            remote_num_key_heads * 2 * linear_key_head_dim,
        ]
        remote_conv_sizes = [
            remote_num_key_heads * linear_key_head_dim,
            remote_num_key_heads * linear_key_head_dim,
            remote_num_value_heads * linear_value_head_dim,
        ]

        for i in range(conv_shape[0]):
            for remote_conv_offset, remote_conv_size in zip(remote_conv_offsets, remote_conv_sizes):
                remote_addr_offset = (i * remote_conv_width + remote_conv_offset) * conv_dtype_size
                local_addr_offset = (
                    (i * remote_conv_width + remote_conv_offset) * tp_ratio + remote_tp_offset * remote_conv_size
                ) * conv_dtype_size
                src_list.append(local_conv_addr + local_block_id * local_conv_stride + local_addr_offset)
                dst_list.append(remote_conv_addr + remote_block_id * remote_conv_stride + remote_addr_offset)
                length_list.append(remote_conv_size * conv_dtype_size)

        src_list.append(
            local_ssm_addr + local_block_id * local_ssm_stride + remote_tp_offset * local_ssm_len // tp_num_need_pulls
        )
        dst_list.append(remote_ssm_addr + remote_block_id * remote_ssm_stride)
        length_list.append(remote_ssm_len)

    def _get_group_kv_caches(self, group_idx: int, layer_indices: list[int] | None = None) -> dict[str, Any]:
        if layer_indices is None:
            _, layer_indices = self.kv_group2layeridx[group_idx]
        layer_index_set = set(layer_indices)
        num_attn_module = 2 if self.vllm_config.model_config.hf_text_config.model_type == "longcat_flash" else 1
        from vllm.v1.worker.utils import extract_layer_index

        def layer_in_group(layer_name: str) -> bool:
            if "mtp" in layer_name:
                return any(layer_idx >= self.num_layers for layer_idx in layer_index_set)
            return extract_layer_index(layer_name, num_attn_module) in layer_index_set

        return {
            layer_name: layer_cache for layer_name, layer_cache in self.kv_caches.items() if layer_in_group(layer_name)
        }

    @staticmethod
    def _get_kv_cache_dims_from_tensors(kv_caches: dict[str, Any]) -> tuple[int, int, int]:
        """Return (num_kv_heads, k_head_dim, v_head_dim) from registered KV cache tensors."""
        k_cache, v_cache = next(iter(kv_caches.values()))
        return int(k_cache.shape[-2]), int(k_cache.shape[-1]), int(v_cache.shape[-1])

    def reformat_kv_cache_with_fused_op(
        self,
        block_ids: list[list[int]],
        tp_num_need_pulls: int,
        kv_caches: dict[str, Any] | None = None,
    ):
        if kv_caches is None:
            kv_caches = self.kv_caches
        k_cache = list(kv_caches.values())[0][0]
        device = k_cache.device
        num_kv_head, head_dim, _ = self._get_kv_cache_dims_from_tensors(kv_caches)
        block_size = self.vllm_config.cache_config.block_size
        layers = len(kv_caches)
        flat_block_ids = [item for sublist in block_ids for item in sublist]
        block_ids_tensor = torch.tensor(flat_block_ids, dtype=torch.int64, device=device)

        k_caches = []
        v_caches = []
        for _, (k_cache_layer, v_cache_layer) in kv_caches.items():
            k_caches.append(k_cache_layer)
            v_caches.append(v_cache_layer)

        torch.ops._C_ascend.transpose_kv_cache_by_block(
            k_caches, v_caches, block_ids_tensor, block_size, num_kv_head, head_dim, tp_num_need_pulls, layers
        )

    def reformat_kv_cache(
        self,
        block_ids: list[list[int]],
        tp_num_need_pulls: int,
        need_cat_cache: bool = False,
        need_nz_cache: bool = False,
        kv_caches: dict[str, Any] | None = None,
    ):
        if kv_caches is None:
            kv_caches = self.kv_caches
        k_cache = list(kv_caches.values())[0][0]
        dtype = k_cache.dtype
        device = k_cache.device
        num_kv_heads, k_head_dim, v_head_dim = self._get_kv_cache_dims_from_tensors(kv_caches)

        flat_block_ids = [item for sublist in block_ids for item in sublist]
        block_ids_tensor = torch.tensor(flat_block_ids, dtype=torch.int32, device=device)
        num_blocks = len(flat_block_ids)
        num_tokens = num_blocks * self.block_size

        # Create device tensors for copy operations
        block_table = block_ids_tensor.view(1, -1)
        block_len_tensor = torch.tensor([num_tokens], dtype=torch.int32, device=device)
        seq_start_tensor = torch.tensor([0], dtype=torch.int32, device=device)

        k_buffer = torch.empty((num_tokens, num_kv_heads, k_head_dim), dtype=dtype, device=device)
        v_buffer = torch.empty((num_tokens, num_kv_heads, v_head_dim), dtype=dtype, device=device)

        # Create slot mapping for reshape operations
        block_offsets = torch.arange(0, self.block_size, dtype=torch.int32, device=device)
        slot_mapping = (
            block_offsets.reshape((1, self.block_size)) + block_ids_tensor.reshape((num_blocks, 1)) * self.block_size
        ).flatten()

        # FIXME: Right now, if we skip synchronization at this point, the system
        # will crash in GQA scenarios. However, we still haven't identified the
        # root cause.
        torch.npu.synchronize()

        # Process each layer in the KV cache
        for _, (k_cache_layer, v_cache_layer) in kv_caches.items():
            # Load cache data into buffers
            torch_npu.atb.npu_paged_cache_load(
                k_cache_layer,
                v_cache_layer,
                block_table,
                block_len_tensor,
                seq_starts=seq_start_tensor,
                key=k_buffer,
                value=v_buffer,
            )
            if need_cat_cache:
                self._cat_kv_cache(
                    k_cache_layer,
                    v_cache_layer,
                    k_buffer,
                    v_buffer,
                    tp_num_need_pulls,
                    num_blocks,
                    num_tokens,
                    slot_mapping,
                    num_kv_heads,
                )
            if need_nz_cache:
                self._nz_kv_cache(
                    k_cache_layer,
                    v_cache_layer,
                    k_buffer,
                    v_buffer,
                    slot_mapping,
                    num_kv_heads,
                    k_head_dim,
                    v_head_dim,
                )
        # Clean up buffers
        del k_buffer, v_buffer

    def _cat_kv_cache(
        self,
        k_cache_layer,
        v_cache_layer,
        k_buffer,
        v_buffer,
        tp_num_need_pulls,
        num_blocks,
        num_tokens,
        slot_mapping,
        num_kv_heads: int,
    ):
        def _transpose_kv_cache_between_head(buffer: torch.Tensor) -> torch.Tensor:
            buffer = buffer.view(num_blocks, tp_num_need_pulls, self.block_size, -1)
            buffer.transpose_(1, 2)
            return buffer.contiguous().view(num_tokens, num_kv_heads, -1)

        # Transpose KV cache
        k_buffer = _transpose_kv_cache_between_head(k_buffer)
        v_buffer = _transpose_kv_cache_between_head(v_buffer)

        # Reshape and cache the processed buffers
        torch_npu._npu_reshape_and_cache(
            key=k_buffer, value=v_buffer, key_cache=k_cache_layer, value_cache=v_cache_layer, slot_indices=slot_mapping
        )

    def _nz_kv_cache(
        self,
        k_cache_layer,
        v_cache_layer,
        k_buffer,
        v_buffer,
        slot_mapping,
        num_kv_heads: int,
        k_head_dim: int,
        v_head_dim: int,
    ):
        nz_fmt_last_dim = 16
        k_cache_layer = k_cache_layer.view(
            -1, k_head_dim * num_kv_heads // nz_fmt_last_dim, self.block_size, nz_fmt_last_dim
        )
        v_cache_layer = v_cache_layer.view(
            -1, v_head_dim * num_kv_heads // nz_fmt_last_dim, self.block_size, nz_fmt_last_dim
        )
        torch_npu.npu_scatter_pa_kv_cache(k_buffer, v_buffer, k_cache_layer, v_cache_layer, slot_mapping)

    def _get_remote_metadata(self, remote_host: str, remote_handshake_port: int) -> None:
        """Get the metadata from the remote host."""
        sock: zmq.Socket | None = None  # type: ignore
        try:
            sock = self._get_remote_socket(remote_host, remote_handshake_port)
            ensure_zmq_send(sock, self.encoder.encode((GET_META_MSG, "")), f"{remote_host}:{remote_handshake_port}")
            metadata_bytes = ensure_zmq_recv(sock, f"{remote_host}:{remote_handshake_port}")
            agent_meta = self.decoder.decode(metadata_bytes)
            engine_id = agent_meta.engine_id
            assert engine_id != self.local_engine_id, (
                f"Conflict engine id {engine_id} with local engine id {self.local_engine_id}."
            )
            if agent_meta.kv_group2layeridx != self.kv_group2layeridx:
                logger.debug(
                    "Remote kv_group2layeridx differs from local. Inspect the remote and local metadata "
                    "to determine whether the difference is expected for the configured parallelism "
                    "and KV cache layouts. remote=%s, local=%s. ",
                    agent_meta.kv_group2layeridx,
                    self.kv_group2layeridx,
                )
            with self.remote_metadata_lock:
                self.remote_kv_group2layeridx[engine_id][remote_handshake_port] = agent_meta.kv_group2layeridx
                self.kv_caches_base_addr[engine_id][remote_handshake_port] = agent_meta.kv_caches_base_addr
                self.remote_te_port[engine_id][remote_handshake_port] = agent_meta.te_rpc_port
                self.remote_block_size_scale[engine_id][remote_handshake_port] = agent_meta.block_size_scale
                self.remote_block_stride_per_addr[engine_id][remote_handshake_port] = agent_meta.block_strides
        except Exception:
            if isinstance(sock, zmq.Socket):  # type: ignore
                sock.close()
                sock = None
            raise
        finally:
            if sock is not None:
                self._return_remote_socket(sock, remote_host, remote_handshake_port)
                logger.debug("Returned socket to pool for %s:%d", remote_host, remote_handshake_port)

    def _send_done_recv_signal(
        self,
        request_id: str,
        remote_host: str,
        remote_handshake_port: int,
        remote_port_send_num: dict[int, RemotePortInfo],
    ):
        logger.debug(
            "Sending done recving signal for request %s to %s:%d", request_id, remote_host, remote_handshake_port
        )
        sock: zmq.Socket | None = None  # type: ignore
        try:
            sock = self._get_remote_socket(remote_host, remote_handshake_port)
            data_bytes = self.encoder.encode((DONE_RECVING_MSG, request_id, remote_port_send_num))
            ensure_zmq_send(sock, data_bytes, f"{remote_host}:{remote_handshake_port}")
            resp = ensure_zmq_recv(sock, f"{remote_host}:{remote_handshake_port}")
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("Received response for request %s: %s", request_id, resp.decode("utf-8"))
            if resp != b"ACK":
                logger.error(
                    "Failed to receive ACK for request. request_id=%s, source=%s:%d. ",
                    request_id,
                    remote_host,
                    remote_handshake_port,
                )
                raise RuntimeError(f"Failed to receive ACK, resp: {resp.decode('utf-8')}")
        except RuntimeError as e:
            if isinstance(sock, zmq.Socket):  # type: ignore
                sock.close()
                sock = None
                logger.warning("Unexpected error occurred in socket. error=%s. ", e)
        finally:
            if sock is not None:
                self._return_remote_socket(sock, remote_host, remote_handshake_port)
                logger.debug("Returned socket to pool for %s:%d", remote_host, remote_handshake_port)

    def _get_remote_socket(self, remote_host: str, remote_handshake_port: int) -> zmq.Socket:  # type: ignore
        """Get a socket to the remote host."""
        remote_path = make_zmq_path("tcp", remote_host, remote_handshake_port)
        with self.remote_sockets_lock:
            if self.remote_sockets[remote_path]:
                return self.remote_sockets[remote_path].popleft()

            ctx = zmq.Context()  # type: ignore
            sock = make_zmq_socket(
                ctx=ctx,
                path=remote_path,
                socket_type=zmq.REQ,  # type: ignore
                bind=False,
            )
            sock.setsockopt(
                zmq.SNDTIMEO,  # type: ignore
                int(self.timeout * 1000),
            )
            sock.setsockopt(
                zmq.RCVTIMEO,  # type: ignore
                int(self.timeout * 1000),
            )
            return sock

    def _return_remote_socket(
        self,
        sock: zmq.Socket,  # type: ignore
        remote_host: str,
        remote_handshake_port: int,
    ) -> None:
        """Return the remote socket to the pool."""
        remote_path = make_zmq_path("tcp", remote_host, remote_handshake_port)
        with self.remote_sockets_lock:
            self.remote_sockets[remote_path].append(sock)


class MooncakeConnectorMetadata(KVConnectorMetadata):
    def __init__(self):
        self.requests: dict[str, ReqMeta] = {}
        self.requests_to_send: dict[str, float] = {}
        self.reqs_in_batch: set[str] = set()

    def add_new_req(
        self,
        request_id: str,
        local_block_ids: BlockIds,
        num_external_tokens: int,
        kv_transfer_params: dict[str, Any],
        local_full_block_ids: BlockIds | None = None,
    ):
        self.requests[request_id] = ReqMeta(
            local_block_ids=local_block_ids,
            num_external_tokens=num_external_tokens,
            num_computed_tokens=kv_transfer_params.get("num_computed_tokens", 0),
            remote_block_ids=kv_transfer_params["remote_block_ids"],
            remote_engine_id=kv_transfer_params["remote_engine_id"],
            remote_request_id=kv_transfer_params["remote_request_id"],
            remote_host=kv_transfer_params["remote_host"],
            remote_port=kv_transfer_params["remote_port"],
            remote_pcp_size=kv_transfer_params.get("remote_pcp_size", 1),
            remote_dcp_size=kv_transfer_params.get("remote_dcp_size", 1),
            remote_ptp_size=kv_transfer_params.get("remote_ptp_size"),
            remote_multi_nodes_meta_mapping=kv_transfer_params.get("remote_multi_nodes_meta_mapping", {}),
            num_prompt_blocks=kv_transfer_params.get("num_prompt_blocks", 0),
            remote_block_size=kv_transfer_params.get("remote_block_size", 0),
            local_full_block_ids=local_full_block_ids or tuple(),
        )


class MooncakeConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        assert vllm_config.kv_transfer_config is not None
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        self._connector_metadata = MooncakeConnectorMetadata()

        if role == KVConnectorRole.SCHEDULER:
            self.connector_scheduler: MooncakeConnectorScheduler | None = MooncakeConnectorScheduler(
                vllm_config, str(self.engine_id), kv_cache_config
            )
            self.connector_worker: MooncakeConnectorWorker | None = None
        elif role == KVConnectorRole.WORKER:
            self.connector_scheduler = None
            self.connector_worker = MooncakeConnectorWorker(vllm_config, str(self.engine_id), kv_cache_config)

    ############################################################
    # Scheduler Side Methods
    ############################################################

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        assert self.connector_scheduler is not None
        return self.connector_scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(
        self,
        scheduler_output: SchedulerOutput,
    ) -> KVConnectorMetadata:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def request_finished(
        self,
        request: "Request",
        block_ids: list[int],
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.request_finished(request, (block_ids,))

    def request_finished_all_groups(
        self,
        request: "Request",
        block_ids: tuple[list[int], ...],
    ) -> tuple[bool, dict[str, Any] | None]:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.request_finished(request, block_ids)

    ############################################################
    # Worker Side Methods
    ############################################################
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        assert self.connector_worker is not None
        self.connector_worker.register_kv_caches(kv_caches)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], set[str]]:
        """Get the finished recving and sending requests."""
        assert self.connector_worker is not None
        return self.connector_worker.get_finished()

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Get the block ids whose KV load failed."""
        assert self.connector_worker is not None
        return self.connector_worker.get_block_ids_with_load_errors()

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs) -> None:
        assert self.connector_worker is not None
        assert isinstance(self._connector_metadata, MooncakeConnectorMetadata)
        self.connector_worker.start_load_kv(self._connector_metadata)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """MooncakeConnector does not do layerwise saving."""
        pass

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: "AttentionMetadata", **kwargs
    ) -> None:
        """MooncakeConnector does not save explicitly."""
        pass

    def wait_for_save(self):
        """MooncakeConnector does not save explicitly."""
        pass

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        """
        Get the KVConnector handshake metadata for this connector.
        This metadata is used for out-of-band connector handshake
        between P/D workers.

        Returns:
            KVConnectorHandshakeMetadata: the handshake metadata.
            None if no handshake metadata is available.
        """
        assert self.connector_worker is not None
        return self.connector_worker.xfer_handshake_metadata

    def set_xfer_handshake_metadata(
        self, metadata: Mapping[int | tuple[int, ...], KVConnectorHandshakeMetadata]
    ) -> None:
        """
        Set the KV connector handshake metadata for this connector.

        Args:
            metadata (dict): the handshake metadata to set.
        """
        assert self.connector_scheduler is not None
        self.connector_scheduler.set_xfer_handshake_metadata(metadata)

    def set_xfer_handshake_metadata_pp_aware(
        self, metadata: Mapping[int | tuple[int, ...], KVConnectorHandshakeMetadata]
    ) -> None:
        assert self.connector_scheduler is not None
        self.connector_scheduler.set_xfer_handshake_metadata_from_workers(metadata)


class MooncakeConnectorScheduler:
    """Implementation of Scheduler side methods"""

    def __init__(self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig):
        self.vllm_config = vllm_config
        self.kv_cache_config = kv_cache_config
        init_ascend_config(vllm_config)
        self.ascend_config = get_ascend_config()
        self.block_size = vllm_config.cache_config.block_size
        self.engine_id = engine_id
        self.local_ip = get_ip()
        logger.info("Initializing Mooncake Scheduler %s", engine_id)

        self.side_channel_host = get_ip()
        self.pcp_size = vllm_config.parallel_config.prefill_context_parallel_size
        self.dcp_size = vllm_config.parallel_config.decode_context_parallel_size
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.max_device_id = (
            vllm_config.parallel_config.tensor_parallel_size
            * vllm_config.parallel_config.data_parallel_size
            * self.pcp_size
            * vllm_config.parallel_config.pipeline_parallel_size
        )

        # Handshake base port
        self.side_channel_port = (
            vllm_config.kv_transfer_config.kv_port
            + vllm_config.parallel_config.data_parallel_rank
            * vllm_config.parallel_config.tensor_parallel_size
            * vllm_config.parallel_config.pipeline_parallel_size
            * self.pcp_size
        )
        # Requests that need to start recv.
        # New requests are added by update_state_after_alloc in
        # the scheduler. Used to make metadata passed to Worker.
        self._reqs_need_recv: dict[str, tuple[Request, BlockIds, BlockIds, int]] = {}
        self._reqs_need_send: dict[str, float] = {}
        self._reqs_in_batch: set[str] = set()

        # master-slave meta information for cross-nodes
        self.multi_nodes_meta_mapping: dict[str, dict[str, Any]] = {}
        self.kv_cache_groups = kv_cache_config.kv_cache_groups
        self.use_hybrid = (
            not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
            and any(not isinstance(g.kv_cache_spec, FullAttentionSpec) for g in kv_cache_config.kv_cache_groups)
            and len(kv_cache_config.kv_cache_groups) > 1
        )
        self.use_compress = self._model_uses_compress()
        self.group_transfer_info = [self._get_group_transfer_info(group) for group in kv_cache_config.kv_cache_groups]
        self.need_truncate = self.use_compress or any(info.is_state_group for info in self.group_transfer_info)

    def _model_uses_compress(self) -> bool:
        hf_config = getattr(self.vllm_config.model_config, "hf_config", None)
        compress_ratios = getattr(hf_config, "compress_ratios", None)
        return isinstance(compress_ratios, (list, tuple, dict))

    def _get_group_transfer_info(self, group: Any) -> GroupTransferInfo:
        specs = self._get_group_unique_specs(group)
        first_spec = specs[0] if specs else group.kv_cache_spec
        block_size = getattr(group.kv_cache_spec, "block_size", getattr(first_spec, "block_size", self.block_size))
        is_state_group = any(isinstance(spec, MambaSpec) for spec in specs)
        sliding_window = 0
        compress_ratio = 1
        for spec in specs:
            if isinstance(spec, SlidingWindowSpec):
                sliding_window = spec.sliding_window
            elif hasattr(spec, "compress_ratio"):
                compress_ratio = spec.compress_ratio

        return GroupTransferInfo(
            tokens_per_block=block_size * max(1, int(compress_ratio)),
            blocks_per_window=cdiv(sliding_window, block_size) + 1 if sliding_window else 0,
            is_state_group=is_state_group,
        )

    def _get_group_unique_specs(self, group: Any) -> list[Any]:
        if not isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs):
            return [group.kv_cache_spec]

        specs = []
        for layer_name in group.layer_names:
            layer_spec = group.kv_cache_spec.kv_cache_specs[layer_name]
            if layer_spec not in specs:
                specs.append(layer_spec)
        return specs

    def _get_transfer_block_ids(self, block_ids: BlockIds, prompt_len: int) -> BlockIds:
        """Return blocks that contain prompt KV, dropping MTP extra blocks.

        State groups such as Mamba are not context-block aligned with attention
        KV, so keep them unchanged and only clip attention-like groups here.
        SWA tail clipping is handled as a separate step after this.
        """
        if len(block_ids) == 0:
            return block_ids

        assert len(block_ids) == len(self.group_transfer_info), "Number of KV cache groups must match"

        transfer_block_ids = []
        cp_size = max(1, self.pcp_size * self.dcp_size)
        for blocks, group_info in zip(block_ids, self.group_transfer_info):
            if group_info.is_state_group:
                transfer_block_ids.append(blocks)
            else:
                # In context parallelism, each scheduler-visible block id is a
                # CP-grouped/virtual block shared by all CP ranks. It therefore
                # covers cp_size times the token span of one no-CP block.
                num_prompt_blocks = cdiv(prompt_len, group_info.tokens_per_block * cp_size)
                transfer_block_ids.append(blocks[:num_prompt_blocks])
        return tuple(transfer_block_ids)

    def _get_swa_transfer_block_ids(self, block_ids: BlockIds) -> BlockIds:
        """Clip SWA groups to their window tail and drop placeholder block 0."""
        if len(block_ids) == 0:
            return block_ids

        assert len(block_ids) == len(self.group_transfer_info), "Number of KV cache groups must match"

        transfer_block_ids = []
        for blocks, group_info in zip(block_ids, self.group_transfer_info):
            if group_info.is_state_group or group_info.blocks_per_window == 0:
                transfer_block_ids.append(blocks)
            else:
                window_blocks = blocks[-group_info.blocks_per_window :]
                transfer_block_ids.append([block_id for block_id in window_blocks if block_id != 0])
        return tuple(transfer_block_ids)

    def _state_prefill_token_count(self, num_prompt_tokens: int) -> int:
        """D-side only. Returns N-1 for Mamba models since the decoder
        always recomputes the last token and must start from h(N-1)."""
        if self.need_truncate and num_prompt_tokens > 1:
            return num_prompt_tokens - 1
        return num_prompt_tokens

    def _truncate_request_for_prefill(self, request: "Request") -> None:
        """P-side only: drop the last prompt token so the prefiller computes
        h(N-1) instead of h(N). The decoder recomputes the last token to
        derive h(N) correctly.

        Guarded by ``_p_side_truncated`` to avoid repeated truncation if the
        request is preempted and rescheduled."""
        params = request.kv_transfer_params
        if (
            params is not None
            # Guard against repeated truncation after preemption/reschedule.
            and not params.get("_p_side_truncated")
            and request.num_prompt_tokens > 1
        ):
            if request.prompt_token_ids is not None:
                request.prompt_token_ids.pop()
            elif request.prompt_embeds is not None:
                request.prompt_embeds = request.prompt_embeds[:-1]
            else:
                return

            request._all_token_ids.pop()
            request.num_prompt_tokens -= 1
            request.max_tokens = 1
            params["_p_side_truncated"] = True

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        """
        For remote prefill, pull all prompt blocks from remote
        asynchronously relative to engine execution.

        Args:
            request (Request): the request object.
            num_computed_tokens (int): the number of locally
                computed tokens for this request
        Returns:
            * the number of tokens that can be loaded from the
              external KV cache beyond what is already computed.
            * true if the external KV cache tokens will be loaded
              asynchronously (between scheduler steps).
        """

        params = request.kv_transfer_params
        logger.debug(
            "MooncakeConnector get_num_new_matched_tokens: num_computed_tokens=%s, kv_transfer_params=%s",
            num_computed_tokens,
            params,
        )

        if params is not None and params.get("do_remote_prefill"):
            # Remote prefill: get all prompt blocks from remote.
            token_ids = request.prompt_token_ids or []
            actual = self._state_prefill_token_count(len(token_ids))
            params["num_computed_tokens"] = num_computed_tokens
            count = max(actual - num_computed_tokens, 0)
            if count > 0:
                return count, True

        if params is not None and params.get("do_remote_decode") and self.need_truncate:
            self._truncate_request_for_prefill(request)

        # No remote prefill for this request.
        return 0, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int):
        params = request.kv_transfer_params
        logger.debug(
            "MooncakeConnector update_state_after_alloc: num_external_tokens=%s, kv_transfer_params=%s",
            num_external_tokens,
            params,
        )

        if params is not None and (params.get("do_remote_prefill", False) or params.get("do_remote_decode", False)):
            self._reqs_in_batch.add(request.request_id)
        if params is not None and params.get("do_remote_prefill"):
            if params.get("remote_block_ids"):
                if all(p in params for p in ("remote_engine_id", "remote_host", "remote_port", "remote_request_id")):
                    local_block_ids = blocks.get_unhashed_block_ids_all_groups() if num_external_tokens > 0 else []
                    local_full_block_ids = blocks.get_block_ids() if num_external_tokens > 0 else tuple()
                    # Get unhashed blocks to pull from remote.
                    self._reqs_need_recv[request.request_id] = (
                        request,
                        local_block_ids,
                        local_full_block_ids,
                        num_external_tokens,
                    )
                else:
                    logger.warning("Got invalid KVTransferParams. params=%s. ", params)
            else:
                assert num_external_tokens == 0
            # Only trigger 1 KV transfer per request.
            params["do_remote_prefill"] = False

    def build_connector_meta(
        self,
        scheduler_output: SchedulerOutput,
    ) -> KVConnectorMetadata:
        meta = MooncakeConnectorMetadata()

        # Loop through scheduled reqs and convert to ReqMeta.
        for req_id, (req, block_ids, full_block_ids, num_external_tokens) in self._reqs_need_recv.items():
            assert req.kv_transfer_params is not None
            # For the case where there are no remote blocks to pull
            # (block_ids is empty), we don't need to schedule
            # an async read on the worker side.
            meta.add_new_req(
                request_id=req_id,
                local_block_ids=block_ids,
                local_full_block_ids=full_block_ids,
                num_external_tokens=num_external_tokens,
                kv_transfer_params=req.kv_transfer_params,
            )

        # Clear the list once workers start the transfers
        self._reqs_need_recv.clear()
        meta.requests_to_send = self._reqs_need_send
        self._reqs_need_send = {}
        meta.reqs_in_batch = self._reqs_in_batch
        self._reqs_in_batch = set()

        return meta

    def request_finished(
        self,
        request: "Request",
        block_ids: BlockIds,
    ) -> tuple[bool, dict[str, Any] | None]:
        """
        Once a request is finished, determine whether request blocks
        should be freed now or will be sent asynchronously and freed later.
        """

        params = request.kv_transfer_params
        logger.debug(
            "MooncakeConnector request_finished, request_status=%s, kv_transfer_params=%s", request.status, params
        )

        if (
            params is None
            or not params.get("do_remote_decode")
            or request.status != RequestStatus.FINISHED_LENGTH_CAPPED
        ):
            return False, None

        num_prompt_blocks = math.ceil(len(request.prompt_token_ids) / self.block_size)
        computed_block_ids = self._get_transfer_block_ids(block_ids, len(request.prompt_token_ids))
        computed_block_ids = self._get_swa_transfer_block_ids(computed_block_ids)
        computed_block_lens = [len(block_id_list) for block_id_list in computed_block_ids]
        delay_free_blocks = sum(computed_block_lens) > 0
        if delay_free_blocks:
            logger.info("Delaying free of %d blocks for request %s", sum(computed_block_lens), request.request_id)
            self._reqs_need_send[request.request_id] = time.time()

        return delay_free_blocks, dict(
            do_remote_prefill=True,
            do_remote_decode=False,
            remote_block_ids=computed_block_ids,
            remote_engine_id=self.engine_id,
            remote_request_id=request.request_id,
            remote_host=self.side_channel_host,
            remote_port=self.side_channel_port,
            remote_pcp_size=self.pcp_size,
            remote_dcp_size=self.dcp_size,
            remote_ptp_size=self.tp_size,
            last_token_id=request.output_token_ids[-1],
            remote_multi_nodes_meta_mapping=self.multi_nodes_meta_mapping,
            num_prompt_blocks=num_prompt_blocks,
            remote_block_size=self.block_size,
        )

    def _port_offset_from_handshake_metadata(
        self,
        rank_metadata: KVConnectorHandshakeMetadata,
        metadata_key: int | tuple[int, ...],
    ) -> int:
        kv_port = self.vllm_config.kv_transfer_config.kv_port
        handshake_port = getattr(rank_metadata, "handshake_port", 0)
        if handshake_port > 0:
            return handshake_port - kv_port
        if isinstance(metadata_key, int):
            return metadata_key
        raise ValueError(f"Mooncake handshake metadata missing handshake_port for worker key {metadata_key}")

    def set_xfer_handshake_metadata_from_workers(
        self,
        metadata: Mapping[int | tuple[int, ...], KVConnectorHandshakeMetadata],
    ) -> None:
        """Build host mapping for one DP group that may span multiple nodes."""
        if not metadata:
            return

        updated_mapping: dict[str, dict[str, Any]] = {}
        kv_port = self.vllm_config.kv_transfer_config.kv_port
        for metadata_key, rank_metadata in metadata.items():
            port_offset = self._port_offset_from_handshake_metadata(rank_metadata, metadata_key)
            updated_mapping[str(port_offset)] = {
                "host": rank_metadata.local_ip,
                "engine_id": rank_metadata.engine_id,
                "handshake_port": kv_port + port_offset,
            }

        self.multi_nodes_meta_mapping.update(updated_mapping)
        logger.info(
            "MooncakeConnector set_xfer_handshake_metadata: worker_count=%d, updated=%s, multi_nodes_meta_mapping=%s",
            len(metadata),
            updated_mapping,
            self.multi_nodes_meta_mapping,
        )

    def set_xfer_handshake_metadata(
        self, metadata: Mapping[int | tuple[int, ...], KVConnectorHandshakeMetadata]
    ) -> None:
        """Legacy int-keyed entry point (port offset keys)."""
        self.set_xfer_handshake_metadata_from_workers(metadata)


class MooncakeConnectorWorker:
    """Implementation of Worker side methods"""

    def __init__(self, vllm_config: VllmConfig, engine_id: str, kv_cache_config: KVCacheConfig):
        self._get_prefill_decode_size(vllm_config)
        os.environ["ASCEND_TRANSFER_TIMEOUT"] = str(get_transfer_timeout_value())
        if self._prefill_tp_size < self._decode_tp_size:
            raise ValueError(
                f"prefill_tp_size: {self._prefill_tp_size} must be greater than"
                f" or equal to the decode_tp_size: {self._decode_tp_size}"
            )

        # Metadata.
        self.vllm_config = vllm_config
        self.ascend_config = get_ascend_config()
        self.engine_id = engine_id
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.tp_group = get_tp_group()
        self.pp_rank = get_pp_group().rank_in_group
        self.dp_rank = vllm_config.parallel_config.data_parallel_rank_local
        self.dp_size = vllm_config.parallel_config.data_parallel_size_local
        self.pp_size = vllm_config.parallel_config.pipeline_parallel_size
        self.kv_caches: dict[str, torch.Tensor] = {}
        self.side_channel_host = get_ip()
        self.pcp_size = get_pcp_group().world_size
        self.total_layers = vllm_config.model_config.get_total_num_hidden_layers()
        # Assert that pp_size and pcp_size cannot both be greater than 1
        assert not (self.pp_size > 1 and self.pcp_size > 1), "pp and pcp cannot open in same time"
        self.pcp_rank = get_pcp_group().rank_in_group if self.pcp_size > 1 else 0
        self.dcp_size = get_decode_context_model_parallel_world_size()
        self.dcp_rank = get_decode_context_model_parallel_rank() if self.dcp_size > 1 else 0

        self.max_device_id = self.tp_size * self.dp_size * self.pcp_size * self.pp_size
        self.kv_role = vllm_config.kv_transfer_config.kv_role
        self.num_key_value_heads = self.vllm_config.model_config.hf_text_config.num_key_value_heads

        # kv cache config
        self.kv_cache_config = kv_cache_config
        self.num_blocks: int = kv_cache_config.num_blocks
        self.kv_group2layeridx: dict[int, tuple[dict[str, Any], list[int]]] = {}
        self.use_hybrid = (
            not self.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager
            and any(not isinstance(g.kv_cache_spec, FullAttentionSpec) for g in self.kv_cache_config.kv_cache_groups)
            and len(self.kv_cache_config.kv_cache_groups) > 1
        )
        self._is_hma_required = not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager and any(
            not isinstance(g.kv_cache_spec, FullAttentionSpec) for g in kv_cache_config.kv_cache_groups
        )
        self._layer_specs = {
            layer: group.kv_cache_spec for group in kv_cache_config.kv_cache_groups for layer in group.layer_names
        }

        # Handshake base port
        self.side_channel_port = (
            vllm_config.kv_transfer_config.kv_port
            + vllm_config.parallel_config.data_parallel_rank
            * vllm_config.parallel_config.tensor_parallel_size
            * vllm_config.parallel_config.pipeline_parallel_size
            * self.pcp_size
        )
        device_index = (self.pp_rank * self.pcp_size + self.pcp_rank) * self.tp_size + self.tp_rank
        self.handshake_port = self.side_channel_port + device_index
        self.sockets: dict = {}
        device_name = str(torch.npu.current_device()) if self.pp_size > 1 else None
        self.engine = global_te.get_transfer_engine(
            self.side_channel_host,
            device_name=device_name,
        )
        self.te_rpc_port = self.engine.get_rpc_port()

        # Background thread for sending or receiving KV caches.
        self.kv_send_thread: KVCacheSendingThread | None = None
        self.kv_recv_thread: KVCacheRecvingThread | None = None

        # Handshake metadata of this worker
        self.xfer_handshake_metadata: MooncakeAgentMetadata | None = None

        # kv_transfer variables
        self.vllm_config = vllm_config
        self.block_size = vllm_config.cache_config.block_size
        if self.vllm_config.model_config.is_deepseek_mla:
            self.tp_num_need_pulls = 1
        else:
            num_d_block_heads = max(1, self.num_key_value_heads // self.tp_size)
            num_p_block_heads = max(1, self.num_key_value_heads // self._prefill_tp_size)
            self.tp_num_need_pulls = num_d_block_heads // num_p_block_heads
        self.local_remote_block_port_mapping: dict[str, list[list[int]] | None] = {}
        self.remote_port_send_num: dict[str, dict[int, RemotePortInfo]] = {}

    def _get_prefill_decode_size(self, vllm_config: VllmConfig):
        # get prefill tp and dp size from extra config
        prefill_parallel_config: dict[str, Any] = vllm_config.kv_transfer_config.get_from_extra_config("prefill", {})

        assert "tp_size" in prefill_parallel_config
        self._prefill_tp_size = prefill_parallel_config["tp_size"]

        assert "dp_size" in prefill_parallel_config
        self._prefill_dp_size = prefill_parallel_config["dp_size"]
        # get prefill pp size from extra config
        self._prefill_pp_size = prefill_parallel_config.get("pp_size", 1)
        # get decode tp and dp size from extra config
        decode_parallel_config: dict[str, Any] = vllm_config.kv_transfer_config.get_from_extra_config("decode", {})
        assert "tp_size" in decode_parallel_config
        self._decode_tp_size = decode_parallel_config["tp_size"]
        assert "dp_size" in decode_parallel_config
        self._decode_dp_size = decode_parallel_config["dp_size"]
        # get prefill pp size from extra config
        self._decode_pp_size = decode_parallel_config.get("pp_size", 1)
        assert self._decode_pp_size == 1, "decode pp size must be 1"
        self._prefill_pp_layer_partition = prefill_parallel_config.get("pp_layer_partition")

    @staticmethod
    def _serialize_kv_group_spec(
        group_spec: Any,
        layer_names: list[str] | None = None,
        kv_cache_spec: Any | None = None,
        kv_cache_group_id: int | None = None,
        total_num_kv_heads: int | None = None,
    ) -> dict[str, Any]:
        def to_msgpackable(value: Any) -> Any:
            if value is None or isinstance(value, (str, int, float, bool)):
                return value
            if isinstance(value, dict):
                return {str(k): to_msgpackable(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [to_msgpackable(item) for item in value]
            try:
                builtins_value = msgspec.to_builtins(value)
                if builtins_value is value:
                    return repr(value)
                return to_msgpackable(builtins_value)
            except TypeError:
                return repr(value)

        if layer_names is None:
            layer_names = list(group_spec.layer_names)
        if kv_cache_spec is None:
            kv_cache_spec = group_spec.kv_cache_spec
        spec = kv_cache_spec
        if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
            spec = {layer_name: kv_cache_spec.kv_cache_specs[layer_name] for layer_name in layer_names}
        serialized_kv_cache_spec = to_msgpackable(spec)
        if not isinstance(serialized_kv_cache_spec, dict):
            serialized_kv_cache_spec = {"repr": serialized_kv_cache_spec}
        num_key_value_heads = MooncakeConnectorWorker._get_spec_num_key_value_heads(spec)
        if num_key_value_heads is not None:
            serialized_kv_cache_spec["num_kv_heads"] = num_key_value_heads
            serialized_kv_cache_spec["num_key_value_heads"] = num_key_value_heads
        if total_num_kv_heads is not None:
            serialized_kv_cache_spec["total_num_kv_heads"] = total_num_kv_heads

        serialized = {
            "layer_names": layer_names,
            "kv_cache_spec_type": type(kv_cache_spec).__name__,
            "kv_cache_spec": serialized_kv_cache_spec,
        }
        if kv_cache_group_id is not None:
            serialized["kv_cache_group_id"] = kv_cache_group_id
        if isinstance(kv_cache_spec, MambaSpec):
            serialized["shapes"] = [list(shape) for shape in kv_cache_spec.shapes]
            serialized["dtype_sizes"] = [
                torch.tensor([], dtype=dtype).element_size()
                for dtype in kv_cache_spec.dtypes  # type: ignore[misc]
            ]
        return serialized

    @staticmethod
    def _get_spec_num_key_value_heads(spec: Any) -> int | None:
        for key in ("num_kv_heads", "num_key_value_heads"):
            num_key_value_heads = getattr(spec, key, None)
            if isinstance(num_key_value_heads, int):
                return num_key_value_heads
        return None

    @classmethod
    def _get_kv_transfer_spec_key(
        cls,
        spec: Any,
        total_num_kv_heads: int | None,
    ) -> tuple[str, int | None, int | None]:
        # TODO: Extand this key with KV cache layout fields (for example num_dims)
        # if a future model has layers with the same number of kv heads but incompatiible
        # cache shapes.
        return (
            type(spec).__name__,
            cls._get_spec_num_key_value_heads(spec),
            total_num_kv_heads,
        )

    def _get_spec_total_num_kv_heads(self, spec: Any, layer_idx: int) -> int | None:
        local_num_kv_heads = self._get_spec_num_key_value_heads(spec)
        if local_num_kv_heads is None or isinstance(spec, MLAAttentionSpec):
            return local_num_kv_heads

        model_config = self.vllm_config.model_config
        speculative_config = self.vllm_config.speculative_config
        if (
            layer_idx >= self.total_layers
            and speculative_config is not None
            and speculative_config.draft_model_config is not None
        ):
            model_config = speculative_config.draft_model_config
        return model_config.get_total_num_kv_heads()

    def _build_kv_group2layeridx(self) -> dict[int, tuple[dict[str, Any], list[int]]]:
        from vllm.v1.worker.utils import extract_layer_index

        kv_group2layeridx: dict[int, tuple[dict[str, Any], list[int]]] = {}
        num_attn_module = 2 if self.vllm_config.model_config.hf_text_config.model_type == "longcat_flash" else 1
        next_mtp_layer_idx = self.total_layers
        transfer_group_id = 0
        for kv_cache_group_id, group_spec in enumerate(self.kv_cache_config.kv_cache_groups):
            layer_entries: list[tuple[str, int]] = []
            # For eagle3 method there is no "mtp" in layer names, and upstream model initiation assigns the layer id
            # that is sliced by Pipeline Parallel. So the eagle layer id will confilt with target model layers.
            # Here we determine whether the current layer is an eagle layer based on whether the layer id has been
            # assigned to previous layers. If the layer id has been assigned, we treat the current layer as
            # an eagle layer and assign a new layer id starting from total_layers.
            assigned_indices: set[int] = set()
            for layer_name in group_spec.layer_names:
                if "mtp" in layer_name:
                    layer_idx = next_mtp_layer_idx
                    next_mtp_layer_idx += 1
                else:
                    layer_idx = extract_layer_index(layer_name, num_attn_module)
                    if assigned_indices and layer_idx < min(assigned_indices) or layer_idx in assigned_indices:
                        layer_idx = next_mtp_layer_idx
                        next_mtp_layer_idx += 1
                assigned_indices.add(layer_idx)
                layer_entries.append((layer_name, layer_idx))

            spec_groups: OrderedDict[
                tuple[str, int | None, int | None],
                list[tuple[str, int, Any, int | None]],
            ] = OrderedDict()
            for layer_name, layer_idx in layer_entries:
                kv_cache_spec = group_spec.kv_cache_spec
                if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
                    kv_cache_spec = kv_cache_spec.kv_cache_specs[layer_name]
                total_num_kv_heads = self._get_spec_total_num_kv_heads(kv_cache_spec, layer_idx)
                spec_key = self._get_kv_transfer_spec_key(kv_cache_spec, total_num_kv_heads)
                spec_groups.setdefault(spec_key, []).append((layer_name, layer_idx, kv_cache_spec, total_num_kv_heads))

            if len(spec_groups) > 1:
                logger.info(
                    "Split KV cache manager group %d into %d Mooncake transfer groups by KV spec: %s",
                    kv_cache_group_id,
                    len(spec_groups),
                    list(spec_groups),
                )

            for entries in spec_groups.values():
                layer_names = [layer_name for layer_name, _, _, _ in entries]
                layer_indices = [layer_idx for _, layer_idx, _, _ in entries]
                kv_cache_spec = entries[0][2]
                total_num_kv_heads = entries[0][3]
                kv_group2layeridx[transfer_group_id] = (
                    self._serialize_kv_group_spec(
                        group_spec,
                        layer_names=layer_names,
                        kv_cache_spec=kv_cache_spec,
                        kv_cache_group_id=kv_cache_group_id,
                        total_num_kv_heads=total_num_kv_heads,
                    ),
                    layer_indices,
                )
                transfer_group_id += 1
        return kv_group2layeridx

    def _has_mamba_group(self) -> bool:
        return any(group_spec["kv_cache_spec_type"] == "MambaSpec" for group_spec, _ in self.kv_group2layeridx.values())

    def _requires_group_aware_attention_transfer(self) -> bool:
        total_num_kv_heads = {
            self._get_attention_group_num_key_value_heads(group_spec)
            for group_spec, layer_indices in self.kv_group2layeridx.values()
            if layer_indices and group_spec["kv_cache_spec_type"] != "MambaSpec"
        }
        return len(total_num_kv_heads) > 1

    @staticmethod
    def _as_kv_cache_tuple(kv_cache_tuple: Any) -> list[torch.Tensor]:
        if isinstance(kv_cache_tuple, (list, tuple)):
            return list(kv_cache_tuple)
        return [kv_cache_tuple]

    def _get_layer_spec(self, layer_name: str) -> Any:
        layer_spec = self._layer_specs[layer_name]
        if isinstance(layer_spec, UniformTypeKVCacheSpecs):
            layer_spec = layer_spec.kv_cache_specs[layer_name]
        return layer_spec

    def _get_mamba_conv_padding(self, layer_spec: Any) -> int:
        if not isinstance(layer_spec, MambaSpec):
            return 0
        conv_nbytes = torch.tensor([], dtype=layer_spec.dtypes[0]).element_size()  # type: ignore[misc]
        conv_shape = torch.Size(layer_spec.shapes[0])
        return self.num_blocks * conv_shape.numel() * conv_nbytes

    def _get_registered_kv_tensor_buffers(self, kv_caches: dict[str, torch.Tensor]) -> tuple[list[int], list[int]]:
        ptrs: list[int] = []
        lengths: list[int] = []

        conv_padding = 0
        for kv_cache_tensor in self.kv_cache_config.kv_cache_tensors:
            shared_addrs: list[int] = []
            has_mtp = False
            for layer_name in kv_cache_tensor.shared_by:
                has_mtp = has_mtp or "mtp" in layer_name
                layer_spec = self._get_layer_spec(layer_name)
                conv_padding = max(conv_padding, self._get_mamba_conv_padding(layer_spec))
                for single_kv_cache in self._as_kv_cache_tuple(kv_caches[layer_name]):
                    shared_addrs.append(single_kv_cache.data_ptr())

            if not shared_addrs:
                continue
            base_addr = min(shared_addrs)
            if has_mtp:
                base_addr -= conv_padding
            assert base_addr % (2 * 1024 * 1024) == 0, f"Tensor start addr {base_addr} is not align with 2M."
            ptrs.append(base_addr)
            lengths.append(kv_cache_tensor.size)

        return ptrs, lengths

    def _get_registered_kv_tensor_buffers_hybrid(
        self, kv_caches: dict[str, torch.Tensor]
    ) -> tuple[list[int], list[int]]:
        ptrs: list[int] = []
        lengths: list[int] = []

        for kv_cache_tensor in self.kv_cache_config.kv_cache_tensors:
            shared_addrs: list[int] = []
            for layer_name in kv_cache_tensor.shared_by:
                for single_kv_cache in self._as_kv_cache_tuple(kv_caches[layer_name]):
                    shared_addrs.append(single_kv_cache.data_ptr())

            if not shared_addrs:
                continue
            base_addr = min(shared_addrs)
            assert base_addr % (2 * 1024 * 1024) == 0, f"Tensor start addr {base_addr} is not align with 2M."
            ptrs.append(base_addr)
            lengths.append(kv_cache_tensor.size)

        return ptrs, lengths

    def _get_registered_layer_buffers(self, kv_caches: dict[str, torch.Tensor]) -> tuple[list[int], list[int]]:
        ptrs: list[int] = []
        lengths: list[int] = []

        for kv_cache_tuple in kv_caches.values():
            for single_kv_cache in self._as_kv_cache_tuple(kv_cache_tuple):
                ptrs.append(single_kv_cache.data_ptr())
                lengths.append(single_kv_cache.element_size() * math.prod(single_kv_cache.shape))

        return ptrs, lengths

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        """Register the KV Cache data."""
        self.use_mla = self.vllm_config.model_config.is_deepseek_mla
        self.use_sparse = hasattr(self.vllm_config.model_config.hf_text_config, "index_topk")
        self.enable_sfa_dcp_replicated_indexer = enable_sfa_dcp_replicated_indexer(self.vllm_config)

        self.num_blocks = self.kv_cache_config.num_blocks
        logger.info("num_blocks: %s", self.num_blocks)
        self.kv_caches = kv_caches
        # Maps each KV cache group to its serialized group spec and physical
        # layer indices: {group_id: (group_spec, [layer_idx0, layer_idx1, ...])}.
        self.kv_group2layeridx = self._build_kv_group2layeridx()
        self._is_hma_required = self._is_hma_required or self._requires_group_aware_attention_transfer()
        has_mamba_group = self._has_mamba_group()
        layer_name_to_idx = {
            layer_name: layer_idx
            for _, (group_spec, layer_indices) in self.kv_group2layeridx.items()
            for layer_name, layer_idx in zip(group_spec["layer_names"], layer_indices)
        }
        metadata_layers = max(layer_name_to_idx.values(), default=-1) + 1
        # Per-layer registered KV cache base addresses:
        # [layer_idx][cache_idx] -> data_ptr of one cache tensor, e.g. K/V.
        self.kv_caches_base_addr: list[list[int]] = [[] for _ in range(metadata_layers)]
        # Per-layer block scaling between logical KV blocks and tensor blocks:
        # [layer_idx][cache_idx] -> cache tensor num_blocks / logical num_blocks.
        self.block_size_scale: list[list[int]] = [[] for _ in range(metadata_layers)]
        # Per-layer byte length of one tensor block:
        # [layer_idx][cache_idx] -> element_size * prod(block_shape).
        self.block_len_per_addr: list[list[int]] = [[] for _ in range(metadata_layers)]
        # Per-layer full tensor shape for each registered KV cache address:
        # [layer_idx][cache_idx] -> cache tensor shape, including num_blocks.
        self.block_shape_per_addr: list[list[int]] = [[] for _ in range(metadata_layers)]
        # Per-layer byte stride between consecutive tensor blocks:
        # [layer_idx][cache_idx] -> stride(0) * element_size.
        self.block_stride_per_addr: list[list[int]] = [[] for _ in range(metadata_layers)]

        # TODO: For DSV4 use_compress, metadata/transfer can be optimized by
        # aggregating layer views that share the same raw KVCacheTensor.
        for layer_name, kv_cache_tuple in kv_caches.items():
            layer_idx = layer_name_to_idx[layer_name]
            for single_kv_cache in self._as_kv_cache_tuple(kv_cache_tuple):
                tensor_num_blocks = single_kv_cache.shape[0]
                block_size_scale = tensor_num_blocks // self.num_blocks
                block_shape = single_kv_cache.shape[1:]
                self.block_len_per_addr[layer_idx].append(single_kv_cache.element_size() * math.prod(block_shape))
                self.block_stride_per_addr[layer_idx].append(single_kv_cache.stride(0) * single_kv_cache.element_size())
                self.block_shape_per_addr[layer_idx].append(single_kv_cache.shape)
                self.block_size_scale[layer_idx].append(block_size_scale)
                self.kv_caches_base_addr[layer_idx].append(single_kv_cache.data_ptr())

        if has_mamba_group:
            ptrs, lengths = self._get_registered_kv_tensor_buffers(kv_caches)
            register_regions = RegisterRegions(ptrs=ptrs, lengths=lengths)
        elif self.use_hybrid:
            ptrs, lengths = self._get_registered_kv_tensor_buffers_hybrid(kv_caches)
            register_regions = RegisterRegions(ptrs=ptrs, lengths=lengths)
        else:
            # For normal attention / sparse-c8 KV cache, keep metadata at the
            # logical tensor level but merge registration ranges by underlying
            # storage to avoid exceeding the HCCL per-process region limit.
            register_regions = collect_storage_merged_register_regions(kv_caches)

        validate_register_region_count(register_regions)
        global_te.register_buffer(register_regions.ptrs, register_regions.lengths)

        logger.debug(
            "Mooncake register kv caches metadata: kv_group2layeridx=%s, kv_caches_base_addr=%s, "
            "block_len_per_addr=%s, block_stride_per_addr=%s, block_shape_per_addr=%s, "
            "block_size_scale=%s, ptrs=%s, lengths=%s",
            self.kv_group2layeridx,
            self.kv_caches_base_addr,
            self.block_len_per_addr,
            self.block_stride_per_addr,
            self.block_shape_per_addr,
            self.block_size_scale,
            register_regions.ptrs,
            register_regions.lengths,
        )
        # After KV Caches registered, start the sending or receiving thread.
        metadata = MooncakeAgentMetadata(
            engine_id=self.engine_id,
            te_rpc_port=self.te_rpc_port,
            kv_group2layeridx=self.kv_group2layeridx,
            block_size=self.block_size,
            kv_caches_base_addr=self.kv_caches_base_addr,
            block_size_scale=self.block_size_scale,
            num_blocks=self.num_blocks,
            block_lens=self.block_len_per_addr,
            block_strides=self.block_stride_per_addr,
            local_ip=get_ip(),
            handshake_port=self.handshake_port,
        )
        self.xfer_handshake_metadata = metadata

        ready_event = threading.Event()
        if self.kv_role == "kv_producer":
            self.kv_send_thread = KVCacheSendingThread(
                self.vllm_config,
                self.tp_rank,
                self._prefill_tp_size,
                self.engine_id,
                self.side_channel_host,
                self.side_channel_port,
                metadata,
                ready_event,
                self.kv_caches,
                self.pcp_rank,
            )
            self.kv_send_thread.start()
        else:
            self.kv_recv_thread = KVCacheRecvingThread(
                self.tp_rank,
                self.tp_size,
                self._prefill_pp_size,
                self.engine,
                self.engine_id,
                self.handshake_port,
                self.side_channel_port,
                self.kv_caches_base_addr,
                self.block_len_per_addr,
                self.block_stride_per_addr,
                self._is_hma_required,
                ready_event,
                self.vllm_config,
                self.kv_caches,
                self._prefill_pp_layer_partition,
                self.kv_group2layeridx,
                self.block_size_scale,
            )
            self.kv_recv_thread.start()
        start_wait_time = time.time()
        thread = self.kv_send_thread if self.kv_role == "kv_producer" else self.kv_recv_thread
        assert thread is not None
        while not ready_event.is_set():
            if not thread.is_alive():
                raise RuntimeError("KV Cache sending/receiving thread failed to start.")
            if time.time() - start_wait_time > 5 * 60:
                raise RuntimeError("Timeout waiting for KV Cache thread to be ready.")
            time.sleep(3)

    def get_finished(self) -> tuple[set[str], set[str]]:
        done_sending = (
            self.kv_send_thread.get_and_clear_finished_requests(  # type: ignore[union-attr]
            )
            if self.kv_role == "kv_producer"
            else set()
        )
        done_recving = (
            self.kv_recv_thread.get_and_clear_finished_requests(  # type: ignore[union-attr]
            )
            if self.kv_role == "kv_consumer"
            else set()
        )
        if self.tp_rank == 0:
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "Number of completed KV cache send requests: %d, receive requests: %d",
                    len(done_sending),
                    len(done_recving),
                )
        return done_sending, done_recving

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.kv_role == "kv_consumer" and self.kv_recv_thread is not None:
            return self.kv_recv_thread.get_and_clear_invalid_block_ids()
        return set()

    @staticmethod
    def _expand_block_ids(block_ids, scale):
        # Expand each logical block into its `scale` contiguous kernel blocks:
        # logical block b -> [b*scale, b*scale+1, ..., b*scale+scale-1].
        return [bid * scale + offset for bid in block_ids for offset in range(scale)]

    def _local_kernel_ids_for_shard(
        self,
        shard_first_p_block,
        num_blocks_to_pull,
        shard_cp_rank,
        num_prefix_p_blocks,
        rank_first_d_block,
        block_size_ratio,
        local_cp_size,
        remote_cp_size,
        remote_block_size,
        kernel_size,
        local_block_ids,
    ):
        """Map this shard's pulled P-blocks straight to D-side kernel block ids.

        The shard (CP rank ``shard_cp_rank``) pulls ``num_blocks_to_pull`` P-blocks
        starting at this rank's local index ``shard_first_p_block``. The destination
        kernel position is derived directly from the CP rank and the block index,
        replacing the previous two-step pipeline (local_chunk_token_starts + per-token
        expansion). TP rank does not affect the block id (it only selects ports / the
        head-dim offset at the transfer stage).
        """
        # Number of kernel blocks contained in one D-block (Bd/kernel) and one P-block (Bp/kernel).
        kernels_per_d_block = self.block_size // kernel_size
        kernels_per_p_block = remote_block_size // kernel_size
        # Tokens addressable by this rank's D-blocks; a kernel beyond this has no destination.
        local_token_limit = len(local_block_ids) * self.block_size
        kernel_block_ids: list[int] = []
        for block_idx in range(num_blocks_to_pull):
            # P-blocks are round-robin interleaved across the remote CP ranks, so this rank's
            # block_idx-th pulled block maps to global prompt block (in P-units):
            #   global_p_block = (shard_first_p_block + block_idx) * Rcp + shard_cp_rank
            global_p_block = (shard_first_p_block + block_idx) * remote_cp_size + shard_cp_rank
            if remote_block_size > self.block_size:
                # Bp > Bd (only supported when D-side has no CP): one P-block spans multiple
                # D-blocks, so walk it kernel by kernel via the absolute token offset within
                # the external (post-prefix) zone: p_block_token_start = (p - P0) * Bp.
                p_block_token_start = (global_p_block - num_prefix_p_blocks) * remote_block_size
                for kernel_idx in range(kernels_per_p_block):
                    token_offset = p_block_token_start + kernel_idx * kernel_size
                    if token_offset >= local_token_limit:
                        # P-side tail block is partial; its trailing kernels have no D token.
                        break
                    # Locate the D-block holding this token, then the kernel slot inside it.
                    d_block = local_block_ids[token_offset // self.block_size]
                    kernel_in_d_block = (token_offset % self.block_size) // kernel_size
                    kernel_block_ids.append(d_block * kernels_per_d_block + kernel_in_d_block)
            else:
                # Bd >= Bp: the P-block falls entirely inside one D-block.
                # Global D-block d = p // r (r = Bd/Bp); its index within this rank's local
                # list is (d - rank_first_d_block) // Lcp. The P-block occupies a contiguous
                # run of kernels_per_p_block kernels starting at intra-block kernel offset
                # ((p % r) * Bp) / kernel.
                d_block_local_idx = (global_p_block // block_size_ratio - rank_first_d_block) // local_cp_size
                if d_block_local_idx >= len(local_block_ids):
                    # Pairs with the remote-side truncation when the P-side tail block is partial.
                    continue
                d_block = local_block_ids[d_block_local_idx]
                first_kernel_in_d_block = ((global_p_block % block_size_ratio) * remote_block_size) // kernel_size
                for kernel_idx in range(kernels_per_p_block):
                    kernel_block_ids.append(d_block * kernels_per_d_block + first_kernel_in_d_block + kernel_idx)
        return kernel_block_ids

    @staticmethod
    def _group_compress_ratio(group_spec):
        # Tokens per KV slot for this group (>1 for compressed specs); defaults to 1.
        compress_ratio = 1
        kv_cache_spec = group_spec.get("kv_cache_spec")
        if isinstance(kv_cache_spec, dict):
            for spec in kv_cache_spec.values():
                if isinstance(spec, dict) and isinstance(spec.get("compress_ratio"), int):
                    compress_ratio = max(1, spec["compress_ratio"])
                    break
        return compress_ratio

    @staticmethod
    def _get_kv_cache_group_id(group_idx: int, group_spec: dict[str, Any]) -> int:
        return group_spec.get("kv_cache_group_id", group_idx)

    def _get_kernel_block_ids(self, layer_indices, meta, group_idx, group_spec):
        """No-CP per-group block ids at kernel granularity: (local, remote).

        Mamba state is not block-sharded, so its logical ids pass through unchanged.
        Attention expands both sides to kernel blocks, skips the prefix-cached remote
        kernels (already on D, located via num_computed_tokens), and trims both lists
        to the shorter one so remote/local stay aligned.
        """
        kv_cache_group_id = self._get_kv_cache_group_id(group_idx, group_spec)
        if group_spec["kv_cache_spec_type"] == "MambaSpec":
            return list(meta.local_block_ids[kv_cache_group_id]), list(meta.remote_block_ids[kv_cache_group_id])

        remote_block_size = meta.remote_block_size or self.block_size

        # kernel_size is the shared (P==D) granularity; remote_scale is derived from it.
        local_scale = self.block_size_scale[layer_indices[0]][0]
        kernel_size = self.block_size // local_scale
        assert remote_block_size % kernel_size == 0, (
            f"remote_block_size({remote_block_size}) not divisible by kernel_size({kernel_size})"
        )

        remote_scale = remote_block_size // kernel_size
        kernel_local = self._expand_block_ids(list(meta.local_block_ids[kv_cache_group_id]), local_scale)
        kernel_remote = self._expand_block_ids(list(meta.remote_block_ids[kv_cache_group_id]), remote_scale)
        # Skip prefix-cached remote kernels (D-side already holds them). The token size of one
        # remote kernel is kernel_size * compress_ratio, so the number to skip is
        # num_computed_tokens // (kernel_size * compress_ratio).
        remote_kernel_token_size = kernel_size * self._group_compress_ratio(group_spec)
        remote_start_idx = meta.num_computed_tokens // remote_kernel_token_size
        kernel_remote = kernel_remote[remote_start_idx:]
        num_kernel_blocks = min(len(kernel_remote), len(kernel_local))
        return kernel_local[:num_kernel_blocks], kernel_remote[:num_kernel_blocks]

    def _get_group_kernel_params(self, remote_block_size):
        # Per attention group kernel-expansion params: (local_scale, remote_scale, kernel_size).
        # The kernel size is shared by both sides, so remote_scale is derived locally from it
        # (no remote handshake scale needed). Mamba groups are not block-sharded and skipped.
        group_kernel_params: dict[int, tuple[int, int, int]] = {}
        for group_idx, (group_spec, layer_indices) in self.kv_group2layeridx.items():
            if group_spec["kv_cache_spec_type"] == "MambaSpec":
                continue
            local_scale = self.block_size_scale[layer_indices[0]][0]
            kernel_size = self.block_size // local_scale
            assert remote_block_size % kernel_size == 0, (
                f"remote_block_size({remote_block_size}) not divisible by kernel_size({kernel_size})"
            )
            remote_scale = remote_block_size // kernel_size
            group_kernel_params[group_idx] = (local_scale, remote_scale, kernel_size)
        return group_kernel_params

    def _get_local_remote_cp_params(self, meta: ReqMeta):
        """Resolve CP geometry: (remote_block_size, local_cp_rank, local_cp_size,
        remote_cp_size, r_blk), where r_blk = Bd/Bp (>=1) is the D/P block-size ratio.
        Also validates that P/D block sizes are compatible under D-side CP.
        """
        remote_block_size = meta.remote_block_size or self.block_size
        local_cp_rank = self.dcp_rank + self.pcp_rank * self.dcp_size
        local_cp_size = self.dcp_size * self.pcp_size
        remote_cp_size = meta.remote_pcp_size * meta.remote_dcp_size

        if remote_block_size != self.block_size:
            assert self.block_size % remote_block_size == 0 or remote_block_size % self.block_size == 0, (
                f"Block sizes of P ({remote_block_size}) and D ({self.block_size}) must be divisible by each other."
            )
            if local_cp_size > 1:
                assert self.block_size % remote_block_size == 0, (
                    f"D node DCP not support P node block_size({remote_block_size}) > D block_size({self.block_size})"
                )
                # Ensure that the blocks of each P cp rank belong to the same D rank.
                assert (remote_cp_size // local_cp_size) % (self.block_size // remote_block_size) == 0, (
                    f"remote_cp_size({remote_cp_size}) must be an integer multiple of"
                    f"r({self.block_size // remote_block_size}) * local_cp_size({local_cp_size})"
                )

        r_blk = self.block_size // remote_block_size if self.block_size > remote_block_size else 1
        return remote_block_size, local_cp_rank, local_cp_size, remote_cp_size, r_blk

    def _get_kv_split_metadata(
        self,
        req_id: str,
        meta: ReqMeta,
    ) -> tuple[list[list[int]], list[BlockIds], list[BlockIds]]:
        """Build per-transfer port and block-id metadata for remote KV reads.

        Args:
            req_id: Remote request id used as the stable hash key when choosing
                prefill TP ranks.
            meta: Request-level transfer metadata from the scheduler. It
                contains remote/local block ids, remote P-side port base,
                remote P-side PCP/DCP/PTP sizes, and prompt/prefix-cache
                token counts.

        Returns:
            A tuple of three aligned lists. Index ``i`` describes one transfer
            shard for this local D-side rank:
            * remote_handshake_port_list[i]: remote P worker handshake ports
              to pull from. The inner list length is the number of TP pulls
              needed for that shard.
            * local_block_ids_list[i]: local kernel block ids, grouped by KV cache
              group, where received blocks are written.
            * remote_block_ids_list[i]: remote kernel block ids, grouped by KV cache
              group, where blocks are read from.

        In PCP/DCP scenarios, prompt blocks can be split across multiple remote
        P workers. This method also accounts for unequal P/D prefix-cache hits
        by reducing the number of remote blocks that still need to be pulled.
        """
        prefill_tp_size: int = meta.remote_ptp_size if meta.remote_ptp_size is not None else self._prefill_tp_size

        if meta.remote_pcp_size * meta.remote_dcp_size * self.pcp_size * self.dcp_size == 1:
            if self._is_hma_required:
                chosen_rank_list, _ = self._get_hybrid_remote_rank_group_pulls(req_id, prefill_tp_size)
            else:
                chosen_rank_list = self._get_remote_rank(req_id, prefill_tp_size)

            remote_handshake_port_list = [[x + meta.remote_port for x in chosen_rank_list]]
            # No CP: expand logical blocks into kernel blocks here so the transfer
            # stage consumes kernel-level ids directly (chunk_starts no longer needed).
            local_block_ids: list[list[int]] = [[] for _ in meta.local_block_ids]
            remote_block_ids: list[list[int]] = [[] for _ in meta.remote_block_ids]
            for group_idx, (group_spec, layer_indices) in self.kv_group2layeridx.items():
                local_kernel_block_ids, remote_kernel_block_ids = self._get_kernel_block_ids(
                    layer_indices, meta, group_idx, group_spec
                )
                kv_cache_group_id = self._get_kv_cache_group_id(group_idx, group_spec)
                local_block_ids[kv_cache_group_id] = local_kernel_block_ids
                remote_block_ids[kv_cache_group_id] = remote_kernel_block_ids
            local_block_ids_list = [tuple(local_block_ids) for _ in remote_handshake_port_list]
            remote_block_ids_list = [tuple(remote_block_ids) for _ in remote_handshake_port_list]
            return (
                remote_handshake_port_list,
                local_block_ids_list,
                remote_block_ids_list,
            )

        def context_parallel_parameters_check():
            assert (meta.remote_pcp_size * meta.remote_dcp_size) % (self.pcp_size * self.dcp_size) == 0
            if not (self.use_mla or self.use_sparse):
                p_node_heads_per_rank = math.ceil(self.num_key_value_heads / prefill_tp_size)
                d_node_heads_per_rank = math.ceil(self.num_key_value_heads / self.tp_size)
                assert d_node_heads_per_rank % p_node_heads_per_rank == 0

        def get_kv_head_groups(tp_size):
            if self.use_mla or self.use_sparse:
                kv_head_groups = []
                kv_head_ids = [0]
                kv_head_groups.append(tuple(kv_head_ids))
                return kv_head_groups
            if self.num_key_value_heads // tp_size >= 1:
                kv_head_groups = []
                for tp_rank in range(tp_size):
                    kv_head_ids = [
                        head_idx + tp_rank * (self.num_key_value_heads // tp_size)
                        for head_idx in range(self.num_key_value_heads // tp_size)
                    ]
                    kv_head_groups.append(tuple(kv_head_ids))
                return kv_head_groups
            if tp_size // self.num_key_value_heads > 1:
                kv_head_groups = []
                for kv_head_ids_ in range(self.num_key_value_heads):
                    kv_head_groups.append(tuple([kv_head_ids_]))
                return kv_head_groups

        def get_cp_group_meta(tp_size, pcp_size, dcp_size, port_base):
            # key is kv_head_group, value is cp_groups and which cp_groups to select
            cp_group_meta: dict = {}
            kv_head_groups = get_kv_head_groups(tp_size)
            dcp_repeat_num = tp_size // len(kv_head_groups) // dcp_size

            for kv_head_group_idx, kv_head_group in enumerate(kv_head_groups):
                if kv_head_group not in cp_group_meta:
                    cp_group_meta[kv_head_group] = {}
                    cp_group_meta[kv_head_group]["cp_groups"] = []
                    cp_group_meta[kv_head_group]["select_cp_groups_id"] = 0
                kv_head_group_offset = tp_size // len(kv_head_groups) * kv_head_group_idx
                for dcp_repeat_idx in range(dcp_repeat_num):
                    # len(cp_group) == pcp_size * dcp_size
                    cp_group = []
                    dcp_repeat_offset = dcp_size * dcp_repeat_idx
                    for pcp_rank in range(pcp_size):
                        pcp_rank_offset = tp_size * pcp_rank
                        for dcp_rank in range(dcp_size):
                            cp_group.append(
                                dcp_rank + port_base + pcp_rank_offset + dcp_repeat_offset + kv_head_group_offset
                            )
                    cp_group_meta[kv_head_group]["cp_groups"].append(cp_group)

            return cp_group_meta

        def get_local_remote_block_port_mappings():
            context_parallel_parameters_check()
            p_node_cp_group_meta = get_cp_group_meta(
                prefill_tp_size, meta.remote_pcp_size, meta.remote_dcp_size, meta.remote_port
            )
            d_node_cp_group_meta = get_cp_group_meta(self.tp_size, self.pcp_size, self.dcp_size, self.side_channel_port)
            local_remote_block_port_mappings: dict[int, list[list[int]]] = {}
            for d_node_head_key in d_node_cp_group_meta:
                for p_node_head_key in p_node_cp_group_meta:
                    if not set(p_node_head_key).issubset(set(d_node_head_key)):
                        continue
                    d_node_head_group = d_node_cp_group_meta[d_node_head_key]
                    p_node_head_group = p_node_cp_group_meta[p_node_head_key]
                    for d_cp_group in d_node_head_group["cp_groups"]:
                        select_cp_groups_id = p_node_head_group["select_cp_groups_id"]
                        p_cp_groups = p_node_head_group["cp_groups"]
                        p_cp_group = p_cp_groups[select_cp_groups_id]
                        p_node_head_group["select_cp_groups_id"] = (
                            select_cp_groups_id + 1 if select_cp_groups_id + 1 < len(p_cp_groups) else 0
                        )
                        for d_idx, d_port in enumerate(d_cp_group):
                            if d_port not in local_remote_block_port_mappings:
                                local_remote_block_port_mappings[d_port] = []
                            p_port_remote_list = []
                            for p_idx, p_port in enumerate(p_cp_group):
                                # When Bd == Bp, r_blk = 1, which degenerates to the original `p_idx % Lcp` rule.
                                # When Bd = r * Bp, all blocks of P CP rank q are mapped to D rank `(q // r) % Lcp`.
                                if (p_idx // r_blk) % len(d_cp_group) == d_idx:
                                    p_port_remote_list.append(p_port)
                            local_remote_block_port_mappings[d_port].append(p_port_remote_list)

            logger.info(
                "p_node_cp_group_meta is:: %s. d_node_cp_group_meta is:: %s. "
                "local_remote_block_port_mappings is:: %s. ",
                p_node_cp_group_meta,
                d_node_cp_group_meta,
                local_remote_block_port_mappings,
            )

            return local_remote_block_port_mappings

        def get_remote_port_send_num(
            local_remote_block_port_mappings: dict[int, list[list[int]]],
        ) -> dict[int, RemotePortInfo]:
            remote_port_send_num: dict[int, RemotePortInfo] = {}
            remote_ports: set[int] = set(
                range(meta.remote_port, meta.remote_port + prefill_tp_size * meta.remote_pcp_size)
            )
            kv_port = self.vllm_config.kv_transfer_config.kv_port
            for key, remote_host_info in meta.remote_multi_nodes_meta_mapping.items():
                remote_ports.add(int(remote_host_info.get("handshake_port", kv_port + int(key))))
            for remote_port_head_list in local_remote_block_port_mappings.values():
                for remote_port_list in remote_port_head_list:
                    for remote_port in remote_port_list:
                        remote_ports.add(remote_port)

            for remote_port in remote_ports:
                remote_host, _ = self._get_remote_host_info_by_port(
                    meta.remote_port,
                    remote_port,
                    meta.remote_host,
                    meta.remote_engine_id,
                    meta.remote_multi_nodes_meta_mapping,
                )
                remote_port_send_num[remote_port] = {"num": 0, "host": remote_host}

            for remote_port_head_list in local_remote_block_port_mappings.values():
                for remote_port_list in remote_port_head_list:
                    for remote_port in remote_port_list:
                        remote_port_send_num[remote_port]["num"] += 1
            return remote_port_send_num

        def _set_hma_shared_port(prefill_tp_size, meta, remote_handshake_port_list, req_id):
            """Rewrite remote attention ports for HMA load balancing and append Mamba ports.

            Only applies to HMA (hybrid) non-MLA/non-sparse models. It does two things:

            1. Attention replica balancing. A remote attention port offset decomposes as
               ``kv_head_group_offset + dcp_repeat_offset + dcp_rank``. Within the same head
               group, only the TP replicas that share the same ``dcp_rank`` but differ in
               ``dcp_repeat`` hold the exact same attention KV shard. So substitution is
               restricted to the dcp_repeat (replica) dimension - the head group and dcp_rank
               parts are preserved - otherwise different DCP shards would fetch duplicated KV.
               The replica is picked from the request's random rank choice to spread load.
            2. Mamba port append. The Mamba state lives on a different set of P ranks than the
               attention shards, so the matching Mamba ports are appended to the final shard
               (which carries the Mamba transfer); duplicates are skipped.
            """
            if self._is_hma_required and not (self.use_mla or self.use_sparse):
                remote_dcp = max(meta.remote_dcp_size, 1)
                group_span = prefill_tp_size // len(get_kv_head_groups(prefill_tp_size))
                n_replica = max(group_span // remote_dcp, 1)
                chosen_tp_list = self._get_remote_rank(req_id, prefill_tp_size)
                if n_replica > 1:
                    for shard_ports in remote_handshake_port_list:
                        for i in range(len(shard_ports)):
                            # Decompose the port offset into pcp segment + head-group offset +
                            # dcp part, keeping all of them and only swapping the replica.
                            tp_off = (shard_ports[i] - meta.remote_port) % prefill_tp_size
                            pcp_seg = (shard_ports[i] - meta.remote_port) - tp_off
                            group_off = tp_off // group_span * group_span
                            dcp_part = (tp_off - group_off) % remote_dcp
                            # Determine replica ID using random choice of current request to maintain load balancing.
                            replica = (chosen_tp_list[i % len(chosen_tp_list)] // remote_dcp) % n_replica
                            shard_ports[i] = meta.remote_port + pcp_seg + group_off + replica * remote_dcp + dcp_part
                # Append this D rank's matching Mamba ports to the final shard (the one that
                # carries the Mamba state); k = prefill_tp / decode_tp ports per D rank.
                k = prefill_tp_size // self.tp_size
                final_ports = remote_handshake_port_list[-1]
                pcp_seg = (final_ports[0] - meta.remote_port) // prefill_tp_size * prefill_tp_size
                for j in range(k):
                    p = meta.remote_port + pcp_seg + self.tp_rank * k + j
                    if p not in final_ports:
                        final_ports.append(p)
            return remote_handshake_port_list

        remote_block_size, local_cp_rank, local_cp_size, remote_cp_size, r_blk = self._get_local_remote_cp_params(meta)

        # Per attention group kernel-expansion params. remote_scale is derived locally from
        # the shared kernel size, so no remote handshake scale is needed here.
        group_kernel_params = self._get_group_kernel_params(remote_block_size)

        if meta.remote_engine_id not in self.local_remote_block_port_mapping:
            self.local_remote_block_port_mapping[meta.remote_engine_id] = None

        if self.local_remote_block_port_mapping[meta.remote_engine_id] is None:
            local_remote_block_port_mappings = get_local_remote_block_port_mappings()
            self.local_remote_block_port_mapping[meta.remote_engine_id] = local_remote_block_port_mappings[
                self.handshake_port
            ]
            self.remote_port_send_num[meta.remote_engine_id] = get_remote_port_send_num(
                local_remote_block_port_mappings
            )

        local_remote_block_port_mapping = copy.deepcopy(self.local_remote_block_port_mapping[meta.remote_engine_id])

        num_external_blocks = math.ceil(meta.num_external_tokens / self.block_size)
        num_external_blocks_p = math.ceil(meta.num_external_tokens / remote_block_size)

        kv_group_items = list(self.kv_group2layeridx.items())
        sequence_group_idx = next(
            (
                group_spec.get("kv_cache_group_id", group_idx)
                for group_idx, (group_spec, _) in kv_group_items
                if group_spec["kv_cache_spec_type"] != "MambaSpec"
            ),
            0,
        )
        assert math.ceil(num_external_blocks / (self.pcp_size * self.dcp_size)) == len(
            meta.local_block_ids[sequence_group_idx]
        ), (
            f"num_external_blocks({num_external_blocks}), cp_size({self.pcp_size * self.dcp_size}), "
            f"local_block_ids_len ({len(meta.local_block_ids[sequence_group_idx])})"
        )
        assert meta.num_prompt_blocks >= num_external_blocks_p, (
            f"meta.num_prompt_blocks({meta.num_prompt_blocks}), num_external_blocks({num_external_blocks})"
        )

        remote_block_nums_all = [meta.num_prompt_blocks // remote_cp_size] * remote_cp_size
        num_remain_blocks = meta.num_prompt_blocks % remote_cp_size
        for i in range(num_remain_blocks):
            remote_block_nums_all[i] += 1
        last_block_location = (num_remain_blocks + remote_cp_size - 1) % remote_cp_size

        # Considering prefix cache, the remote_block_nums_all should be revised
        num_prefix_cached_blocks = meta.num_prompt_blocks - num_external_blocks_p
        remote_block_nums_all = [num - num_prefix_cached_blocks // remote_cp_size for num in remote_block_nums_all]
        num_remain_blocks = num_prefix_cached_blocks % remote_cp_size
        for i in range(num_remain_blocks):
            remote_block_nums_all[i] -= 1

        # make sure the last block (which may be unfull) of P nodes is put to the last block of D node
        remote_block_nums: list[int] = []
        shard_cp_ranks: list[int] = []
        final_block_idx: int | None = None

        for cp_rank, block_num in enumerate(remote_block_nums_all):
            # When r_blk = 1, it degrades to the original cp_rank % Lcp rule.
            if (cp_rank // r_blk) % local_cp_size == local_cp_rank:
                if last_block_location == cp_rank:
                    final_block_idx = len(remote_block_nums)
                remote_block_nums.append(block_num)
                shard_cp_ranks.append(cp_rank)

        assert local_remote_block_port_mapping is not None
        if final_block_idx is not None:
            final_block_num = remote_block_nums.pop(final_block_idx)
            shard_cp_ranks.append(shard_cp_ranks.pop(final_block_idx))
            remote_block_nums.append(final_block_num)
            for mapping in local_remote_block_port_mapping:
                final_block_port = mapping.pop(final_block_idx)
                mapping.append(final_block_port)

        # Number of matched P-blocks in the prefix (Note: use P-side unit)
        num_prefix_p_blocks = num_prefix_cached_blocks
        if r_blk > 1:
            # The prefix match granularity for D is Bd = r_blk * Bp, so P0 must be an integer multiple of r_blk.
            assert num_prefix_p_blocks % r_blk == 0, (
                f"P0({num_prefix_p_blocks}) should be  r_blk({r_blk}) integer multiple "
            )

        # The first D-block in the external zone (global block ID in D-units)
        # and the first external D-block owned by this rank.
        num_prefix_d_blocks = num_prefix_p_blocks // r_blk
        first_d = num_prefix_d_blocks + ((local_cp_rank - num_prefix_d_blocks) % local_cp_size)

        remote_handshake_port_list, local_block_ids_list, remote_block_ids_list = [], [], []
        for idx in range(len(local_remote_block_port_mapping[0])):
            mapping_list = []
            for mapping in local_remote_block_port_mapping:
                mapping_list.append(mapping[idx])
            remote_handshake_port_list.append(mapping_list)

        # Attention port TP offset = kv_head_group_offset + dcp_repeat_offset + dcp_rank
        # Within the same head group, only the TP replicas that share the same dcp_rank but have
        # different dcp_repeat hold the exact same attention KV shard. Therefore, substitution is
        # strictly limited to the dcp_repeat (replica) dimension. The head group and dcp_rank parts
        # must be preserved as-is; otherwise, different DCP shards will end up fetching duplicated KV caches.
        remote_handshake_port_list = _set_hma_shared_port(prefill_tp_size, meta, remote_handshake_port_list, req_id)

        # the local_block_ids_list and remote_block_ids_list are related with remote_handshake_port_list
        # such as: local_block_ids_list[[1],[2],[5],[6]], remote_block_ids_list[[1],[1],[1],[1]],
        # remote_handshake_port_list[[30000],[30001],[30004],[30005]]
        # D rank will get remote block 1 in port 30004 and save it in local block 5

        for remote_kv_id in range(len(remote_handshake_port_list)):
            num_blocks_to_pull = remote_block_nums[remote_kv_id]
            # rank-local index of this shard's first external block; used both to slice
            # the remote ids and to derive the matching local kernel positions.
            shard_cp_rank = shard_cp_ranks[remote_kv_id]
            remote_first = (num_prefix_p_blocks - shard_cp_rank + remote_cp_size - 1) // remote_cp_size

            group_remote_block_ids: list[list[int]] = []
            group_local_block_ids: list[list[int]] = []
            is_final_shard = remote_kv_id == len(remote_handshake_port_list) - 1
            for group_idx, (group_spec, _) in kv_group_items:
                if group_spec["kv_cache_spec_type"] == "MambaSpec":
                    # Mamba state is not context-block sharded like attention
                    # KV. Transfer the final state from the final PCP/DCP shard.
                    group_remote_block_ids.append(list(meta.remote_block_ids[group_idx]) if is_final_shard else [])
                    group_local_block_ids.append(list(meta.local_block_ids[group_idx]) if is_final_shard else [])
                    continue
                # Attention: expand to kernel blocks here. Remote is sliced from remote_first
                # (skips this rank's prefix-cached blocks) then expanded; local kernels are
                # located directly from CP rank + block index. This removes the need to pass
                # chunk_starts down to the transfer stage. A shard that pulls nothing has
                # n == 0, so both kernel lists naturally come out empty.
                _, remote_scale, kernel_size = group_kernel_params[group_idx]
                remote_logical = list(
                    meta.remote_block_ids[group_idx][remote_first : remote_first + num_blocks_to_pull]
                )
                kernel_remote = self._expand_block_ids(remote_logical, remote_scale)
                kernel_local = self._local_kernel_ids_for_shard(
                    remote_first,
                    num_blocks_to_pull,
                    shard_cp_rank,
                    num_prefix_p_blocks,
                    first_d,
                    r_blk,
                    local_cp_size,
                    remote_cp_size,
                    remote_block_size,
                    kernel_size,
                    list(meta.local_block_ids[group_idx]),
                )
                num_kernel_blocks = min(len(kernel_remote), len(kernel_local))
                group_remote_block_ids.append(kernel_remote[:num_kernel_blocks])

                group_local_block_ids.append(kernel_local[:num_kernel_blocks])
            remote_block_ids_list.append(tuple(group_remote_block_ids))
            local_block_ids_list.append(tuple(group_local_block_ids))

        tp_num_need_pulls = self._get_tp_num_need_pulls(prefill_tp_size)
        if self._is_hma_required:
            # HMA: The final shard might be padded with Mamba ports;
            # the total port count is permitted to exceed the number required by attention.
            assert len(remote_handshake_port_list[0]) >= tp_num_need_pulls, (
                f"tp_num_need_pulls: {tp_num_need_pulls}, remote_handshake_port_list: {remote_handshake_port_list}"
            )
        else:
            assert tp_num_need_pulls == len(remote_handshake_port_list[0]), (
                f"tp_num_need_pulls: {tp_num_need_pulls}, remote_handshake_port_list: {remote_handshake_port_list}"
            )

        return remote_handshake_port_list, local_block_ids_list, remote_block_ids_list

    def _get_cp_shard_pulls(self, remote_handshake_port_list, prefill_tp_size, remote_base_port, remote_pcp_size):
        # CP case: `group_pulls` is derived from `port` (which already includes the random selection result),
        # eliminating the need for a table lookup.
        mamba_num = prefill_tp_size // self.tp_size
        attn_num = self._get_tp_num_need_pulls(prefill_tp_size)
        attn_gids = [
            g for g, (spec, li) in self.kv_group2layeridx.items() if li and spec["kv_cache_spec_type"] != "MambaSpec"
        ]
        mamba_gids = [
            g for g, (spec, li) in self.kv_group2layeridx.items() if li and spec["kv_cache_spec_type"] == "MambaSpec"
        ]
        num_shards = len(remote_handshake_port_list)
        result = []
        for shard_idx, ports in enumerate(remote_handshake_port_list):
            is_final = shard_idx == num_shards - 1
            shard_pulls = []
            for port_idx, port in enumerate(ports):
                pulls = []
                port_tp = (port - remote_base_port) % prefill_tp_size
                # PCP and PP are mutually exclusive; when PCP > 1, pp_rank is always 0.
                pp_rank = 0 if remote_pcp_size > 1 else (port - remote_base_port) // prefill_tp_size
                # The first attn_num ports of each shard (i.e., the original ports with randomly substituted TPs).
                if port_idx < attn_num:
                    pulls += [
                        GroupPull(
                            group_id=g,
                            remote_tp_offset=port_idx,
                            num_group_pulls=attn_num,
                            prefill_pp_rank=pp_rank,
                            is_group_transfer_end=port_idx == attn_num - 1,
                        )
                        for g in attn_gids
                    ]
                # Mamba: Only applicable to the final shard; the offset is back-calculated from the port's TP ID.
                if is_final:
                    m_off = port_tp - self.tp_rank * mamba_num
                    if 0 <= m_off < mamba_num:
                        pulls += [
                            GroupPull(
                                group_id=g,
                                remote_tp_offset=m_off,
                                num_group_pulls=mamba_num,
                                prefill_pp_rank=pp_rank,
                                is_group_transfer_end=m_off == mamba_num - 1,
                            )
                            for g in mamba_gids
                        ]
                shard_pulls.append(pulls)
            result.append(shard_pulls)
        return result

    def _get_group_pulls_metadata(
        self,
        req_id: str,
        remote_handshake_port_list: list[list[int]],
        prefill_tp_size: int,
        remote_base_port: int,
        remote_pcp_size: int = 1,
        remote_dcp_size: int = 1,
    ) -> list[list[list[GroupPull]]]:
        """Build per-port KV cache group pull descriptors.

        Args:
            req_id: Remote request id used to reproduce hybrid-attention rank
                selection for the same request.
            remote_handshake_port_list: Output from ``_get_kv_split_metadata``.
                Each outer item is one transfer shard; each inner item is a
                remote P worker handshake port.
            prefill_tp_size: Effective remote prefill TP size. This may come
                from ``meta.remote_ptp_size`` when P and D use different TP
                sizes.
            remote_base_port: Remote P-side handshake base port. A remote
                worker rank is ``remote_handshake_port - remote_base_port``.

        Returns:
            A three-level list aligned with ``remote_handshake_port_list``:
            ``result[shard_idx][remote_port_idx]`` is the list of ``GroupPull``
            entries for that remote port. Each ``GroupPull`` identifies the KV
            cache group, the remote TP offset to read, the number of pulls
            needed to assemble that group, the prefill PP rank, and whether
            this pull is the final pull for the group. The final-pull flag is
            used by the receiver to decide when group reformatting can run.
        """
        cp_transfer = remote_pcp_size * remote_dcp_size * self.pcp_size * self.dcp_size > 1
        if self._is_hma_required:
            if not cp_transfer:
                # Non-CP case: port = base + chosen_rank, which has a one-to-one correspondence
                # with the table keys, maintaining the original logic.
                _, rank_group_pulls = self._get_hybrid_remote_rank_group_pulls(req_id, prefill_tp_size)
                return [[rank_group_pulls[p - remote_base_port] for p in ports] for ports in remote_handshake_port_list]

            # CP case: `group_pulls` is derived from `port` (which already includes the random selection result),
            # eliminating the need for a table lookup.
            return self._get_cp_shard_pulls(
                remote_handshake_port_list, prefill_tp_size, remote_base_port, remote_pcp_size
            )

        tp_num_need_pulls = self._get_tp_num_need_pulls(prefill_tp_size)
        group_ids = [group_id for group_id, (_, layer_indices) in self.kv_group2layeridx.items() if layer_indices]

        def make_group_pulls(remote_tp_offset: int, prefill_pp_rank: int) -> list[GroupPull]:
            return [
                GroupPull(
                    group_id=group_id,
                    remote_tp_offset=remote_tp_offset,
                    num_group_pulls=tp_num_need_pulls,
                    prefill_pp_rank=prefill_pp_rank,
                    is_group_transfer_end=remote_tp_offset == tp_num_need_pulls - 1,
                )
                for group_id in group_ids
            ]

        group_pulls_list = []
        for pcp_dcp_rank, remote_ports in enumerate(remote_handshake_port_list):
            if len(remote_ports) == 1:
                remote_tp_offsets = [pcp_dcp_rank % tp_num_need_pulls]
                prefill_pp_ranks = [
                    ((remote_ports[0] - remote_base_port) % (prefill_tp_size * self._prefill_pp_size))
                    // prefill_tp_size
                ]
            else:
                assert len(remote_ports) % tp_num_need_pulls == 0, (
                    f"tp_num_need_pulls: {tp_num_need_pulls}, remote_ports: {remote_ports}"
                )
                remote_tp_offsets = [rank_idx % tp_num_need_pulls for rank_idx in range(len(remote_ports))]
                prefill_pp_ranks = [
                    ((remote_port - remote_base_port) % (prefill_tp_size * self._prefill_pp_size)) // prefill_tp_size
                    for remote_port in remote_ports
                ]
            group_pulls_list.append(
                [
                    make_group_pulls(remote_tp_offset, prefill_pp_rank)
                    for remote_tp_offset, prefill_pp_rank in zip(remote_tp_offsets, prefill_pp_ranks)
                ]
            )
        return group_pulls_list

    def _get_hybrid_remote_rank_group_pulls(
        self,
        req_id: str,
        prefill_tp_size: int,
    ) -> tuple[list[int], dict[int, list[GroupPull]]]:
        rank_group_pulls: OrderedDict[int, list[GroupPull]] = OrderedDict()

        def add_group_pull(remote_rank: int, group_pull: GroupPull) -> None:
            rank_group_pulls.setdefault(remote_rank, []).append(group_pull)

        for group_id, (group_spec, layer_indices) in self.kv_group2layeridx.items():
            if not layer_indices:
                continue

            if group_spec["kv_cache_spec_type"] == "MambaSpec":
                assert prefill_tp_size % self.tp_size == 0, (
                    f"Hybrid Mamba prefill tp size({prefill_tp_size}) must be divisible by "
                    f"decode tp size({self.tp_size})."
                )
                num_group_pulls = prefill_tp_size // self.tp_size
                for pp_rank in range(self._prefill_pp_size):
                    pp_rank_offset = pp_rank * prefill_tp_size
                    local_tp_offset = self.tp_rank * num_group_pulls
                    for remote_tp_offset in range(num_group_pulls):
                        remote_rank = pp_rank_offset + local_tp_offset + remote_tp_offset
                        add_group_pull(
                            remote_rank,
                            GroupPull(
                                group_id=group_id,
                                remote_tp_offset=remote_tp_offset,
                                num_group_pulls=num_group_pulls,
                                prefill_pp_rank=pp_rank,
                                is_group_transfer_end=remote_tp_offset == num_group_pulls - 1,
                            ),
                        )
                continue

            num_group_pulls = self._get_attention_group_num_need_pulls(group_spec, prefill_tp_size)
            chosen_rank_list = self._get_attention_group_remote_rank(req_id, group_spec, prefill_tp_size)
            assert len(chosen_rank_list) == num_group_pulls * self._prefill_pp_size, (
                f"chosen_rank_list({chosen_rank_list}) does not match num_group_pulls({num_group_pulls}) "
                f"and prefill pp size({self._prefill_pp_size})."
            )
            for rank_idx, remote_rank in enumerate(chosen_rank_list):
                prefill_pp_rank = rank_idx // num_group_pulls
                add_group_pull(
                    remote_rank,
                    GroupPull(
                        group_id=group_id,
                        remote_tp_offset=rank_idx % num_group_pulls,
                        num_group_pulls=num_group_pulls,
                        prefill_pp_rank=prefill_pp_rank,
                        is_group_transfer_end=rank_idx % num_group_pulls == num_group_pulls - 1,
                    ),
                )

        return list(rank_group_pulls), dict(rank_group_pulls)

    def _get_attention_group_num_need_pulls(self, group_spec: dict[str, Any], prefill_tp_size: int) -> int:
        return self._get_attention_group_num_need_pulls_for_decode_tp(group_spec, prefill_tp_size, self.tp_size)

    def _get_attention_group_num_need_pulls_for_decode_tp(
        self,
        group_spec: dict[str, Any],
        prefill_tp_size: int,
        decode_tp_size: int,
    ) -> int:
        num_key_value_heads = self._get_attention_group_num_key_value_heads(group_spec)
        num_d_block_heads = max(1, num_key_value_heads // decode_tp_size)
        num_p_block_heads = max(1, num_key_value_heads // prefill_tp_size)
        return num_d_block_heads // num_p_block_heads

    def _get_attention_group_num_key_value_heads(self, group_spec: dict[str, Any]) -> int:
        kv_cache_spec = group_spec.get("kv_cache_spec", {})
        if isinstance(kv_cache_spec, dict):
            for key in ("total_num_kv_heads", "num_kv_heads", "num_key_value_heads"):
                num_key_value_heads = kv_cache_spec.get(key)
                if isinstance(num_key_value_heads, int):
                    return num_key_value_heads
            for spec in kv_cache_spec.values():
                if not isinstance(spec, dict):
                    continue
                for key in ("total_num_kv_heads", "num_kv_heads", "num_key_value_heads"):
                    num_key_value_heads = spec.get(key)
                    if isinstance(num_key_value_heads, int):
                        return num_key_value_heads
        return self.num_key_value_heads

    def _get_attention_group_remote_rank(
        self,
        req_id: str,
        group_spec: dict[str, Any],
        prefill_tp_size: int,
    ) -> list[int]:
        num_key_value_heads = self._get_attention_group_num_key_value_heads(group_spec)
        num_group_pulls = self._get_attention_group_num_need_pulls(group_spec, prefill_tp_size)
        return self._get_remote_ranks_for_req(
            req_id,
            prefill_tp_size,
            num_key_value_heads=num_key_value_heads,
            tp_num_need_pulls=num_group_pulls,
            use_mla=num_key_value_heads == 1,
        )[self.tp_rank]

    def _get_sfa_replicate_k_block_ids(
        self,
        meta: ReqMeta,
    ) -> tuple[BlockIds, BlockIds]:
        if not self.enable_sfa_dcp_replicated_indexer:
            return tuple(), tuple()
        if meta.num_external_tokens <= 0 or not meta.remote_block_ids or not meta.local_block_ids:
            return tuple(), tuple()

        if len(meta.remote_block_ids) != 1 or len(meta.local_block_ids) != 1:
            raise AssertionError(
                "SFA replicate-K currently expects exactly one KV cache group. "
                f"Got remote groups={len(meta.remote_block_ids)}, local groups={len(meta.local_block_ids)}."
            )

        remote_cp_size = meta.remote_pcp_size * meta.remote_dcp_size
        local_cp_size = self.pcp_size * self.dcp_size
        if local_cp_size == 0 or remote_cp_size % local_cp_size != 0:
            raise AssertionError(
                f"SFA replicate-K expects remote cp size({remote_cp_size}) to be divisible by "
                f"local cp size({local_cp_size})."
            )

        num_prefix_cached_blocks = min(meta.num_computed_tokens // self.block_size, meta.num_prompt_blocks)
        num_external_blocks = meta.num_prompt_blocks - num_prefix_cached_blocks
        num_external_blocks_from_tokens = math.ceil(meta.num_external_tokens / self.block_size)
        if num_external_blocks < num_external_blocks_from_tokens:
            raise AssertionError(
                f"num_external_blocks({num_external_blocks}) derived from num_computed_tokens "
                f"must cover num_external_blocks_from_tokens({num_external_blocks_from_tokens})."
            )

        if num_prefix_cached_blocks > 0 and not meta.local_full_block_ids:
            raise AssertionError("SFA replicate-K requires full local block ids when prefix cache is used.")

        remote_blocks = list(meta.remote_block_ids[0])
        local_full_blocks = list((meta.local_full_block_ids or meta.local_block_ids)[0])
        if not local_full_blocks:
            return tuple(), tuple()

        local_block_ids: list[int] = []
        remote_block_ids: list[int] = []
        for global_block_idx in range(num_prefix_cached_blocks, meta.num_prompt_blocks):
            remote_local_idx = global_block_idx // remote_cp_size
            local_local_idx = global_block_idx // local_cp_size
            if remote_local_idx >= len(remote_blocks) or local_local_idx >= len(local_full_blocks):
                break
            remote_block_ids.append(
                int(remote_blocks[remote_local_idx]) * remote_cp_size + global_block_idx % remote_cp_size
            )
            local_block_ids.append(
                int(local_full_blocks[local_local_idx]) * local_cp_size + global_block_idx % local_cp_size
            )

        local_block_ids = local_block_ids[:num_external_blocks]
        remote_block_ids = remote_block_ids[: len(local_block_ids)]
        local_block_ids = local_block_ids[: len(remote_block_ids)]

        logger.debug(
            "Mooncake SFA replicate-K block ids prepared from aligned full blocks. "
            "remote_cp_size=%s local_cp_size=%s num_prompt_blocks=%s num_computed_tokens=%s "
            "num_external_blocks=%s local_len=%s remote_len=%s",
            remote_cp_size,
            local_cp_size,
            meta.num_prompt_blocks,
            meta.num_computed_tokens,
            num_external_blocks,
            len(local_block_ids),
            len(remote_block_ids),
        )

        return (local_block_ids,), (remote_block_ids,)

    def start_load_kv(self, metadata: MooncakeConnectorMetadata):
        """Start loading KV blocks from remote engine."""
        for req_id in metadata.reqs_in_batch:
            if self.kv_send_thread is not None:
                self.kv_send_thread.task_tracker.add_req_to_process(req_id)
            if self.kv_recv_thread is not None:
                self.kv_recv_thread.task_tracker.add_req_to_process(req_id)

        for req_id, meta in metadata.requests.items():
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug(
                    "start_load_kv for request %s from remote engine %s. "
                    "Num local_block_ids: %s. Num remote_block_ids: %s. ",
                    req_id,
                    meta.remote_engine_id,
                    len(meta.local_block_ids),
                    len(meta.remote_block_ids),
                )

            remote_req_id = meta.remote_request_id
            prefill_tp_size: int = meta.remote_ptp_size if meta.remote_ptp_size is not None else self._prefill_tp_size
            (
                local_block_ids_replicate_k,
                remote_block_ids_replicate_k,
            ) = self._get_sfa_replicate_k_block_ids(meta)

            (
                remote_handshake_port_list,
                local_block_ids_list,
                remote_block_ids_list,
            ) = self._get_kv_split_metadata(remote_req_id, meta)
            has_replicate_k_blocks = any(local_block_ids_replicate_k) and any(remote_block_ids_replicate_k)
            remote_transfer_ports = [port for remote_ports in remote_handshake_port_list for port in remote_ports]
            if has_replicate_k_blocks and not remote_transfer_ports:
                raise AssertionError("SFA replicate-K requires at least one normal KV transfer port.")
            replicate_k_transfer_port = remote_transfer_ports[0] if has_replicate_k_blocks else None
            group_pulls_list = self._get_group_pulls_metadata(
                remote_req_id,
                remote_handshake_port_list,
                prefill_tp_size,
                meta.remote_port,
                meta.remote_pcp_size,
                meta.remote_dcp_size,
            )

            for pcp_dcp_rank, remote_ports in enumerate(remote_handshake_port_list):
                for remote_tp_offset, remote_handshake_port in enumerate(remote_ports):
                    assert self.kv_recv_thread is not None
                    remote_host, remote_engine_id = self._get_remote_host_info_by_port(
                        meta.remote_port,
                        remote_handshake_port,
                        meta.remote_host,
                        meta.remote_engine_id,
                        meta.remote_multi_nodes_meta_mapping,
                    )
                    remote_port_send_num = (
                        self.remote_port_send_num[meta.remote_engine_id]
                        if meta.remote_pcp_size * meta.remote_dcp_size > 1
                        else None
                    )
                    local_block_ids_replicate_k_for_port = (
                        local_block_ids_replicate_k
                        if replicate_k_transfer_port is not None and remote_handshake_port == replicate_k_transfer_port
                        else None
                    )
                    remote_block_ids_replicate_k_for_port = (
                        remote_block_ids_replicate_k
                        if replicate_k_transfer_port is not None and remote_handshake_port == replicate_k_transfer_port
                        else None
                    )
                    self.kv_recv_thread.add_request(
                        request_id=req_id,
                        remote_request_id=remote_req_id,
                        local_block_ids=local_block_ids_list[pcp_dcp_rank],
                        remote_block_ids=remote_block_ids_list[pcp_dcp_rank],
                        group_pulls=group_pulls_list[pcp_dcp_rank][remote_tp_offset],
                        remote_engine_id=remote_engine_id,
                        remote_host=remote_host,
                        remote_handshake_port=remote_handshake_port,
                        remote_port_send_num=remote_port_send_num,
                        num_computed_tokens=meta.num_computed_tokens,
                        all_task_done=(
                            pcp_dcp_rank == len(remote_handshake_port_list) - 1
                            and remote_tp_offset == len(remote_ports) - 1
                        ),
                        shard_idx=pcp_dcp_rank,
                        remote_block_size=meta.remote_block_size,
                        local_block_ids_replicate_k=local_block_ids_replicate_k_for_port,
                        remote_block_ids_replicate_k=remote_block_ids_replicate_k_for_port,
                    )

        if self.kv_send_thread is not None and self.pcp_size * self.dcp_size == 1:
            for req_id, delay_start_time in metadata.requests_to_send.items():
                if self.tp_rank in self._prefill_get_remote_rank(req_id):
                    self.kv_send_thread.add_delayed_request(req_id, delay_start_time)
                else:
                    self.kv_send_thread.add_not_transfer_request(req_id)

        if self.kv_send_thread is not None and self.pcp_size * self.dcp_size > 1:
            for req_id, delay_start_time in metadata.requests_to_send.items():
                self.kv_send_thread.add_delayed_request(req_id, delay_start_time)

    def _get_tp_num_need_pulls(self, prefill_tp_size: int | None) -> int:
        if prefill_tp_size is None:
            prefill_tp_size = self._prefill_tp_size

        if prefill_tp_size == self._prefill_tp_size:
            return self.tp_num_need_pulls

        if self.vllm_config.model_config.is_deepseek_mla:
            tp_num_need_pulls = 1
        else:
            num_d_block_heads = max(1, self.num_key_value_heads // self.tp_size)
            num_p_block_heads = max(1, self.num_key_value_heads // prefill_tp_size)
            tp_num_need_pulls = num_d_block_heads // num_p_block_heads
        return tp_num_need_pulls

    def _get_remote_host_info_by_port(
        self,
        base_port: int,
        remote_handshake_port: int,
        remote_host: str,
        remote_engine_id: str,
        remote_multi_nodes_meta_mapping: dict,
    ):
        if remote_multi_nodes_meta_mapping is None:
            return remote_host, remote_engine_id

        kv_port = self.vllm_config.kv_transfer_config.kv_port
        rank = str(remote_handshake_port - kv_port)
        info = remote_multi_nodes_meta_mapping.get(rank)
        if info is None:
            rank = str(remote_handshake_port - base_port)
            info = remote_multi_nodes_meta_mapping.get(rank)
        if info is None:
            return remote_host, remote_engine_id
        return info.get("host", remote_host), info.get("engine_id", remote_engine_id)

    def _prefill_get_remote_rank(self, req_id: str) -> list[int]:
        if self._is_hma_required:
            prefill_ranks: set[int] = set()
            for group_spec, layer_indices in self.kv_group2layeridx.values():
                if layer_indices:
                    prefill_ranks.update(self._get_prefill_ranks_for_group(req_id, group_spec))
            return sorted(prefill_ranks)
        return sum(self._get_remote_ranks_for_req(req_id), [])

    def _get_prefill_ranks_for_group(self, req_id: str, group_spec: dict[str, Any]) -> set[int]:
        if group_spec["kv_cache_spec_type"] == "MambaSpec":
            assert self._prefill_tp_size % self._decode_tp_size == 0, (
                f"Hybrid Mamba prefill tp size({self._prefill_tp_size}) must be divisible by "
                f"decode tp size({self._decode_tp_size})."
            )
            return set(range(self._prefill_tp_size * self._prefill_pp_size))

        num_key_value_heads = self._get_attention_group_num_key_value_heads(group_spec)
        num_group_pulls = self._get_attention_group_num_need_pulls_for_decode_tp(
            group_spec,
            self._prefill_tp_size,
            self._decode_tp_size,
        )
        remote_ranks_by_decode_rank = self._get_remote_ranks_for_req(
            req_id,
            self._prefill_tp_size,
            num_key_value_heads=num_key_value_heads,
            tp_num_need_pulls=num_group_pulls,
            use_mla=num_key_value_heads == 1,
        )
        return {rank for remote_ranks in remote_ranks_by_decode_rank for rank in remote_ranks}

    def _get_remote_rank(self, req_id: str, prefill_tp_size: int | None = None) -> list[int]:
        return self._get_remote_ranks_for_req(req_id, prefill_tp_size)[self.tp_rank]

    def _get_remote_tp_ranks(
        self,
        tp_ori_data: np.ndarray,
        rand_group_index: list[int],
        num_groups: int,
        prefill_tp_size: int,
        num_key_value_heads: int,
        tp_num_need_pulls: int,
        use_mla: bool,
    ) -> list[list[int]]:
        # random split prefill tp list
        tp_sampled_nums = []
        if prefill_tp_size > num_key_value_heads or use_mla or self.use_sparse:
            tp_ori_data = tp_ori_data.reshape(-1, num_groups)
            chosen_group = tp_ori_data[:, [rand_group_index]]
            flattened = chosen_group.reshape(-1).tolist()
            tp_sampled_nums = [
                flattened[i : i + tp_num_need_pulls] for i in range(0, len(flattened), tp_num_need_pulls)
            ]
        # non-random split
        else:
            group_size = prefill_tp_size // self._decode_tp_size
            for i in range(self._decode_tp_size):
                slice = tp_ori_data[i * group_size : (i + 1) * group_size]
                tp_sampled_nums.append(slice.tolist())
        return tp_sampled_nums

    def _get_remote_ranks_for_req(
        self,
        req_id: str,
        prefill_tp_size: int | None = None,
        num_key_value_heads: int | None = None,
        tp_num_need_pulls: int | None = None,
        use_mla: bool | None = None,
    ) -> list[list[int]]:
        if prefill_tp_size is None:
            prefill_tp_size = self._prefill_tp_size
        if num_key_value_heads is None:
            if self.vllm_config.model_config.is_deepseek_mla or self.use_sparse:
                num_key_value_heads = 1
            else:
                num_key_value_heads = self.num_key_value_heads
        if tp_num_need_pulls is None:
            tp_num_need_pulls = self._get_tp_num_need_pulls(prefill_tp_size)
        if use_mla is None:
            use_mla = self.vllm_config.model_config.is_deepseek_mla

        # Divide the ports according to the TP within the PP
        sampled_nums = []
        if prefill_tp_size == self._decode_tp_size:
            sampled_nums = list(
                map(
                    lambda tp: [tp + pp * prefill_tp_size for pp in range(self._prefill_pp_size)],
                    range(prefill_tp_size),
                )
            )
            return sampled_nums
        num_kv_head = num_key_value_heads
        ori_data = np.arange(prefill_tp_size * self._prefill_pp_size)
        seed = string_to_int64_hash(req_id)
        rand = random.Random(seed)
        # random split prefill tp list
        ori_data_2d = ori_data.reshape(self._prefill_pp_size, -1)
        num_groups = max(
            1, len(ori_data_2d[0]) // num_kv_head
        )  # The number of redundant copies for each KV head within the PP stage
        rand_group_index = rand.sample(
            range(num_groups), (max(self._decode_tp_size // num_kv_head, 1))
        )  # random choose a group
        all_results = [
            self._get_remote_tp_ranks(
                ori_data_2d[pp_index],
                rand_group_index,
                num_groups,
                prefill_tp_size,
                num_key_value_heads,
                tp_num_need_pulls,
                use_mla,
            )
            for pp_index in range(self._prefill_pp_size)
        ]
        for group_index in range(len(all_results[0])):
            group = []
            for pp_index in range(self._prefill_pp_size):
                group.extend(all_results[pp_index][group_index])
            sampled_nums.append(group)
        return sampled_nums


@contextlib.contextmanager
def zmq_ctx(socket_type: Any, addr: str) -> Iterator[zmq.Socket]:  # type: ignore
    """Context manager for a ZMQ socket"""

    if socket_type not in (zmq.ROUTER, zmq.REQ, zmq.DEALER):  # type: ignore
        raise ValueError(f"Unexpected socket type: {socket_type}")

    ctx: zmq.Context | None = None  # type: ignore
    try:
        ctx = zmq.Context()  # type: ignore
        yield make_zmq_socket(ctx=ctx, path=addr, socket_type=socket_type, bind=socket_type == zmq.ROUTER)  # type: ignore
    finally:
        if ctx is not None:
            ctx.destroy(linger=0)


def group_concurrent_contiguous(
    src: list[int],
    dst: list[int],
    src_block_stride: int = 1,
    dst_block_stride: int = 1,
    block_len: int = 1,
) -> tuple[list[list[int]], list[list[int]]]:
    """Group block ids that are contiguous in both id space and memory."""
    src_indices: npt.NDArray[np.int64] = np.array(src, dtype=np.int64)
    dst_indices: npt.NDArray[np.int64] = np.array(dst, dtype=np.int64)

    if src_indices.size == 0:
        return [], []

    src_byte_contiguous = np.diff(src_indices) * src_block_stride == block_len
    dst_byte_contiguous = np.diff(dst_indices) * dst_block_stride == block_len
    brk = np.where(~(src_byte_contiguous & dst_byte_contiguous))[0] + 1
    src_groups = np.split(src_indices, brk)
    dst_groups = np.split(dst_indices, brk)

    src_groups = [g.tolist() for g in src_groups]
    dst_groups = [g.tolist() for g in dst_groups]

    return src_groups, dst_groups


def split_if_not_byte_contiguous(
    src_groups: list[list[int]],
    dst_groups: list[list[int]],
    src_block_stride: int,
    dst_block_stride: int,
    block_len: int,
) -> tuple[list[list[int]], list[list[int]]]:
    if src_block_stride == block_len and dst_block_stride == block_len:
        return src_groups, dst_groups

    src = [bid for group in src_groups for bid in group]
    dst = [bid for group in dst_groups for bid in group]
    return group_concurrent_contiguous(
        src,
        dst,
        src_block_stride=src_block_stride,
        dst_block_stride=dst_block_stride,
        block_len=block_len,
    )


def string_to_int64_hash(input_str):
    """
    Hash the string using SHA-256 and convert it into an int64 integer.
    """
    hashed_bytes = hashlib.sha256(input_str.encode("utf-8")).digest()
    trunked_bytes = hashed_bytes[:8]
    uint64_value = struct.unpack("<Q", trunked_bytes)[0]
    return uint64_value


def ensure_zmq_send(
    socket: zmq.Socket,  # type: ignore
    data: bytes,
    path: str,
    max_retries: int = 3,
):
    retries_left = max_retries
    while True:
        try:
            socket.send(data)
            return
        except zmq.ZMQError as e:  # type: ignore
            retries_left -= 1
            if retries_left > 0:
                logger.warning("Send failed. error=%s, attempts_left=%d. ", e, retries_left)
                time.sleep(0.1)
            else:
                logger.error("Send failed after all retries. error=%s. ", e)
                raise RuntimeError(f"Failed to send data to {path} after {max_retries} retries: {e}")


def ensure_zmq_recv(
    socket: zmq.Socket,  # type: ignore
    path: str,
    max_retries: int = 3,
) -> bytes:
    retries_left = max_retries
    while True:
        try:
            return socket.recv()
        except zmq.ZMQError as e:  # type: ignore
            retries_left -= 1
            if retries_left > 0:
                logger.warning("Receive failed. error=%s, attempts_left=%d. ", e, retries_left)
                time.sleep(0.1)
            else:
                logger.error("Receive failed after all retries. source=%s, error=%s. ", path, e)
                raise RuntimeError(f"Failed to receive data after {max_retries} retries: {e}")


# decode node should know pp_partition_layer in prefill node,
# it is configured in kv_transfer_config by partition_list_str,
# default using vllm layer split algorithm.
def get_prefill_pp_indices(
    num_hidden_layers: int, pp_rank: int, pp_size: int, partition_list_str: str | None = None
) -> tuple[int, int]:
    if partition_list_str is None:
        return get_pp_indices(num_hidden_layers, pp_rank, pp_size)
    else:
        try:
            partitions = [int(layer) for layer in partition_list_str.split(",")]
        except ValueError as err:
            raise ValueError("Invalid partition string: {}".format(partition_list_str)) from err
        if len(partitions) != pp_size:
            raise ValueError(f"{len(partitions)=} does not match {pp_size=}.")
        if sum(partitions) != num_hidden_layers:
            raise ValueError(f"{sum(partitions)=} does not match {num_hidden_layers=}.")
        start_layer = sum(partitions[:pp_rank])
        end_layer = start_layer + partitions[pp_rank]
        return (start_layer, end_layer)
