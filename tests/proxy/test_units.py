"""Pure parts: instance parsing, routing scores, ejection, PD request building, metric parsing."""

from __future__ import annotations

import pytest

from ascend_runtime.proxy.config import OutlierPolicy, RoutingWeights
from ascend_runtime.proxy.health import parse_vllm_load
from ascend_runtime.proxy.instances import (
    InstanceSpec,
    InstanceSpecError,
    parse_cli_instance,
    specs_from_data,
)
from ascend_runtime.proxy.pd import (
    NotContinuable,
    RecomputeTracker,
    build_prefill_request,
    estimate_prompt_tokens,
    sse_events,
)
from ascend_runtime.proxy.pool import InstancePool, NoInstanceError


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_instance_parsing():
    s = parse_cli_instance("prefill", "10.0.0.1:8000/v1/,name=p0,weight=2")
    assert (s.name, s.role, s.url, s.weight) == ("p0", "prefill", "http://10.0.0.1:8000", 2.0)
    assert parse_cli_instance("decode", "http://h:9").name == "decode-h:9"
    with pytest.raises(InstanceSpecError):
        parse_cli_instance("decode", "http://h:9,colour=red")
    with pytest.raises(InstanceSpecError):
        specs_from_data([{"name": "a", "role": "decode", "url": "h:1"}, {"name": "a", "role": "prefill", "url": "h:2"}])
    with pytest.raises(InstanceSpecError):
        specs_from_data([{"role": "middle", "url": "h:1"}])


def _pool(*specs: InstanceSpec, **kw) -> InstancePool:
    pool = InstancePool(clock=kw.pop("clock", Clock()), **kw)
    for s in specs:
        pool.add(s)
    return pool


def test_prefill_least_outstanding_tokens_and_kv_refinement():
    pool = _pool(InstanceSpec("a", "prefill", "http://a:1"), InstanceSpec("b", "prefill", "http://b:1"))
    a, b = pool.get("a"), pool.get("b")
    pool.begin(a, 1000)
    assert pool.pick("prefill").name == "b"
    pool.begin(b, 500)
    assert pool.pick("prefill").name == "b"
    b.kv_usage = 0.5  # 0.5 * 4096 = 2048 token-equivalents
    assert pool.pick("prefill").name == "a"
    pool.end(a, 1000)
    assert a.outstanding_prompt_tokens == 0 and a.inflight == 0


def test_decode_least_active_sequences_with_weights():
    pool = _pool(InstanceSpec("a", "decode", "http://a:1"), InstanceSpec("b", "decode", "http://b:1", weight=4),
                 weights=RoutingWeights(decode_kv_weight=0))
    a, b = pool.get("a"), pool.get("b")
    for _ in range(3):
        pool.begin(b)
    pool.begin(a)
    assert pool.pick("decode").name == "b"  # 3/4 < 1/1
    picks = {pool.pick("decode", exclude={"b"}).name for _ in range(3)}
    assert picks == {"a"}


def test_ties_rotate():
    pool = _pool(InstanceSpec("a", "decode", "http://a:1"), InstanceSpec("b", "decode", "http://b:1"))
    assert {pool.pick("decode").name for _ in range(4)} == {"a", "b"}


def test_ejection_backoff_readmission_and_cap():
    clock = Clock()
    events = []
    policy = OutlierPolicy(consecutive_errors=2, base_s=5, max_s=12)
    pool = _pool(InstanceSpec("a", "decode", "http://a:1"), InstanceSpec("b", "decode", "http://b:1"), clock=clock,
                 policy=policy, on_event=lambda k, s, r: events.append((k, s.name, r)))
    a, b = pool.get("a"), pool.get("b")
    pool.record_failure(a, "timeout")
    assert a.routable(clock())
    pool.record_failure(a, "timeout")
    assert not a.routable(clock()) and ("eject", "a", "consecutive_errors") in events
    assert pool.pick("decode") is b
    clock.t += 5.1  # no active checks: re-admitted once the ejection time is over
    assert a.routable(clock()) is False and pool.pick("decode", exclude=["b"]) is a
    assert ("readmit", "a", "ejection time over") in events
    pool.record_failure(a, "timeout")
    assert a.routable(clock())  # evidence was reset on ejection: one failure is not enough
    pool.record_failure(a, "timeout")
    assert a.ejected and a.ejected_until - clock() == pytest.approx(10)  # second ejection: base x 2
    clock.t += 10.1
    pool.pick("decode")
    for _ in range(2):
        pool.record_failure(a, "timeout")
    assert a.ejected_until - clock() == pytest.approx(12)  # capped at max_s
    # b is now the last one up: its outlier evidence keeps it in rotation (panic routing, counted)
    pool.record_failure(b, "500")
    pool.record_failure(b, "500")
    assert not b.ejected and b.outlier and ("eject_skipped", "b", "consecutive_errors") in events
    assert pool.pick("decode") is b and ("panic", "b", "outlier") in events
    pool.record_success(b)
    assert not b.outlier
    # a refused connection means down: not capped, and never a panic target
    pool.record_failure(b, "refused", hard=True)
    assert b.down
    with pytest.raises(NoInstanceError):
        pool.pick("decode", exclude=["a"])


def test_active_checks_confirm_slow_is_not_failed():
    clock = Clock()
    pool = _pool(InstanceSpec("a", "decode", "http://a:1"), clock=clock, active_checks=True,
                 policy=OutlierPolicy(health_failures=2, base_s=1))
    a = pool.get("a")
    for _ in range(10):
        pool.record_health(a, False, "/health timed out", slow=True)
    assert a.routable(clock()) and a.slow_checks == 10
    pool.record_failure(a, "500")  # failing real traffic too: a slow check now counts as failed
    pool.record_health(a, False, "/health timed out", slow=True)
    pool.record_health(a, False, "/health timed out", slow=True)
    assert a.down
    clock.t += 5
    with pytest.raises(NoInstanceError, match="waiting for a passing health check"):
        pool.pick("decode")
    pool.record_health(a, True)
    assert pool.pick("decode") is a


def test_remove_waits_for_inflight_and_sync():
    pool = _pool(InstanceSpec("a", "decode", "http://a:1"), InstanceSpec("b", "decode", "http://b:1"))
    a = pool.get("a")
    pool.begin(a)
    added, removed = pool.sync("static", [InstanceSpec("b", "decode", "http://b:2")])
    assert removed == ["a"] and pool.get("a") is a and not a.routable(0)
    assert pool.get("b").spec.url == "http://b:2"
    pool.end(a)
    assert pool.get("a") is None


def test_prefill_request_shape():
    req = {"prompt": "x", "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True},
           "max_completion_tokens": 9}
    out = build_prefill_request(req)
    assert out["max_tokens"] == out["min_tokens"] == out["max_completion_tokens"] == 1
    assert out["stream"] is False and "stream_options" not in out
    assert out["kv_transfer_params"]["do_remote_decode"] is True
    assert req["max_tokens"] == 9 and "kv_transfer_params" not in req  # original untouched


def test_prompt_token_estimate():
    assert estimate_prompt_tokens({"prompt": "a b  c"}) == 3
    assert estimate_prompt_tokens({"prompt": [1, 2, 3, 4]}) == 4
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "a b"},
                                                {"role": "user", "content": [{"type": "text", "text": "c"}]}]}) == 3


def test_recompute_tracker_chat():
    t = RecomputeTracker.for_request({"messages": [{"role": "user", "content": "Q"}], "max_tokens": 10})
    assert not t.add_choice({"delta": {"content": " a"}}, None)
    assert t.add_choice({"delta": {"content": " b"}, "stop_reason": "recomputed"}, None)
    nxt = t.continue_request()
    assert nxt["messages"][0]["content"] == "Q a b" and nxt["max_tokens"] == 10 - 2 + 1
    assert t.original["messages"][0]["content"] == "Q"


def test_recompute_continuation_keeps_each_chat_content_form():
    """A string content gets the text appended, content parts get one more text part, a null content and an
    empty conversation get the text: never a Python repr of the parts, never an IndexError."""
    parts = [{"type": "text", "text": "Q"}]
    cases = [
        ([{"role": "user", "content": "Q"}], [{"role": "user", "content": "Q a"}]),
        ([{"role": "user", "content": parts}], [{"role": "user", "content": [*parts, {"type": "text", "text": " a"}]}]),
        ([{"role": "assistant", "content": None}, {"role": "user", "content": "x"}],
         [{"role": "assistant", "content": " a"}, {"role": "user", "content": "x"}]),
        ([], [{"role": "user", "content": " a"}]),
    ]
    for messages, expected in cases:
        t = RecomputeTracker.for_request({"messages": messages, "max_tokens": 10})
        assert t.add_choice({"delta": {"content": " a"}, "stop_reason": "recomputed"}, None)
        assert t.continue_request()["messages"] == expected, messages
    assert parts == [{"type": "text", "text": "Q"}]  # the client's request is not modified


def test_recompute_of_a_token_id_prompt_is_refused_not_garbled():
    for prompt in ([1, 2, 3], ["a", "b"], None):
        t = RecomputeTracker.for_request({"prompt": prompt, "max_tokens": 10})
        t.add_choice({"text": " a", "stop_reason": "recomputed"}, None)
        with pytest.raises(NotContinuable, match="send the prompt as text"):
            t.continue_request()
    t = RecomputeTracker.for_request({"prompt": "p", "max_tokens": 10})
    t.add_choice({"text": " a", "stop_reason": "recomputed"}, None)
    assert t.continue_request()["prompt"] == "p a"


def test_migration_continuation_continues_the_final_message_in_each_content_form():
    """A migrated chat continues the assistant message under way: a request that already continues its final
    message gets the text appended to it (a string) or as one more text part (content parts); any other gets
    the text as a new final assistant message to continue."""
    from ascend_runtime.proxy.migrate import MigrationTracker, continuation_request

    parts = [{"type": "text", "text": "Once"}]
    cases = [
        ({"continue_final_message": True, "add_generation_prompt": False},
         [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Once"}],
         [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Once upon"}]),
        ({"continue_final_message": True, "add_generation_prompt": False},
         [{"role": "user", "content": "go"}, {"role": "assistant", "content": parts}],
         [{"role": "user", "content": "go"},
          {"role": "assistant", "content": [*parts, {"type": "text", "text": " upon"}]}]),
        ({}, [{"role": "user", "content": "go"}],
         [{"role": "user", "content": "go"}, {"role": "assistant", "content": " upon"}]),
    ]
    for extra, messages, expected in cases:
        t = MigrationTracker.for_request({"messages": messages, "stream": True, "max_tokens": 9, **extra})
        t.add_choice({"delta": {"content": " upon"}}, None)
        req = continuation_request(t)
        assert req["messages"] == expected, messages
        assert req["continue_final_message"] is True and req["add_generation_prompt"] is False
    assert parts == [{"type": "text", "text": "Once"}]


def test_parse_vllm_load_and_sse_events():
    text = ("# HELP x\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.25\nvllm:kv_cache_usage_perc{engine=\"1\"} 0.75\n"
            "vllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 2\n")
    assert parse_vllm_load(text) == (0.5, 5.0)
    assert parse_vllm_load("") == (None, None)
    assert sse_events(b'data: {"a": 1}\n\ndata: [DONE]\n\n: comment\n\n') == [{"a": 1}]


def test_a_prefill_length_refusal_names_the_clients_max_tokens() -> None:
    """vLLM 0.23.0's refusals (vllm/renderers/params.py) as the prefill copy (max_tokens 1) gets them, shown
    to the client as its own request (max_tokens 40) would have got them."""
    import json as _json

    from ascend_runtime.proxy.pd import client_max_tokens, client_view_of_prefill_refusal

    tokens = ("This model's maximum context length is 2048 tokens. However, you requested 1 output tokens and your "
              "prompt contains at least 2048 input tokens, for a total of at least 2049 tokens. Please reduce the "
              "length of the input prompt or the number of requested output tokens.")
    chars = ("This model's maximum context length is 2048 tokens. However, you requested 1 output tokens and your "
             "prompt contains 90000 characters (more than 81880 characters, which is the upper bound for 2047 input "
             "tokens). Please reduce the length of the input prompt or the number of requested output tokens.")
    echo = "1 validation error: {'input': {'prompt': 'x', 'kv_transfer_params': {'do_remote_decode': True}, 'n': 0}}"
    for message, want in ((tokens, "you requested 40 output tokens and your prompt contains at least 2048 input "
                                   "tokens, for a total of at least 2088 tokens"),
                          (chars, "more than 80320 characters, which is the upper bound for 2008 input tokens"),
                          (echo, "{'input': {'prompt': 'x', 'n': 0}}")):
        body = _json.dumps({"error": {"message": message, "type": "BadRequestError", "param": "input_tokens",
                                      "code": 400}}).encode()
        out = _json.loads(client_view_of_prefill_refusal(body, {"prompt": "x", "max_tokens": 40}))
        assert want in out["error"]["message"], out
        assert out["error"]["param"] == "input_tokens" and "requested 1 output" not in out["error"]["message"]
    assert client_max_tokens({"prompt": "x"}) == 16 and client_max_tokens({"prompt": "x", "max_tokens": 4}) == 4
    assert client_max_tokens({"messages": [], "max_tokens": 9, "max_completion_tokens": 5}) == 5
    assert client_max_tokens({"messages": []}) is None
    other = b'{"error": {"message": "temperature must be non-negative"}}'
    assert client_view_of_prefill_refusal(other, {"prompt": "x"}) is other
