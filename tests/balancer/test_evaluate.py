"""`balance evaluate`: replay of a recorded simulator dump, recommendation, plot, bad input; heat metrics."""

import asyncio
import json
import struct
import zlib

import numpy as np
import pytest

from ascend_runtime.balancer import evaluate as ev
from ascend_runtime.balancer.apply import NoopApplier
from ascend_runtime.balancer.daemon import BalancerConfig, BalancerDaemon, Instance
from ascend_runtime.balancer.sources import LoadWindow
from ascend_runtime.cli import main
from ascend_runtime.sim.experts import ExpertRouter, record_dumps


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """Eight windows of a drifting simulator router (6 layers x 64 experts, 2 DP ranks)."""
    root = tmp_path_factory.mktemp("dump")
    router = ExpertRouter(6, 64, 8, seed=3, skew=1.2, drift_sigma=0.6, drift_rate=0.05)
    record_dumps(router, root, windows=8, steps_per_window=5, tokens_per_step=512, ranks=2)
    return root


def _png_text(data: bytes) -> dict:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, at = {}, 8
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        assert struct.unpack(">I", data[at + 8 + n:at + 12 + n])[0] == zlib.crc32(kind + body)
        if kind == b"tEXt":
            k, v = body.split(b"\0", 1)
            out[k.decode()] = v.decode()
        if kind == b"IHDR":
            out["size"] = struct.unpack(">II", body[:8])
        at += 12 + n
    return out


def test_evaluate_recommends_and_plots(dump, tmp_path, capsys):
    plot = tmp_path / "replay.png"
    rc = main(["balance", "evaluate", "--load-dir", str(dump), "--ranks", "8", "--interval", "1", "--interval", "3",
               "--policy", "none", "--policy", "greedy", "--policy", "flashlb", "--policy", "ours", "--plot", str(plot)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "recommended for stage:" in out and "redundant_experts:" in out and "policy:" in out
    # the table: unbalanced initial map is worse than a balancing policy on the replay
    rows = {tuple(line.split()[:3]): line.split()[3:] for line in out.splitlines()
            if line.split()[:1] and line.split()[0] in ev.POLICIES and len(line.split()) == 6}
    assert float(rows[("greedy", "8", "1")][0]) > float(rows[("none", "8", "1")][0])
    assert float(rows[("none", "0", "1")][2]) == 0.0  # no balancing, no moves
    text = _png_text(plot.read_bytes())
    assert text["size"] == (900, 600) and "ours" in text["Description"] and "balancedness" in text["Title"]


def test_replay_charges_moves_and_rebalances_by_interval(dump):
    from ascend_runtime.cli.commands.balance import _read_history

    hist, rc = _read_history(str(dump))
    assert rc == 0 and hist.shape == (8, 6, 64)
    base = dict(role="decode", ranks=8, experts=64, layers=6, mtp=False, tokens_per_step=8192.0, c_slot=1e-5,
                c_token=1e-7, bytes_per_expert=4.4e7, link_bytes_per_s=5e10, redundant=8)
    model = ev.StageModel(**base)
    every = ev.replay(hist, model, "greedy", 8, 1)
    sparse = ev.replay(hist, model, "greedy", 8, 4)
    assert every.rebalances == 7 and sparse.rebalances == 2
    assert every.moved_slots > sparse.moved_slots > 0
    free = ev.replay(hist, ev.StageModel(**{**base, "bytes_per_expert": 0.0}), "greedy", 8, 1)
    assert free.balancedness == every.balancedness  # same plans ...
    assert all(a > b for a, b in zip(every.moe_ms, free.moe_ms))  # ... moving weights costs time
    assert ev.redundancy_options(model) == [0, 8, 16]


def test_guide_refusal_keeps_the_stage_without_eplb(dump):
    from ascend_runtime.cli.commands.balance import _read_history

    hist, _ = _read_history(str(dump))
    model = ev.StageModel("decode", 8, 64, 6, False, 8192.0, 1e-5, 1e-7, 0.0, 5e10, 0, eplb_allowed=False,
                          eplb_refusal="the guide says no")
    rec = ev.recommend(model, ev.evaluate(hist, model, ["none", "greedy"], [1]), 600)
    assert rec["eplb"] is None and rec["redundant_experts"] == 0
    assert "the guide says no" in ev.recommendation_yaml([rec])


def test_bad_input_exits_2_naming_the_problem(dump, tmp_path, capsys):
    assert main(["balance", "evaluate", "--load-dir", str(tmp_path / "nope"), "--ranks", "8"]) == 2
    assert "--load-dir" in capsys.readouterr().err
    # the a2-staging model has 58 MoE layers x 256 experts; the dump has 6 x 64
    assert main(["balance", "evaluate", "--load-dir", str(dump), "--stack", "a2-staging", "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "6 layers x 64 experts" in err and "58 MoE layers x 256" in err
    assert main(["balance", "evaluate", "--load-dir", str(dump)]) == 2
    assert "--ranks" in capsys.readouterr().err
    assert main(["balance", "evaluate", "--load-dir", str(dump), "--ranks", "7"]) == 2  # 64 + 0 on 7 ranks
    assert "ranks evenly" in capsys.readouterr().err


def test_stage_models_of_the_shipped_stacks():
    from ascend_runtime.config.loader import load_stack

    a2 = ev.stage_models(load_stack("a2-staging").config)
    assert a2["prefill"].ranks == 16 and a2["decode"].ranks == 32
    assert a2["prefill"].eplb_allowed and not a2["decode"].eplb_allowed  # 256 / 32 = 8 experts per die
    assert a2["prefill"].bytes_per_expert == pytest.approx(3 * 7168 * 2048 * 1.0, rel=0.01)  # W8A8: ~1 byte a weight
    assert a2["prefill"].link_bytes_per_s < 392e9 / 8  # 16 ranks over 2 nodes: half the peers across the slower link


class _Source:
    def __init__(self, name, load):
        self.name, self.load = name, load

    async def collect(self, session):
        return LoadWindow(self.name, self.load)


def test_heat_metrics_per_instance_and_stage():
    load_p = np.tile(np.arange(1, 33, dtype=float), (2, 1))
    load_d = np.ones((2, 32))
    load_d[:, 0] = 100.0
    insts = [Instance("prefill-0", _Source("prefill-0", load_p), NoopApplier("prefill-0")),
             Instance("decode-0", _Source("decode-0", load_d), NoopApplier("decode-0"))]
    daemon = BalancerDaemon(BalancerConfig(num_experts=32, ranks=4, slots=8, dry_run=True), insts, None)
    total = asyncio.run(daemon.collect(None))
    assert np.array_equal(total, load_p + load_d)
    reg = daemon.metrics.registry
    share = reg.get_sample_value("ascend_balancer_hot_expert_share", {"instance": "decode-0", "stage": "decode"})
    assert share == pytest.approx(100 / 131)
    assert reg.get_sample_value("ascend_balancer_routed_tokens_total", {"instance": "prefill-0", "stage": "prefill"}) == 2 * 528
    assert reg.get_sample_value("ascend_balancer_layer_hot_expert_share", {"layer": "1"}) == pytest.approx(101 / (528 + 131))  # expert 0: 1 + 100


def test_daemon_is_not_deployed_on_0_23_and_publishes_on_simulators():
    from ascend_runtime.planner import load_plan
    from ascend_runtime.render.objects.balancer import balancer_command, balancer_objects
    from ascend_runtime.render.objects.common import Context
    from ascend_runtime.render.objects.monitoring import dashboard_json

    # vLLM-Ascend 0.23.0 on real NPUs: dynamic EPLB in the engine, no heat endpoint to poll
    real = Context(load_plan("a2-staging"))
    assert balancer_objects(real) == []
    sim = Context(load_plan("kind"))
    assert balancer_objects(sim)
    assert "--configmap" in balancer_command(sim) and "--dry-run" not in balancer_command(sim)
    # the dashboard plots the daemon's metrics only where it runs (no panel that stays empty)
    exprs = lambda ctx: [t["expr"] for p in json.loads(dashboard_json(ctx, bool(balancer_objects(ctx))))["panels"]
                         for t in p.get("targets", [])]
    assert not [e for e in exprs(real) if "ascend_balancer_" in e]
    assert any("ascend_balancer_instance_imbalance" in e for e in exprs(sim))
    assert any("ascend_balancer_observed_balancedness" in e for e in exprs(sim))
    assert any("vllm:" in e for e in exprs(real))
