"""The Pulumi program registers the engine instances of a role in a chain (the rollout's order), so an image
change replaces them one after another; each LeaderWorkerSet replaces its single group with no surge."""

from __future__ import annotations

from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system

from .pulumi_mock import mock_system


def test_each_instance_waits_for_the_previous_one_of_its_role() -> None:
    system = mock_system("cm384-prod")
    engines = system.engines
    assert list(engines) == [*(f"prefill-{k}" for k in range(8)), *(f"decode-{k}" for k in range(4))]
    for role, count in (("prefill", 8), ("decode", 4)):
        first = engines[f"{role}-0"]
        assert first.depends_on == [system.cluster]
        for k in range(1, count):
            deps = engines[f"{role}-{k}"].depends_on
            assert deps == [system.cluster, engines[f"{role}-{k - 1}"]], (role, k)
    # the chain is per role: no prefill waits for a decode or the other way round
    name_of = {id(e): n for n, e in engines.items()}
    for name, component in engines.items():
        waits_for = [name_of[id(d)] for d in component.depends_on if d is not system.cluster]
        assert all(w.split("-")[0] == name.split("-")[0] for w in waits_for), (name, waits_for)


def test_the_leaderworkersets_replace_their_one_group_without_surge() -> None:
    plan = load_plan("cm384-prod")
    lws = [o for objs in build_system(plan).engines.values() for o in objs if o["kind"] == "LeaderWorkerSet"]
    assert len(lws) == 4
    for obj in lws:
        assert obj["spec"]["replicas"] == 1
        assert obj["spec"]["rolloutStrategy"] == {"type": "RollingUpdate",
                                                  "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0}}
