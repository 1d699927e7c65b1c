"""Test double of the decode simulator's expert admin API (real HTTP on 127.0.0.1).

Implements the contract the balancer relies on: GET /admin/expert_load?since=SEQ,
GET/POST /admin/expert_map, GET /admin/stats. Load is skewed and fixed per
instance seed; step time grows with max/mean rank load as the simulator's does.
"""

from __future__ import annotations

import numpy as np
from aiohttp import web

from ascend_runtime.balancer.eplb_greedy import trivial_placement
from ascend_runtime.balancer.expert_map import placement_to_map, validate_map
from ascend_runtime.balancer.measure import balancedness, rank_loads


class FakeSim:
    def __init__(self, layers=4, experts=32, ranks=4, slots=9, seed=0, reject_maps=False):
        self.layers, self.experts, self.ranks, self.slots = layers, experts, ranks, slots
        rng = np.random.default_rng(seed)
        self.p = np.exp(rng.normal(0, 1.0, (layers, experts)))
        self.p /= self.p.sum(1, keepdims=True)
        self.rng = rng
        self.placement = trivial_placement(layers, experts, ranks, slots)
        self.seq = 0
        self.history = {0: np.zeros((layers, experts))}
        self.cum = np.zeros((layers, experts))
        self.step_ms: list[float] = []
        self.applied = 0
        self.reject_maps = reject_maps

    def step(self, n=5):
        for _ in range(n):
            counts = self.rng.poisson(self.p * 4096)
            self.cum = self.cum + counts
            loads = rank_loads(self.placement, counts, self.ranks)
            self.step_ms.append(10.0 + 20.0 * float((loads.max(1) / loads.mean(1)).mean()))
        self.seq += 1
        self.history[self.seq] = self.cum.copy()

    def balancedness(self):
        return balancedness(self.placement, self.p, self.ranks)

    def app(self):
        app = web.Application()

        async def expert_load(req):
            since = int(req.query.get("since", 0))
            self.step()
            base = self.history.get(since, np.zeros_like(self.cum))
            load = self.cum - base
            return web.json_response({"seq": self.seq, "layers": self.layers, "experts": self.experts,
                                      "ranks": self.ranks, "expert_load": load.tolist(),
                                      "rank_load": rank_loads(self.placement, load, self.ranks).tolist()})

        async def get_map(_):
            return web.json_response(placement_to_map(self.placement, self.ranks))

        async def post_map(req):
            doc = await req.json()
            if self.reject_maps or validate_map(doc, self.experts, self.ranks, self.slots):
                return web.json_response({"applied": False, "error": "invalid"}, status=400)
            rows = [[x for d in sorted(l["device_list"], key=lambda d: d["device_id"]) for x in d["device_expert"]]
                    for l in sorted(doc["layer_list"], key=lambda l: l["layer_id"])]
            self.placement = np.asarray(rows)
            self.applied += 1
            self.step_ms.clear()
            return web.json_response({"applied": True, "balancedness": self.balancedness()})

        async def stats(_):
            return web.json_response({"steps": len(self.step_ms), "mean_step_ms": float(np.mean(self.step_ms or [0])),
                                      "balancedness": self.balancedness()})

        app.router.add_get("/admin/expert_load", expert_load)
        app.router.add_get("/admin/expert_map", get_map)
        app.router.add_post("/admin/expert_map", post_map)
        app.router.add_get("/admin/stats", stats)
        return app
