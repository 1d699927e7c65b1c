"""KV-cache-affinity routing of prefill: decisions on fixed routing histories and loads."""

from __future__ import annotations

import random

import pytest

from ascend_runtime.proxy.affinity import (
    AffinitySettings,
    PrefixAffinity,
    prompt_blocks,
    rendezvous,
)
from ascend_runtime.proxy.config import RoutingWeights
from ascend_runtime.proxy.instances import InstanceSpec
from ascend_runtime.proxy.pool import InstancePool

SYSTEM = " ".join(f"s{i}" for i in range(400))


def chat(conv: int, turns: int, system: bool = True) -> dict:
    """A conversation's request at turn ``turns`` (1-based): system prompt, then alternating user/assistant."""
    msgs = [{"role": "system", "content": SYSTEM}] if system else []
    for t in range(turns):
        msgs.append({"role": "user", "content": " ".join(f"c{conv}t{t}u{i}" for i in range(150))})
        if t < turns - 1:
            msgs.append({"role": "assistant", "content": " ".join(f"c{conv}t{t}a{i}" for i in range(150))})
    return {"model": "m", "messages": msgs}


def pool(n: int = 3, **weights: float) -> InstancePool:
    p = InstancePool(weights=RoutingWeights(**weights))
    for i in range(n):
        p.add(InstanceSpec(f"p{i}", "prefill", f"http://127.0.0.1:{9000 + i}"))
    return p


def warm(p: InstancePool) -> InstancePool:
    """The system prompt's blocks recorded on every instance (it is cached everywhere once traffic ran)."""
    for s in p.all("prefill"):
        p.affinity.record(s.name, p.affinity.blocks({"messages": [{"role": "system", "content": SYSTEM}]}))  # type: ignore[union-attr]
    return p


def test_blocks_are_chained_and_turns_share_the_conversation_home():
    b1, b2 = prompt_blocks(chat(1, 1), 128), prompt_blocks(chat(1, 2), 128)
    assert b2.hashes[:len(b1.hashes)] == b1.hashes and len(b2.hashes) > len(b1.hashes)
    assert b1.home_key == b2.home_key  # system + first user message: the same for every turn
    other = prompt_blocks(chat(2, 1), 128)
    assert other.home_key != b1.home_key and other.hashes[:3] == b1.hashes[:3]  # shared system prompt blocks
    short = prompt_blocks({"prompt": "a few words"}, 128)
    assert short.hashes == () and short.home_key is None and short.tokens == 3
    comp = prompt_blocks({"prompt": SYSTEM + " tail"}, 128)
    assert comp.home_key is None and comp.resume_tokens == 0 and len(comp.hashes) == 3  # history only
    # a later turn resumes the previous turn's prompt: every message before the last answer
    assert b1.resume_tokens == 0 and b2.resume_tokens == b1.tokens
    assert prompt_blocks(chat(1, 3), 128).resume_tokens == b2.tokens


def test_the_instance_holding_the_prefix_wins_against_a_smaller_load():
    p = pool(prefill_affinity_home_weight=0.0)
    req1 = chat(1, 1)
    p.affinity.record("p2", p.affinity.blocks(req1))  # type: ignore[union-attr]
    p.get("p2").outstanding_prompt_tokens = 500  # busier than p0 and p1 (0)
    req2 = chat(1, 2)
    expected = p.affinity.expected_hit_tokens("p2", p.affinity.blocks(req2))  # type: ignore[union-attr]
    assert expected == len(p.affinity.blocks(req1).hashes) * 128 > 500  # type: ignore[union-attr]
    assert p.pick("prefill", request=req2).name == "p2"
    # the same load without a request body (or with affinity off) goes to the least loaded
    assert p.pick("prefill").name in ("p0", "p1")
    off = pool(prefill_affinity_weight=0.0, prefill_affinity_home_weight=0.0)
    off.affinity.record("p2", off.affinity.blocks(req1))  # type: ignore[union-attr]
    off.get("p2").outstanding_prompt_tokens = 500
    assert off.pick("prefill", request=req2).name in ("p0", "p1")


def test_load_beyond_the_expected_saving_moves_the_request():
    p = pool(prefill_affinity_home_weight=0.0)
    req1, req2 = chat(1, 1), chat(1, 2)
    p.affinity.record("p1", p.affinity.blocks(req1))  # type: ignore[union-attr]
    saving = p.affinity.expected_hit_tokens("p1", p.affinity.blocks(req2))  # type: ignore[union-attr]
    p.get("p1").outstanding_prompt_tokens = saving + 1
    assert p.pick("prefill", request=req2, count=False).name in ("p0", "p2")
    p.get("p1").outstanding_prompt_tokens = saving - 1
    assert p.pick("prefill", request=req2, count=False).name == "p1"
    # a weight of 2 doubles the saving: the same load stays
    p2 = pool(prefill_affinity_home_weight=0.0, prefill_affinity_weight=2.0)
    p2.affinity.record("p1", p2.affinity.blocks(req1))  # type: ignore[union-attr]
    p2.get("p1").outstanding_prompt_tokens = saving + 1
    assert p2.pick("prefill", request=req2, count=False).name == "p1"


def test_the_longest_expected_prefix_wins_and_picks_are_recorded():
    p = pool(prefill_affinity_home_weight=0.0)
    a = p.affinity
    a.record("p0", a.blocks(chat(1, 1)))  # type: ignore[union-attr]
    a.record("p1", a.blocks(chat(1, 2)))  # type: ignore[union-attr]  # longer: the second turn
    chosen = p.pick("prefill", request=chat(1, 3))
    assert chosen.name == "p1"
    assert a.expected_hit_tokens("p1", a.blocks(chat(1, 4))) >= len(a.blocks(chat(1, 3)).hashes) * 128  # type: ignore[union-attr]


def test_history_is_bounded_by_the_instance_capacity():
    a = PrefixAffinity(AffinitySettings(block_tokens=128, capacity_blocks=4))
    b1 = a.blocks(chat(1, 1))
    assert len(b1.hashes) == 4
    a.record("p0", b1)
    assert a.expected_hit_tokens("p0", a.blocks(chat(1, 2))) == 4 * 128
    a.record("p0", a.blocks(chat(9, 1)))  # shares the 3 system blocks, adds one: conv 1's last block is evicted
    assert a.known_blocks("p0") == 4
    assert a.expected_hit_tokens("p0", a.blocks(chat(1, 2))) == 3 * 128


def test_rendezvous_home_agrees_across_independent_pools_and_moves_only_for_a_leaving_instance():
    names = [f"p{i}" for i in range(4)]
    keys = [prompt_blocks(chat(c, 1), 128).home_key for c in range(200)]
    homes = [rendezvous(k, names) for k in keys]  # type: ignore[arg-type]
    assert homes == [rendezvous(k, list(reversed(names))) for k in keys]  # type: ignore[arg-type]
    assert set(homes) == set(names)
    left = [rendezvous(k, names[:3]) for k in keys]  # type: ignore[arg-type]
    assert all(a == b for a, b in zip(homes, left) if a != "p3")  # only p3's keys moved
    # two replicas that never saw a conversation send its later turn to the same instance, its home
    r1, r2 = warm(pool(4)), warm(pool(4))
    for c in range(20):
        req = chat(c, 3)
        home = rendezvous(prompt_blocks(req, 128).home_key, names)  # type: ignore[arg-type]
        assert r1.pick("prefill", request=req, count=False).name == home
        assert r2.pick("prefill", request=req, count=False).name == home


def test_the_home_guess_is_the_previous_prompt_and_yields_to_known_history():
    p = pool(4)
    a = p.affinity
    names = [s.name for s in p.all("prefill")]
    req = chat(5, 3)
    b = a.blocks(req)  # type: ignore[union-attr]
    home = a.home(b, names)  # type: ignore[union-attr]
    guess = (a.blocks(chat(5, 2)).tokens // 128) * 128  # type: ignore[union-attr]
    assert a.expected(b, names) == {n: guess if n == home else 0 for n in names}  # type: ignore[union-attr]
    # home is busier by more than the guess: the turn goes elsewhere
    p.get(home).outstanding_prompt_tokens = guess + 1
    assert p.pick("prefill", request=req, count=False).name != home
    p.get(home).outstanding_prompt_tokens = guess - 1
    assert p.pick("prefill", request=req, count=False).name == home
    p.get(home).outstanding_prompt_tokens = 0
    # this router routed the previous turn elsewhere: its history wins, no home guess
    other = next(n for n in names if n != home)
    a.record(other, a.blocks(chat(5, 2)))  # type: ignore[union-attr]
    assert a.expected(b, names)[home] == 0  # type: ignore[union-attr]
    assert p.pick("prefill", request=req, count=False).name == other
    # home weight 0: history only
    q = pool(4, prefill_affinity_home_weight=0.0)
    assert set(q.affinity.expected(b, names).values()) == {0}  # type: ignore[union-attr]


def test_the_chosen_instance_is_charged_the_prompt_minus_its_expected_hit():
    p = pool(2, prefill_affinity_home_weight=0.0)
    a = p.affinity
    a.record("p1", a.blocks(chat(1, 1)))  # type: ignore[union-attr]
    req = chat(1, 2)
    tokens = 2000
    hit = a.expected_hit_tokens("p1", a.blocks(req))  # type: ignore[union-attr]
    state, charge = p.pick_prefill((), req, tokens)
    assert state.name == "p1" and hit > 0 and charge == tokens - hit and p.last_expected_hit == hit
    p.begin(state, charge)
    assert p.get("p1").outstanding_prompt_tokens == tokens - hit
    p.end(state, charge)
    assert p.get("p1").outstanding_prompt_tokens == 0
    # a prompt with no expected hit is charged in full; load-only routing always charges in full
    assert p.pick_prefill((), chat(7, 1, system=False), tokens)[1] == tokens
    off = pool(2, prefill_affinity_weight=0.0)
    off.affinity.record("p1", off.affinity.blocks(chat(1, 1)))  # type: ignore[union-attr]
    assert off.pick_prefill((), req, tokens)[1] == tokens
    # the charge never goes below one token
    assert p.pick_prefill((), req, 3)[1] == 1


def test_the_uncached_work_queued_decides_between_instances():
    # p0 holds a long conversation prefix and has a queue of cheap continuations; p1 has one uncached prompt
    p = pool(2, prefill_affinity_home_weight=0.0)
    a = p.affinity
    a.record("p0", a.blocks(chat(1, 3)))  # type: ignore[union-attr]
    req = chat(1, 4)
    tokens = a.blocks(req).tokens  # type: ignore[union-attr]
    for _ in range(3):  # three continuations routed to p0, each charged only its uncached part
        s, charge = p.pick_prefill((), req, tokens)
        assert s.name == "p0" and charge < tokens // 3
        p.begin(s, charge)
    p.begin(p.get("p1"), 1000)
    # p0's queued uncached work (3 x charge) is less than p1's 1000 tokens: an unrelated prompt goes to p0,
    # where counting whole prompts (or requests) would have sent it to p1
    queued = p.get("p0").outstanding_prompt_tokens
    assert queued < 1000
    assert p.pick("prefill", request=chat(9, 1, system=False), count=False).name == "p0"


def test_unshared_prompts_are_routed_and_charged_exactly_as_load_only_routing():
    rng = random.Random(7)
    for trial in range(40):
        n = rng.randint(2, 6)
        aff, off = pool(n), pool(n, prefill_affinity_weight=0.0)
        # affinity's history holds other traffic (shared system prompt, other conversations)
        warm(aff)
        for c in range(rng.randint(0, 5)):
            aff.affinity.record(f"p{rng.randrange(n)}", aff.affinity.blocks(chat(100 + c, 2)))  # type: ignore[union-attr]
        for i in range(n):  # the same fixed load state in both pools (ties included)
            tokens, kv, waiting = rng.choice([0, 0, 100, 500]), rng.choice([None, 0.0, 0.5]), rng.choice([None, 0.0, 2.0])
            for q in (aff, off):
                st = q.get(f"p{i}")
                st.outstanding_prompt_tokens, st.kv_usage, st.waiting = tokens, kv, waiting
        for k in range(12):
            words = rng.randint(1, 900)
            req = ({"model": "m", "messages": [{"role": "user", "content": " ".join(f"u{trial}_{k}_{j}" for j in range(words))}]}
                   if k % 2 else {"prompt": " ".join(f"x{trial}_{k}_{j}" for j in range(words))})
            a_state, a_charge = aff.pick_prefill((), req, words)
            o_state, o_charge = off.pick_prefill((), req, words)
            assert (a_state.name, a_charge) == (o_state.name, o_charge), (trial, k)
            assert aff.last_expected_hit == 0


def test_short_prompts_and_decode_picks_ignore_affinity():
    p = pool()
    seen = {p.pick("prefill", request={"prompt": "hi"}).name for _ in range(6)}
    assert seen == {"p0", "p1", "p2"}  # ties still rotate
    assert p.affinity.known_blocks("p0") == 0  # type: ignore[union-attr]


@pytest.mark.parametrize("field,value", [("prefill_affinity_block_tokens", 0.0),
                                         ("prefill_affinity_block_tokens", 1.5),
                                         ("prefill_affinity_weight", -1.0),
                                         ("prefill_affinity_capacity_blocks", float("nan"))])
def test_bad_affinity_settings_name_the_flag(field, value):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="--" + field.replace("_", "-")):
        RoutingWeights(**{field: value})
