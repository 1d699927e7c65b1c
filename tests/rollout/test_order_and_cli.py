"""Rollout order, selection and capacity rules, the Kubernetes patch and readiness rules, and the CLI's
input errors (exit 2) and dry runs (exit 0), without starting anything."""

from __future__ import annotations

import pytest

from ascend_runtime.cli import main
from ascend_runtime.planner import load_plan
from ascend_runtime.render.objects import build_system
from ascend_runtime.rollout.kube import RESTARTED_AT, group_ready, image_patch, instance_workloads, target_image
from ascend_runtime.rollout.order import RolloutInputError, Target, capacity_problems, ordered, predecessors, select

ROWS = [("decode-1", "decode", 1, "http://d1"), ("prefill-1", "prefill", 1, "http://p1"),
        ("decode-0", "decode", 0, "http://d0"), ("prefill-0", "prefill", 0, "http://p0")]


def test_order_is_prefill_then_decode_by_ordinal_and_pulumi_chains_each_role() -> None:
    assert [t.name for t in ordered(ROWS)] == ["prefill-0", "prefill-1", "decode-0", "decode-1"]
    assert predecessors((n, r, o) for n, r, o, _ in ROWS) == {
        "prefill-0": None, "prefill-1": "prefill-0", "decode-0": None, "decode-1": "decode-0"}


def test_select_and_its_errors() -> None:
    targets = ordered(ROWS)
    assert [t.name for t in select(targets, start="prefill-1")] == ["prefill-1", "decode-0", "decode-1"]
    assert [t.name for t in select(targets, only=["decode-1", "prefill-0"])] == ["prefill-0", "decode-1"]
    assert [t.name for t in select(targets, only=["prefill-0", "decode-0"], start="prefill-1")] == ["decode-0"]
    with pytest.raises(RolloutInputError, match="--instance: unknown instance.*decode-9.*instances: prefill-0"):
        select(targets, only=["decode-9"])
    with pytest.raises(RolloutInputError, match="--from: unknown instance x"):
        select(targets, start="x")
    with pytest.raises(RolloutInputError, match="no instance left"):
        select(targets, only=["prefill-0"], start="decode-0")


def test_a_role_with_one_instance_cannot_be_rolled_without_downtime() -> None:
    one_prefill = [Target("prefill-0", "prefill", "u"), Target("decode-0", "decode", "u"), Target("decode-1", "decode", "u")]
    assert capacity_problems(one_prefill, one_prefill[1:]) == []
    (problem,) = capacity_problems(one_prefill, one_prefill)
    assert problem.startswith("role prefill has 1 instance(s)") and "--allow-downtime" in problem


def test_image_patch_touches_the_engine_container_of_every_template_only() -> None:
    plan = load_plan("cm384-prod")
    engines = build_system(plan).engines
    lws = next(o for o in engines["decode-0"] if o["kind"] == "LeaderWorkerSet")
    lws = {**lws, "metadata": {**lws["metadata"], "resourceVersion": "7"}}
    ops = image_patch(lws, "LeaderWorkerSet", "img:new", "2025-01-01T00:00:00Z")
    assert ops[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}
    paths = [op["path"] for op in ops[1:]]
    assert paths == ["/spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0/image",
                     "/spec/leaderWorkerTemplate/leaderTemplate/metadata/annotations/ascend-deepseek~1restartedAt",
                     "/spec/leaderWorkerTemplate/workerTemplate/spec/containers/0/image",
                     "/spec/leaderWorkerTemplate/workerTemplate/metadata/annotations/ascend-deepseek~1restartedAt"]
    assert RESTARTED_AT == "ascend-deepseek/restartedAt"
    assert instance_workloads(engines)["prefill-3"][0].name == "prefill-3-rank0"
    assert str(instance_workloads(engines)["decode-2"][0]) == "LeaderWorkerSet deepseek/decode-2"
    assert target_image(plan) == plan.engine_image
    # kind: simulator.image, by default the runtime image the stack builds (its tag; pulumi up pins the digest)
    assert target_image(load_plan("kind")) == "localhost:5001/ascend-deploy-runtime:dev"


@pytest.mark.parametrize(("kind", "status", "generation", "ready"), [
    ("LeaderWorkerSet", {"observedGeneration": 2, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}, 2, True),
    ("LeaderWorkerSet", {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1}, 2, False),
    ("LeaderWorkerSet", {"observedGeneration": 2, "replicas": 1, "readyReplicas": 0, "updatedReplicas": 1}, 2, False),
    ("LeaderWorkerSet", {"observedGeneration": 2, "replicas": 1, "readyReplicas": 1, "updatedReplicas": 1,
                         "conditions": [{"type": "UpdateInProgress", "status": "True"}]}, 2, False),
    ("Deployment", {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}, 3, True),
    ("Deployment", {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}, 3, False),
    ("Deployment", {"observedGeneration": 3, "replicas": 1, "updatedReplicas": 0, "availableReplicas": 1}, 3, False),
])
def test_group_ready(kind: str, status: dict, generation: int, ready: bool) -> None:
    obj = {"metadata": {"generation": generation}, "spec": {"replicas": 1}, "status": status}
    assert group_ready(obj, kind)[0] is ready


@pytest.mark.parametrize(("args", "message"), [
    (["--stack", "a2-staging", "--dry-run"], "role prefill has 1 instance(s)"),
    (["--stack", "cm384-prod", "--dry-run", "--instance", "decode-9"], "--instance: unknown instance(s) decode-9"),
    (["--stack", "cm384-prod", "--dry-run", "--from", "nope"], "--from: unknown instance nope"),
    (["--stack", "cm384-prod", "--dry-run", "--drain-timeout-s", "0"], "--drain-timeout-s: must be > 0"),
    (["--stack", "nosuch", "--dry-run"], "nosuch"),
    (["--stack", "local", "--engine-image", "x:1"], "--engine-image: stack local targets 'local'"),
    (["--stack", "local", "--state-dir", "/nonexistent/state"], "local stack local is not running"),
    (["--stack", "cm384-prod", "--instance", "decode-0"], "--token-env: variable ASCEND_PROXY_TOKEN is not set"),
])
def test_bad_input_exits_2_naming_the_option(args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ASCEND_PROXY_TOKEN", raising=False)
    assert main(["rollout", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_dry_run_prints_the_order_and_changes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rollout", "--stack", "cm384-prod", "--dry-run", "--engine-image", "img:2", "--from", "prefill-6"]) == 0
    out = capsys.readouterr().out
    steps = [line.split(" (")[0] for line in out.splitlines() if line.startswith("[")]
    assert steps == ["[1/6] prefill-6", "[2/6] prefill-7", "[3/6] decode-0", "[4/6] decode-1", "[5/6] decode-2",
                     "[6/6] decode-3"]
    assert "patch Deployment deepseek/prefill-6-rank0 (container engine) to image img:2" in out
    assert "patch LeaderWorkerSet deepseek/decode-3 (container engine) to image img:2" in out
    assert out.rstrip().endswith("dry run: nothing changed")


def _state(tmp_path, stacks_dir: str | None, urls: dict[str, str]):  # type: ignore[no-untyped-def]
    """A state directory as `up` leaves it (state.json, instances.json, token file), nothing running."""
    import json

    from ascend_runtime.local.state import ProcessRecord, StackState

    where = ["--stacks-dir", stacks_dir] if stacks_dir else []
    records = [ProcessRecord(n, "simulator", 999999, ["python", "-m", "ascend_runtime", "sim", "--stack", "local",
                                                     *where, "--instance", n], u + "/health", "log")
               for n, u in urls.items()]
    state = StackState("local", "http://127.0.0.1:19000", records)
    state.save(tmp_path)
    (tmp_path / "instances.json").write_text(json.dumps({"instances": [
        {"name": n, "role": n.split("-")[0], "url": u} for n, u in urls.items()]}))
    (tmp_path / "proxy-admin-token").write_text("t")
    return state


def test_local_rollout_refuses_another_stacks_dir_and_a_moved_instance(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from ascend_runtime.rollout.local import local_targets

    plan = load_plan("local")
    urls = {i.name: i.api_url for i in plan.instances}
    _state(tmp_path, "/somewhere/else", urls)
    assert main(["rollout", "--stack", "local", "--state-dir", str(tmp_path)]) == 2
    assert "--stacks-dir: stack local runs from /somewhere/else" in capsys.readouterr().err
    state = _state(tmp_path, None, {**urls, "decode-1": "http://127.0.1.9:18099"})
    with pytest.raises(RolloutInputError, match=r"moved instances the proxy routes to \(decode-1 http://127.0.1.9:18099 -> "):
        local_targets(plan, state, tmp_path)
    state = _state(tmp_path, None, {**urls, "decode-7": "http://127.0.1.9:18099"})
    with pytest.raises(RolloutInputError, match="the running instance decode-7 is not in the stack's Plan"):
        local_targets(plan, state, tmp_path)
    state = _state(tmp_path, None, urls)
    assert [t.name for t in local_targets(plan, state, tmp_path)] == ["prefill-0", "decode-0", "decode-1"]
    # the committed local stack has one prefill instance: refused without --allow-downtime
    assert main(["rollout", "--stack", "local", "--state-dir", str(tmp_path)]) == 2
    assert "role prefill has 1 instance(s)" in capsys.readouterr().err
    assert main(["rollout", "--stack", "local", "--state-dir", str(tmp_path), "--allow-downtime", "--dry-run"]) == 0
    assert "restart simulator prefill-0 (pid 999999)" in capsys.readouterr().out
