"""Shape checks of the engine answers the proxy uses, before it uses them.

An engine answer the proxy reads (not only relays) is checked here first; one that does not have the
shape is that instance's failure, never an exception in the proxy and never passed on:

- **the prefill answer** (:func:`prefill_answer`): a JSON object whose ``kv_transfer_params`` is an
  object with ``do_remote_prefill: true`` and every member the decode's KV connector reads to pull the
  KV (:data:`HANDOVER_MEMBERS`). Without them the decode would not load the KV (vLLM 0.23.0 logs "Got
  invalid KVTransferParams" and computes the whole prompt again) or would fail the request, so a prefill
  fault would reach the client as the decode's 4xx/5xx. The proxy retries such a prefill elsewhere and,
  with none left, answers 502 (forward.py);
- **decode events and answers** the proxy reads for recomputes, migration and usage (:func:`usable_event`):
  objects whose ``choices`` is a list of objects with text fields that are strings;
- the health loop's ``/metrics`` and ``/v1/models`` (health.py) read at most :data:`MAX_SCRAPE_BYTES`.

The members of ``kv_transfer_params`` are those both connectors the kit runs announce and read, with the
types they announce them in:

- vLLM 0.23.0 ``NixlConnector`` (the local stack): ``NixlConnectorScheduler.request_finished``
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl/scheduler.py) answers ``do_remote_prefill``,
  ``do_remote_decode``, ``remote_block_ids`` (one list of block ids per KV cache group), ``remote_engine_id``,
  ``remote_request_id``, ``remote_host``, ``remote_port``, ``tp_size``, ``remote_num_tokens``; the decode's
  ``update_state_after_alloc`` pulls only when ``remote_block_ids`` is there and ``remote_engine_id``,
  ``remote_request_id``, ``remote_host`` and ``remote_port`` are all present, and ``add_new_req_to_recv``
  (nixl/metadata.py) indexes them;
- vLLM-Ascend v0.23.0 ``MooncakeConnector``: ``MooncakeConnectorScheduler.request_finished``
  (vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py) answers the same five plus
  ``remote_pcp_size``, ``remote_dcp_size``, ``remote_ptp_size``, ``last_token_id``,
  ``remote_multi_nodes_meta_mapping``, ``num_prompt_blocks``, ``remote_block_size``; its
  ``update_state_after_alloc`` has the same rule and ``MooncakeConnectorMetadata.add_new_req`` indexes
  the five (the others are read with defaults).

Every other member is passed to decode unchanged.
"""

from __future__ import annotations

from typing import Any

from ascend_runtime.proxy.boundedjson import JsonError, load_json

#: What the decode's KV connector needs from the prefill answer's ``kv_transfer_params``: member -> what
#: it must be (the module docstring names the sources).
HANDOVER_MEMBERS: dict[str, str] = {
    "remote_engine_id": "a string",
    "remote_request_id": "a string",
    "remote_host": "a non-empty string",
    "remote_port": "a port number (1..65535)",
    "remote_block_ids": "a list of block ids, or of lists of them (one per KV cache group)",
}
#: Bytes the health loop reads of an instance's ``/metrics`` or ``/v1/models`` answer (a vLLM 0.23.0
#: ``/metrics`` of a DP-32 instance is well under 1 MiB); a longer answer is a failed read.
MAX_SCRAPE_BYTES = 16 << 20
#: Characters of an answer quoted in a failure message.
_QUOTE = 80


class BadAnswer(ValueError):
    """An engine answer the proxy cannot use; ``str()`` says what is wrong with it.

    ``kind``: the label of ``ascend_proxy_retries_total{reason}`` the failed attempt is counted under:
    ``no_kv_handover`` (an answer without ``kv_transfer_params``: the instance runs no KV connector) or
    ``bad_answer`` (any other shape).
    """

    def __init__(self, message: str, kind: str = "bad_answer") -> None:
        super().__init__(message)
        self.kind = kind


def _quote(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _QUOTE else text[:_QUOTE] + "..."


def _is_int(value: Any) -> bool:
    return type(value) is int


def _member_problem(name: str, value: Any) -> bool:
    """Whether ``value`` is not what member ``name`` of :data:`HANDOVER_MEMBERS` must be."""
    if name in ("remote_engine_id", "remote_request_id"):
        return not isinstance(value, str)
    if name == "remote_host":
        return not isinstance(value, str) or not value
    if name == "remote_port":
        return not (_is_int(value) and 1 <= value <= 65535)
    # remote_block_ids: ids (NixlConnector before KV cache groups) or one list of ids per group
    return not isinstance(value, list) or not all(
        _is_int(b) or (isinstance(b, list) and all(_is_int(i) for i in b)) for b in value)


def handover_problem(kv: Any) -> tuple[str, str] | None:
    """(retries label, what is wrong) of a prefill answer's ``kv_transfer_params`` value, or None when the
    decode's connector can pull the KV it announces."""
    if kv is None or kv == {}:
        return ("no_kv_handover", "prefill answered without kv_transfer_params: its KV connector handed no KV "
                "over (check the instance's --kv-transfer-config: a connector with kv_role kv_producer or kv_both)")
    if not isinstance(kv, dict):
        return "bad_answer", f"prefill answered kv_transfer_params that is not an object: {_quote(kv)}"
    if kv.get("do_remote_prefill") is not True:
        return ("bad_answer", "prefill answered kv_transfer_params without do_remote_prefill: true (no KV to pull): "
                f"{_quote(kv.get('do_remote_prefill'))}")
    missing = [m for m in HANDOVER_MEMBERS if m not in kv]
    if missing:
        return ("bad_answer", f"prefill answered kv_transfer_params without {', '.join(missing)}, which the decode's "
                "KV connector needs to pull the KV")
    for name, want in HANDOVER_MEMBERS.items():
        if _member_problem(name, kv[name]):
            return "bad_answer", f"prefill answered kv_transfer_params.{name} that is not {want}: {_quote(kv[name])}"
    return None


def prefill_answer(body: bytes) -> dict[str, Any]:
    """The prefill's 200 answer ``body`` (JSON bytes) as an object whose ``kv_transfer_params`` the decode can
    use; :class:`BadAnswer` otherwise."""
    try:
        answer = load_json(body)
    except JsonError as exc:
        raise BadAnswer(f"prefill answered 200 with a body that is not JSON ({exc}): {_quote(body)}") from None
    if not isinstance(answer, dict):
        raise BadAnswer(f"prefill answered 200 with a JSON {type(answer).__name__}, not an object: {_quote(answer)}")
    problem = handover_problem(answer.get("kv_transfer_params"))
    if problem is not None:
        raise BadAnswer(problem[1], problem[0])
    return answer


def _text_ok(value: Any) -> bool:
    return value is None or isinstance(value, str)


def usable_event(obj: Any) -> bool:
    """Whether ``obj`` (one parsed SSE event, or a whole JSON answer) has the shape the proxy reads: an object
    whose ``choices``, when present, is a list of objects whose ``text`` is a string or null and whose
    ``delta`` and ``message``, when present, are objects (or null) with a string or null ``content``
    (vLLM 0.23.0 ``CompletionResponseStreamChoice``, ``ChatCompletionResponseStreamChoice`` and their
    non-streamed forms, vllm/entrypoints/openai/completion/protocol.py, chat_completion/protocol.py)."""
    if not isinstance(obj, dict):
        return False
    choices = obj.get("choices")
    if choices is None:
        return True
    if not isinstance(choices, list):
        return False
    for c in choices:
        if not isinstance(c, dict) or not _text_ok(c.get("text")):
            return False
        for key in ("delta", "message"):
            part = c.get(key)
            if part is not None and (not isinstance(part, dict) or not _text_ok(part.get("content"))):
                return False
    return True
