"""A group move drains a decode group with stream migration and a prefill group without (actuate.py)."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from ascend_runtime.pdplanner.actuate import GroupMover
from ascend_runtime.planner.plan import FlexGroup


class FakeProxy:
    """Records the admin calls of one proxy replica; an evacuation empties the instance at once."""

    def __init__(self, busy: dict[str, int]) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.busy = dict(busy)  # instance -> active streams

    async def replicas(self) -> list[str]:
        return ["http://proxy-0"]

    async def drain(self, url: str, name: str, drain: bool = True) -> None:
        self.calls.append(("drain", name, drain))
        if drain and name.startswith("prefill"):
            self.busy[name] = 0  # prefill requests end within a prefill

    async def evacuate(self, url: str, name: str) -> int:
        self.calls.append(("evacuate", name, True))
        moved, self.busy[name] = self.busy.get(name, 0), 0
        return moved

    async def listing(self, url: str) -> dict[str, dict[str, Any]]:
        return {n: {"name": n, "inflight": b, "active_seqs": b, "outstanding_prompt_tokens": 0}
                for n, b in self.busy.items()}

    async def add(self, url: str, instances: list[dict[str, Any]]) -> None:
        self.calls.append(("add", ",".join(i["name"] for i in instances), None))

    async def remove(self, url: str, names: list[str]) -> None:
        self.calls.append(("remove", ",".join(names), None))


class FakeBackend:
    def __init__(self) -> None:
        self.log: list[tuple[str, tuple[str, ...]]] = []

    async def stop(self, names: Sequence[str]) -> None:
        self.log.append(("stop", tuple(names)))

    async def start(self, names: Sequence[str], timeout_s: float) -> None:
        self.log.append(("start", tuple(names)))


def _plan() -> Any:
    groups = [FlexGroup("flex-0", ("n0",), ("prefill-1", "prefill-2"), ("decode-1",), "decode"),
              FlexGroup("flex-1", ("n1",), ("prefill-3", "prefill-4"), ("decode-2",), "prefill")]
    role = lambda n: SimpleNamespace(role="prefill" if n.startswith("prefill") else "decode")  # noqa: E731
    return SimpleNamespace(flex_groups=groups, instance=role)


async def test_decode_group_is_drained_with_migrate_prefill_group_without():
    proxy = FakeProxy({"decode-1": 5, "prefill-3": 1, "prefill-4": 0})
    backend = FakeBackend()
    mover = GroupMover(_plan(), backend, proxy, {"flex-0": "decode", "flex-1": "prefill"},  # type: ignore[arg-type]
                       lambda n: f"http://{n}:8000", drain_timeout_s=5, poll_s=0.01)
    res = await mover.move(mover.groups["flex-0"], "prefill")
    assert res.ok and res.migrated == 5
    assert proxy.calls[0] == ("evacuate", "decode-1", True)
    assert not any(c[0] == "drain" for c in proxy.calls)  # no plain drain of a decode group
    assert backend.log == [("stop", ("decode-1",)), ("start", ("prefill-1", "prefill-2"))]
    proxy.calls.clear()
    res = await mover.move(mover.groups["flex-1"], "decode")
    assert res.ok and res.migrated == 0
    assert sorted(c for c in proxy.calls if c[0] in ("drain", "evacuate")) == [
        ("drain", "prefill-3", True), ("drain", "prefill-4", True)]
    assert mover.layout == {"flex-0": "prefill", "flex-1": "decode"}


async def test_migrate_off_waits_for_streams():
    proxy = FakeProxy({"decode-1": 2})
    mover = GroupMover(_plan(), FakeBackend(), proxy, {"flex-0": "decode", "flex-1": "prefill"},  # type: ignore[arg-type]
                       lambda n: f"http://{n}:8000", drain_timeout_s=0.05, poll_s=0.01, migrate=False)
    res = await mover.move(mover.groups["flex-0"], "prefill")
    assert not res.ok and "did not finish" in res.detail  # streams stayed: the move was abandoned, undrained
    assert proxy.calls == [("drain", "decode-1", True), ("drain", "decode-1", False)]
